"""A clean screen for the run a user watches: library chatter goes to the run's log file only.

What reaches the screen: our rich output (phase rules, one progress bar per phase, held-out
evaluations, curriculum decisions, the final tables) and log records of level WARNING and above
from our own code. What goes only to the log file (Hydra's ``<run dir>/<job>.log``, else
``<out>/train.log``): every Python warning (transformers' FutureWarnings at every trainer), the
records of transformers, datasets, TRL, accelerate and torch, and INFO records of our own modules.
The tqdm bars that transformers and datasets draw ("Writing model shards" at every checkpoint,
"Tokenizing train dataset") are switched off.

Tables (:func:`print_table`) are drawn by rich where they fit the terminal; without a terminal (output
to a file or a pipe, where rich assumes 80 columns and wraps every cell), or where they would not fit,
they are printed as plain aligned lines that are never cut. :func:`announcing_run_dir` prints the run's
output directory when a run starts and where its results are when it ends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

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


def fits(console: Any, renderable: Any) -> bool:
    """Whether rich would draw ``renderable`` on ``console`` at its natural width (nothing wrapped or cut):
    only on a terminal, where the width is the terminal's and not rich's 80-column guess."""
    from rich.measure import Measurement

    if not console.is_terminal or console.is_dumb_terminal:
        return False
    natural = Measurement.get(console, console.options.update_width(10**6), renderable).maximum
    return natural <= console.width


def print_table(console: Any, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                left: Sequence[str] = ()) -> None:
    """A table of ``rows`` under ``columns``: rich's where it fits the terminal, else plain aligned lines
    (the title, a header, one line per row; columns in ``left`` left-aligned, the others right-aligned)."""
    from rich.table import Table

    cells = [[str(c) for c in row] for row in rows]
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right")
    for row in cells:
        table.add_row(*row)
    if fits(console, table):
        console.print(table)
        return
    widths = [max([len(col)] + [len(row[i]) for row in cells]) for i, col in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) if col in left else v.rjust(w)
                         for v, w, col in zip(values, widths, columns)).rstrip()

    for text in (f"{title}:", line(list(columns)), *(line(row) for row in cells)):
        console.print(text, soft_wrap=True, markup=False, highlight=False, emoji=False)


RESULT_FILES = ("result.json", "summary.png", "metrics.jsonl", "verdicts.jsonl", "train_state.json", "models")


@contextlib.contextmanager
def announcing_run_dir(out_dir: str | Path, print_line: Any = print) -> Iterator[Path]:
    """Print where the run writes before it starts, and where its results are when it ends (also when it fails)."""
    out = Path(out_dir).resolve()
    print_line(f"run directory: {out}")
    ok = False
    try:
        yield out
        ok = True
    finally:
        kept = [name for name in RESULT_FILES if (out / name).exists()]
        what = f" ({', '.join(kept)})" if kept else ""
        print_line(f"results in {out}{what}" if ok else f"run stopped; what it wrote is in {out}{what}")


def run_console(**kwargs: Any) -> Any:
    """The console a run prints to: without a terminal it soft-wraps (a long line stays one line, where
    rich would otherwise break it at its 80-column guess)."""
    from rich.console import Console

    console = Console(**kwargs)
    if not console.is_terminal:
        console.soft_wrap = True
    return console
