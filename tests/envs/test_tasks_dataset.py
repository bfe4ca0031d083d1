"""Tasks as a Hugging Face dataset: KernelBench folders and proposer output, with the columns TRL, verl and
verifiers read, written as parquet (verl), JSONL or a datasets folder, and read back into the same tasks."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from core.task import Task
from kernelzero.envs.tasks import DATA_SOURCE, export, load_tasks, main, propose, task_from, to_dataset

KERNELBENCH = Path(__file__).resolve().parents[1] / "fixtures" / "kernelbench"


def test_a_kernelbench_folder_becomes_rows_every_framework_reads():
    tasks = load_tasks(KERNELBENCH)
    assert tasks[0].name == "19_ReLU" and tasks[0].level == "level1"  # (the folder also holds a solution file)
    ds = to_dataset(tasks[:1])
    row = ds[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and "torch.relu" in row["prompt"][1]["content"]
    assert task_from(row["answer"]) == tasks[0] and task_from(row["reward_model"]["ground_truth"]) == tasks[0]
    assert row["data_source"] == DATA_SOURCE and row["task_id"] == tasks[0].id == row["info"]["task_id"]
    assert row["extra_info"] == {"task_id": tasks[0].id, "name": "19_ReLU", "index": 0}


def test_proposer_tasks_round_trip_through_parquet_jsonl_and_a_datasets_folder(tmp_path):
    tasks = propose(3, seed=7)
    assert len(tasks) == 3 and all(t.program for t in tasks)  # proposer tasks keep their IR and metadata
    back = datasets.Dataset.from_parquet(str(export(tasks, tmp_path / "train.parquet")))
    assert [task_from(r["answer"]) for r in back] == tasks
    lines = (export(tasks, tmp_path / "train.jsonl")).read_text().splitlines()
    assert [task_from(json.loads(line)) for line in lines] == tasks
    folder = datasets.load_from_disk(str(export(tasks, tmp_path / "train")))
    assert [task_from(r) for r in folder] == tasks


def test_the_export_command(tmp_path, capsys):
    assert main(["--from", str(KERNELBENCH), "--out", str(tmp_path / "kb.parquet")]) == 0
    assert "task(s) ->" in capsys.readouterr().out
    assert len(datasets.Dataset.from_parquet(str(tmp_path / "kb.parquet"))) >= 1


def test_an_edited_task_is_refused_not_judged_as_another():
    data = json.loads(Task("x = 1\n").to_json())
    data["source"] = "x = 2\n"
    with pytest.raises(ValueError, match="does not match its source"):
        task_from(json.dumps(data))
