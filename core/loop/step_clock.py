"""Where a GRPO step's wall time goes, and the run's peak memory.

Each optimisation step is split into parts that add up to its wall time (``time/step_s``, measured from the
previous step's end, so the steps of a phase add up to the phase):

``time/generate_s``  sampling the completions (TRL's ``_generate``; a multi-turn episode's verification excluded)
``time/wait_s``      the trainer blocked on verdicts (the whole verification when it runs inside TRL's reward call;
                     only what generation did not hide when it overlaps, :mod:`core.loop.overlap`)
``time/optimize_s``  forward, backward and the optimiser's update (from the step's batch being ready to its end)
``time/other_s``     the rest: the old policy's log-probabilities, advantages, decoding, data, logging, checkpoints

``time/verify_s`` is the verifier's own wall time on the step's completions (its pools' ``verify_many`` calls). It
overlaps generation when the overlap is on, so it is not one of the parts: ``verify - wait`` is what was hidden.
``throughput/completion_tokens`` and ``throughput/verdicts`` count what the step generated and verified;
``verify_stage/<stage>_s`` add up the verifier's own stage seconds of those verdicts (``Verdict.stage_s``, and
``gpu_wait`` for its waits for a GPU turn): where a verdict's time goes.
``memory/peak_rss_gib`` is the process's peak resident set; on a GPU ``memory/peak_gpu_gib`` is
``torch.cuda.max_memory_allocated``. Both are peaks since the process started.
"""

from __future__ import annotations

import resource
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PARTS = ("generate", "wait", "optimize", "other")
STAGE = "stage/"  # StepClock keys of the verdicts' stage seconds (StepClock.add_stages)
GIB = float(1 << 30)


def peak_memory(device: str) -> dict[str, float]:
    """Peak resident set of this process (GiB) and, on a GPU, the peak memory torch allocated there."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    out = {"memory/peak_rss_gib": rss / (GIB if sys.platform == "darwin" else GIB / 1024)}
    if device != "cpu":
        import torch

        if torch.cuda.is_available():
            out["memory/peak_gpu_gib"] = torch.cuda.max_memory_allocated() / GIB
    return out


class StepClock:
    """Accumulates the parts of the current step; :meth:`step_end` returns them and starts the next step.

    ``add`` may be called from the verification thread (``verify``); everything else runs on the trainer's thread.
    """

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._lock = threading.Lock()
        self._acc: dict[str, float] = {}
        self._last_end = time.perf_counter()
        self._prepared_at: float | None = None
        self.rows: list[dict[str, float]] = []

    def start(self) -> None:
        """The phase's first step starts now."""
        with self._lock:
            self._acc, self._prepared_at = {}, None
        self._last_end = time.perf_counter()

    def add(self, key: str, amount: float) -> None:
        """Add ``amount`` to ``key`` of the current step (a part's seconds, or a count)."""
        with self._lock:
            self._acc[key] = self._acc.get(key, 0.0) + float(amount)

    def add_stages(self, verdicts: Iterable[Any]) -> None:
        """Fresh verdicts' own stage seconds and GPU waits (``Verdict.stage_s``, ``gpu_wait_s``): ``verify_stage/``."""
        for verdict in verdicts:
            for stage, seconds in (getattr(verdict, "stage_s", None) or {}).items():
                self.add(STAGE + stage, seconds)
            self.add(STAGE + "gpu_wait", getattr(verdict, "gpu_wait_s", 0.0) or 0.0)

    def add_verified(self, seconds: float, verdicts: Sequence[Any]) -> None:
        """Verification the trainer waited for whole (inside the reward call, or a turn of an episode)."""
        self.add("verify", seconds)
        self.add("wait", seconds)
        self.add("verdicts", len(verdicts))
        self.add_stages(verdicts)

    def value(self, key: str) -> float:
        with self._lock:
            return self._acc.get(key, 0.0)

    def batch_ready(self) -> None:
        """The step's batch is prepared (generated and scored); what follows until the step's end is optimisation."""
        self._prepared_at = time.perf_counter()

    def _sync(self) -> None:
        if self.device != "cpu":
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the optimiser's kernels belong to this step, not the next one's generation

    def step_end(self) -> dict[str, float]:
        """The finished step's row (see the module docstring for the keys)."""
        self._sync()
        now = time.perf_counter()
        with self._lock:
            acc, self._acc = self._acc, {}
        wall = now - self._last_end
        optimize = now - self._prepared_at if self._prepared_at is not None and self._prepared_at >= self._last_end else 0.0
        generate, wait = acc.get("generate", 0.0), acc.get("wait", 0.0)
        row = {"time/step_s": wall, "time/generate_s": generate, "time/wait_s": wait, "time/optimize_s": optimize,
               "time/other_s": max(0.0, wall - generate - wait - optimize), "time/verify_s": acc.get("verify", 0.0),
               "throughput/completion_tokens": acc.get("completion_tokens", 0.0),
               "throughput/verdicts": acc.get("verdicts", 0.0)}
        row.update({f"verify_stage/{key[len(STAGE):]}_s": value for key, value in acc.items() if key.startswith(STAGE)})
        row.update(peak_memory(self.device))
        self._last_end, self._prepared_at = now, None
        self.rows.append(row)
        return row


