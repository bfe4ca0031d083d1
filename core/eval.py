"""``python -m core.eval``: correctness and fast_p of a coder, or of ready solutions, on a suite.

    python -m core.eval suite=path/to/KernelBench coder=expert            # a KernelBench-layout dir
    python -m core.eval suite=tasks.jsonl coder=llm coder.model=ckpt/     # a trained model
    python -m core.eval suite=DIR solutions=DIR/solutions                 # ready <level>/<name>.py files
    python -m core.eval suite=DIR executor=ray device=cuda                # verification on Ray actors

Per level and overall: compiled, correct, fast_p at p = 0, 1, 1.2, 1.5, 2 against eager and against
torch.compile, geometric-mean speedup, hack-flag counts; a rich table, and results.json,
results.csv, summary.csv and fast_p.png in the run's output directory. Verdicts are cached by
(task, candidate, hardware, software) so a rerun verifies only what changed; with
``heldout.record=true`` every evaluated task is recorded as held out so later training excludes it
(:mod:`core.evaluation.suites`; off by default, so an evaluation never changes a later run). The work is
:func:`core.evaluation.runner.evaluate`.

When every task is declined (the coder answered none), a warning with the commonest reasons is
printed; with ``fail_if_all_declined=true`` the exit status is then 3. A run that cannot start (a
missing extra such as CuPy or Ray, no GPU, a bad suite path) prints one ``error:`` line and exits 2.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from core.cli import cannot_start
from core.config import conf_dir, store_plugin_configs
from core.evaluation.runner import evaluate
from core.evaluation.suites import SuiteError

CONF_DIR = conf_dir()
EXIT_ALL_DECLINED = 3  # with fail_if_all_declined=true: no task was attempted (2: the run could not start)


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="eval")
def _main(cfg: DictConfig) -> float | None:
    # what cannot run here (a missing extra, no GPU, a bad suite path): one line, no traceback
    with cannot_start(SuiteError):
        payload = evaluate(cfg)
    if payload["all_declined"] and cfg.get("fail_if_all_declined", False):
        print(f"error: all {payload['declined']} task(s) were declined (fail_if_all_declined=true)", file=sys.stderr)
        sys.exit(EXIT_ALL_DECLINED)
    overall = payload["summary"][-1]
    return overall["fast_p"]["eager"]["0"]


def main() -> None:
    store_plugin_configs()
    _main()


if __name__ == "__main__":
    main()
