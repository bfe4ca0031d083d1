"""A clean screen for the run a user watches: library chatter goes to the run's log file only.

What reaches the screen: our rich output (phase rules, one progress bar per phase, held-out
evaluations, curriculum decisions, the final tables) and log records of level WARNING and above
from our own code. What goes only to the log file (Hydra's ``<run dir>/<job>.log``, else
``<out>/train.log``): every Python warning (transformers' FutureWarnings at every trainer), the
records of transformers, datasets, TRL, accelerate and torch, and INFO records of our own modules.
The tqdm bars that transformers and datasets draw ("Writing model shards" at every checkpoint,
"Tokenizing train dataset") are switched off.
"""

from __future__ import annotations

import logging
from pathlib import Path

LIBRARY_LOGGERS = ("py.warnings", "transformers", "datasets", "trl", "accelerate", "torch", "huggingface_hub")


def run_log_handlers(out_dir: Path) -> list[logging.Handler]:
    """The root logger's file handlers (Hydra's job log); a new ``<out_dir>/train.log`` without any."""
    root = logging.getLogger()
    files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    if not files:
        out_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(out_dir / "train.log")
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        root.addHandler(handler)
        root.setLevel(min(root.level or logging.INFO, logging.INFO))
        files = [handler]
    return files


def quiet_console(out_dir: str | Path) -> Path:
    """Send warnings and library logs to the run's log file only; return that file's path."""
    files = run_log_handlers(Path(out_dir))
    try:
        import transformers.utils.logging as hf_logging

        hf_logging.disable_default_handler()  # its own stderr handler; the file handler below replaces it
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        pass
    root = logging.getLogger()
    for handler in root.handlers:
        if not isinstance(handler, logging.FileHandler) and isinstance(handler, logging.StreamHandler):
            handler.setLevel(max(handler.level, logging.WARNING))
    logging.captureWarnings(True)
    for name in LIBRARY_LOGGERS:
        lib = logging.getLogger(name)
        lib.propagate = False
        lib.handlers = list(files)
        if name != "py.warnings":
            lib.setLevel(logging.WARNING)  # their INFO chatter is not worth a log line per checkpoint
    return Path(files[0].baseFilename)
