"""A run that cannot start (a missing optional dependency, a configuration mistake) prints one ``error:`` line
naming what to install or change and exits 2, from every ``python -m core.*`` command, without a traceback.
In-process: each command's ``main`` with its arguments in ``sys.argv``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

from core.cli import missing_dependency

REDTEAM = Path(__file__).resolve().parent / "redteam"


def missing(name: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(f"No module named {name!r}", name=name)


@pytest.mark.parametrize("module, install", [
    ("cupy", "pip install 'kernelzero[cuda]'"),
    ("cupy_backends.cuda", "pip install 'kernelzero[cuda]'"),
    ("ray", "pip install 'kernelzero[ray]'"),
    ("trl", "pip install kernelzero"),
    ("z3", "kernelzero needs z3-solver"),
])
def test_a_missing_package_names_what_to_install(module, install):
    assert install in missing_dependency(missing(module))


def test_other_import_errors_keep_their_traceback():
    assert missing_dependency(missing("core.no_such_module")) is None
    assert missing_dependency(missing("left_pad")) is None
    assert missing_dependency(ImportError("cannot import name 'x' from 'trl'", name="trl")) is None


def hydra_main(module, monkeypatch, *argv: str) -> int:
    """Run ``module.main()`` as ``python -m`` would with ``argv``; its exit status."""
    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", [module.__name__, *argv])
    try:
        module.main()
    except SystemExit as exc:
        return exc.code
    finally:
        GlobalHydra.instance().clear()
    return 0


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


def test_core_run_without_ray_says_to_install_the_ray_extra(monkeypatch, capsys, tmp_path):
    # It ended in a traceback through Hydra (ExecutorError was not caught), exit 1.
    import core.run

    monkeypatch.setitem(sys.modules, "ray", None)
    code = hydra_main(core.run, monkeypatch, "experiment=selfplay", "executor=ray", "device=cpu", "rounds=1",
                      "tasks_per_round=1", f"hydra.run.dir={tmp_path}")
    assert code == 2 and "pip install 'kernelzero[ray]'" in one_error_line(capsys)


def test_core_run_without_cupy_says_to_install_the_cuda_extra(monkeypatch, capsys, tmp_path):
    import core.run

    monkeypatch.setitem(sys.modules, "cupy", None)
    code = hydra_main(core.run, monkeypatch, "experiment=selfplay", "backend=cuda", "device=cpu", "rounds=1",
                      "tasks_per_round=1", f"hydra.run.dir={tmp_path}")
    assert code == 2 and "pip install 'kernelzero[cuda]'" in one_error_line(capsys)


def test_core_run_without_trl_names_the_missing_dependency(monkeypatch, capsys, tmp_path):
    # The GRPO and SFT phases import trl when they start; it surfaced as a 9-frame traceback.
    import core.run

    def training_needs_trl(cfg):
        raise missing("trl")

    monkeypatch.setattr(core.run, "run", training_needs_trl)
    code = hydra_main(core.run, monkeypatch, f"hydra.run.dir={tmp_path}")
    assert code == 2 and "'trl' is not installed" in one_error_line(capsys)


def test_core_distill_without_ray_says_to_install_the_ray_extra(monkeypatch, capsys, tmp_path):
    import core.distill

    monkeypatch.setitem(sys.modules, "ray", None)
    code = hydra_main(core.distill, monkeypatch, "n=1", "executor=ray", "device=cpu", "progress=false",
                      f"out={tmp_path}/pairs.jsonl", f"hydra.run.dir={tmp_path}")
    assert code == 2 and "pip install 'kernelzero[ray]'" in one_error_line(capsys)


def test_core_eval_reports_a_missing_package_in_one_line(monkeypatch, capsys, tmp_path):
    import core.eval

    def evaluate_needs_cupy(cfg):
        raise missing("cupy")

    monkeypatch.setattr(core.eval, "evaluate", evaluate_needs_cupy)
    code = hydra_main(core.eval, monkeypatch, f"suite={tmp_path}", f"hydra.run.dir={tmp_path}")
    assert code == 2 and "pip install 'kernelzero[cuda]'" in one_error_line(capsys)


def test_core_propose_reports_a_missing_package_in_one_line(monkeypatch, capsys, tmp_path):
    import core.propose

    def build_needs_z3(*args, **kwargs):
        raise missing("z3")

    monkeypatch.setattr(core.propose, "build", build_needs_z3)
    code = hydra_main(core.propose, monkeypatch, f"out={tmp_path}/tasks.jsonl", f"hydra.run.dir={tmp_path}")
    assert code == 2 and "z3-solver" in one_error_line(capsys)


def test_core_verify_reports_a_missing_package_in_one_line(monkeypatch, capsys):
    import core.verify

    def verifier_needs_cupy(**kwargs):
        raise missing("cupy")

    monkeypatch.setattr(core.verify, "Verifier", verifier_needs_cupy)
    code = core.verify.main(["--reference", str(REDTEAM / "tasks" / "vector_add.py"), "--candidate",
                             str(REDTEAM / "candidates" / "honest_vector_add.py"), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "pip install 'kernelzero[cuda]'" in err