def breakdown(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """A phase's summary of its steps' rows: mean seconds of the step and each part, each part's share of
    the mean step, tokens/s of generation, verdicts/s of the verifier, the peak memory."""
    rows = [r for r in rows if "time/step_s" in r]
    if not rows:
        return {}

    def total(key: str) -> float:
        return sum(float(r.get(key) or 0.0) for r in rows)

    steps, wall = len(rows), total("time/step_s")
    out: dict[str, float] = {"steps": float(steps), "step_s": wall / steps}
    for part in (*PARTS, "verify"):
        out[f"{part}_s"] = total(f"time/{part}_s") / steps
        out[f"{part}_share"] = total(f"time/{part}_s") / wall if wall > 0 else 0.0
    generate, verify = total("time/generate_s"), total("time/verify_s")
    out["tokens_per_s"] = total("throughput/completion_tokens") / generate if generate > 0 else 0.0
    out["verdicts_per_s"] = total("throughput/verdicts") / verify if verify > 0 else 0.0
    for key in ("memory/peak_rss_gib", "memory/peak_gpu_gib"):
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        if values:
            out[key.split("/")[1]] = max(values)
    verdicts = total("throughput/verdicts")
    stages = sorted({k for r in rows for k in r if k.startswith("verify_stage/")})
    for key in stages if verdicts > 0 else ():
        out[f"per_verdict/{key[len('verify_stage/'):-2]}"] = total(key) / verdicts  # mean seconds per verdict
    return out


def breakdown_line(name: str, b: Mapping[str, float]) -> str:
    """One printed line of :func:`breakdown` (the run's summary and the GPU measurement read it)."""
    parts = ", ".join(f"{p} {b[f'{p}_s']:.2f} s ({100 * b[f'{p}_share']:.0f}%)" for p in PARTS)
    memory = f"peak GPU memory {b['peak_gpu_gib']:.1f} GiB, " if "peak_gpu_gib" in b else ""
    stages = sorted(((k.split("/", 1)[1], v) for k, v in b.items() if k.startswith("per_verdict/") and v >= 0.005),
                    key=lambda kv: -kv[1])  # what rounds to 0.00 s says nothing
    slowest = ("; a verdict's slowest stages: " + ", ".join(f"{k} {v:.2f} s" for k, v in stages[:4])) if stages else ""
    return (f"{name}: {int(b['steps'])} steps, mean step {b['step_s']:.2f} s = {parts}; verify {b['verify_s']:.2f} s a step "
            f"({100 * b['verify_share']:.0f}% of step time, {100 * b['wait_share']:.0f}% waited for); "
            f"{b['tokens_per_s']:.0f} tokens/s generating, {b['verdicts_per_s']:.1f} verdicts/s verifying; "
            f"{memory}peak RSS {b.get('peak_rss_gib', 0.0):.1f} GiB{slowest}")
