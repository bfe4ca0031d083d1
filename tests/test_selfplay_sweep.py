"""benchmarks/selfplay_sweep.py: variants parse, runs that fail or overrun are listed and never averaged."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks.selfplay_sweep import finished, markdown, parse_variant, run_one, start_warm, summarise


def test_a_variant_is_a_name_and_shell_split_overrides():
    assert parse_variant("a=x=1 'y=2 3'") == ("a", ["x=1", "y=2 3"])
    assert parse_variant("base=") == ("base", [])
    with pytest.raises(argparse.ArgumentTypeError):
        parse_variant("no-equals-sign")


def test_an_overrunning_run_is_reported_not_averaged(tmp_path):
    record = run_one("slow", ["trainer.phases.distill.steps=1"], 0, tmp_path, limit_s=0.2)
    assert record["status"] == "over 0 s" and not finished(tmp_path / "slow-seed0")
    rows = summarise({"slow": []}, [record])
    assert rows[0]["seeds"] == [] and rows[0]["failed"] == {0: "over 0 s"} and "stages" not in rows[0]
    assert "(seed 0: over 0 s)" in markdown(rows)


def test_finished_runs_are_summarised_with_their_gain(tmp_path):
    # two finished runs' train_state.json in the shape core.loop.training writes (outcomes per held-out task)
    records = []
    for seed, (sft, rl) in enumerate([([1, 0, 0, 1], [1, 1, 0, 1]), ([0, 0, 1, 1], [0, 1, 1, 1])]):
        run_dir = tmp_path / f"v-seed{seed}"
        run_dir.mkdir()
        state = {"eval_before": {"outcomes": [0, 0, 0, 0]}, "eval_phases": {"distill": {"outcomes": sft}},
                 "eval_after": {"outcomes": rl}}
        (run_dir / "train_state.json").write_text(json.dumps(state))
        (run_dir / "result.json").write_text("{}")
        records.append({"variant": "v", "seed": seed, "dir": str(run_dir), "status": "ok", "seconds": 1.0})
    assert run_one("v", [], 0, tmp_path, 1.0)["status"] == "done earlier"  # not rerun
    row = summarise({"v": []}, records)[0]
    assert row["stages"]["sft"] == [0.5, 0.5] and row["stages"]["rl"] == [0.75, 0.75]
    assert row["gains"]["rl-sft"]["ci"]["estimate"] == pytest.approx(0.25)
    assert "+25.0" in markdown([row])


def _warm_starts(root, seeds):
    for seed in seeds:
        (root / f"seed{seed}" / "models" / "distill").mkdir(parents=True)
        (root / f"seed{seed}" / "distill_pairs.jsonl").write_text(json.dumps({"prompt": "p", "completion": str(seed)}))
    return root


def test_a_warm_start_run_caches_the_seeds_pairs_for_replay_and_control(tmp_path):
    warm = _warm_starts(tmp_path / "warm", [0, 3])
    overrides = start_warm(tmp_path / "v-seed3", warm, 3, ["more_sft"])
    assert overrides == [f"coder.model={(warm / 'seed3' / 'models' / 'distill').resolve()}",
                         "trainer.phases.distill.steps=0"]
    for phase in ("distill", "more_sft"):  # GRPO replays distill's pairs; the control trains on them
        assert json.loads((tmp_path / "v-seed3" / f"{phase}_pairs.jsonl").read_text())["completion"] == "3"
    with pytest.raises(FileNotFoundError, match="seed1"):
        start_warm(tmp_path / "v-seed1", warm, 1, ["more_sft"])


def test_a_warm_start_runs_sft_stage_is_its_first_evaluation(tmp_path):
    run_dir = tmp_path / "v-seed0"
    run_dir.mkdir()
    state = {"eval_before": {"outcomes": [1, 0, 1, 0]}, "eval_after": {"outcomes": [1, 1, 1, 0]},
             "eval_controls": {"more_sft": {"outcomes": [1, 0, 0, 0]}}}
    (run_dir / "train_state.json").write_text(json.dumps(state))
    record = {"variant": "v", "seed": 0, "dir": str(run_dir), "status": "ok", "seconds": 1.0}
    assert "sft" not in summarise({"v": []}, [record])[0]["stages"]  # a whole run without its SFT evaluation
    row = summarise({"v": []}, [record], warm_start=True)[0]
    assert row["stages"]["sft"] == [0.5] and row["gains"]["rl-sft"]["per_seed"] == [0.25]
    assert row["gains"]["control-sft"]["per_seed"] == [-0.25]


def test_a_warm_start_that_kept_its_run_state_gives_the_controls_its_sft_pace(tmp_path):
    warm = _warm_starts(tmp_path / "warm", [2])
    (warm / "seed2" / "train_state.json").write_text(json.dumps({"seconds_per_step": {"distill": 0.125}}))
    overrides = start_warm(tmp_path / "v-seed2", warm, 2, ["more_sft", "other"])
    assert overrides[2:] == ["++trainer.phases.more_sft.pace_s=0.125", "++trainer.phases.other.pace_s=0.125"]
