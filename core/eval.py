"""``python -m core.eval``: correctness and fast_p of a coder, or of ready solutions, on a suite.

    python -m core.eval suite=path/to/KernelBench coder=expert            # a KernelBench-layout dir
    python -m core.eval suite=tasks.jsonl coder=llm coder.model=ckpt/     # a trained model
    python -m core.eval suite=DIR solutions=DIR/solutions                 # ready <level>/<name>.py files
    python -m core.eval suite=DIR executor=ray device=cuda                # verification on Ray actors

Per level and overall: compiled, correct, fast_p at p = 0, 1, 1.2, 1.5, 2 against eager and against
torch.compile, geometric-mean speedup, hack-flag counts; a rich table, and results.json,
results.csv, summary.csv and fast_p.png in the run's output directory. Verdicts are cached by
(task, candidate, hardware, software) so a rerun verifies only what changed, and every evaluated
task is recorded as held out so training can exclude it (:mod:`core.evaluation.suites`). The work is
:func:`core.evaluation.runner.evaluate`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from core.config import store_plugin_configs
from core.evaluation.runner import evaluate
from core.evaluation.suites import SuiteError
from core.plugins import PluginError

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="eval")
def _main(cfg: DictConfig) -> float | None:
    try:
        payload = evaluate(cfg)
    except (PluginError, SuiteError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    overall = payload["summary"][-1]
    return overall["fast_p"]["eager"]["0"]


def main() -> None:
    store_plugin_configs()
    _main()


if __name__ == "__main__":
    main()
