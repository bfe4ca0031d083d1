"""``python -m core.distill``: a verified distillation dataset from a teacher coder.

    python -m core.distill n=500 seed=0 out=pairs.jsonl                 # expert teacher, Triton
    python -m core.distill coder=inductor device=cuda n=200 out=ind.jsonl
    python -m core.distill proposer=mcts curriculum.max_tier=1 accepted_only=true out=easy.jsonl

Propose -> teacher -> verify every answer -> one JSONL line per attempted task:
``{"task_id", "prompt", "completion", "accepted", "verdict", "ops", "families", "adversarial",
"teacher", "backend", "candidate_id"}``. ``prompt``/``completion`` are in the student coder's format
(``student``, the LLM coder by default: the completion closes the prompt's open code fence), ready
for TRL's ``SFTTrainer`` (prompt-completion datasets). Declined tasks are counted in the summary and
not written. A ``datasets.Dataset`` of the same rows (verdict as JSON text) is saved at
``<out>.dataset/``. Verification is sized like ``core.run`` and ``core.eval``: by the ``executor``
group. The work lives in :mod:`core.loop.distillation`.
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig, OmegaConf

from core.cli import cannot_start
from core.config import build, conf_dir, store_plugin_configs
from core.contracts import CurriculumState
from core.loop.distillation import (
    PromptFormat,
    Summary,
    builtin_format,
    distill,
    load_format,
    print_summary,
    task_families,
    write_rows,
)
from core.plugins import PluginError

CONF_DIR = conf_dir()

__all__ = ["PromptFormat", "Summary", "builtin_format", "distill", "load_format", "main", "print_summary",
           "task_families", "write_rows"]


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="distill")
def _main(cfg: DictConfig) -> None:
    from core.evaluation.suites import HeldOut
    from core.propose import propose_tasks
    from core.verification.executor import executor_for_run

    with cannot_start():  # a configuration mistake or a missing package: one error line, exit 2
        # Distillation pairs are training data: evaluation tasks (core.eval's registry) are excluded.
        proposer = HeldOut.load().guard(build("proposer", cfg.proposer, seed=cfg.seed))
        teacher = build("coder", cfg.coder)
        backend_name = str(cfg.backend.name)
        try:
            backend_obj = build("backend", cfg.backend)
        except PluginError:
            raise
        except Exception:  # a backend that cannot be built here still has a name and a fallback guide
            backend_obj = None
        fmt = load_format(cfg.student)
        curriculum = CurriculumState(**OmegaConf.to_container(cfg.curriculum, resolve=True))
        tasks = propose_tasks(proposer, int(cfg.n), curriculum, progress=bool(cfg.progress))
        with executor_for_run(cfg) as verifier:
            rows, summary = distill(tasks, teacher, verifier, backend_name, backend_obj, fmt,
                                    accepted_only=bool(cfg.accepted_only), progress=bool(cfg.progress))
    out, dataset_path = write_rows(rows, cfg.out, dataset=bool(cfg.dataset))
    summary_path = out.with_name(out.name + ".summary.json")
    summary_path.write_text(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
    print_summary(summary, out, dataset_path)


def main() -> None:
    store_plugin_configs()
    _main()


if __name__ == "__main__":
    main()
