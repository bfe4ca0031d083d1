"""GPU memory as a scheduled resource: each verification's footprint, admitted host-wide per GPU.

On one H200 at KernelBench's real sizes (inputs of 4-16 GiB) two verifications side by side ran each
other out of memory: the GPU lock (:mod:`core.verification.devicelock`) orders *turns*, but a
verification holds memory *between* its turns (the keeper's reference outputs, the candidate's
weights). So memory is admitted per verification, for all of its GPU stages at once:

* :func:`estimate` counts what one verification holds at its peak, from the task's tensors measured
  on the ``meta`` device by the reference worker (``Op.FOOTPRINT``, :func:`core.evaluation.resize.measure`);
* :class:`MemoryAdmission` is a host-wide ledger per physical GPU (files under the temp directory,
  like the lock, so every shard and process of the host respects it): a verification reserves its
  estimate before its first GPU stage and waits, first come first served, until it fits; one larger
  than the device's share (or one retried after running out of memory) reserves the whole device and
  runs alone. Reservations of a process that died are dropped by the next caller.

A verification that still runs out of memory alone gets status ``error`` (the task does not fit
the device), never ``rejected``: :class:`GpuOutOfMemory` carries it to ``Verifier.verify``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.verification.devicelock import DeviceLockTimeout, gpu_key

GiB = 1 << 30
# What one CUDA context and PyTorch's workspaces (cuBLAS, cuDNN) take in each of a verification's two
# workers (keeper and candidate), beside the tensors counted below.
WORKER_OVERHEAD_BYTES = 1 << 30
# The timed stage's L2 flush buffer and its own inputs/outputs beside the held ones.
TIMING_SCRATCH_BYTES = 1 << 30
DEFAULT_FRACTION = 0.9  # of the device's total, admitted (the rest: allocator fragmentation, other users)
# A reservation may start before those queued ahead of it (backfill) only while each of them has waited less
# than this, and only if it fits now and could be held beside each of them (none asked for the device alone).
BACKFILL_WAIT_S = 30.0
# A task whose timed stage holds at most this much has its baseline measured in a baseline worker beside the
# candidate's later stages (core.verification.observations.start_baselines), so both timed stages' memory
# can be held at once; a larger task's baseline follows the candidate's timing.
EARLY_BASELINE_MAX_BYTES = 2 << 30
# A candidate request's outputs wait on the device until the keeper adopts them; runs of larger
# outputs go a few per request (KernelBench level 1 at its real sizes: outputs of 4-8 GiB per run).
EXPORT_BATCH_BYTES = 4 << 30
# Outputs of more bytes are compared a chunk at a time (core.verification.plainbound, largecompare: over
# 2^24 elements); smaller ones whole.
LARGE_OUTPUT_BYTES = 64 << 20


class GpuOutOfMemory(RuntimeError):
    """A stage ran out of GPU memory: not the candidate's fault. ``Verifier.verify`` retries the
    verification alone, then gives a verdict of status ``error``."""

    def __init__(self, stage: str, error: str):
        super().__init__(f"{stage}: {error}")
        self.stage, self.error = stage, str(error)


OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY")


def is_out_of_memory(error: Any) -> bool:
    """Whether an error text is PyTorch's or CUDA's device allocation failure."""
    text = str(error or "")
    return any(m in text for m in OOM_MARKERS)


# --------------------------------------------------------------------------- the estimate


@dataclass
class Footprint:
    """What one verification holds on the device at its peak, in bytes: the largest of its ``phases`` (what
    its workers hold at once in each), with the ``parts`` those are made of."""

    bytes: int
    parts: dict[str, int] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)  # the task's tensors on meta
    note: str = ""
    phases: dict[str, int] = field(default_factory=dict)  # reference, trials, extra, timing, baseline

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def runs_per_request(output_bytes: int) -> int:
    """Candidate runs per request when one run's outputs take ``output_bytes`` (0: unknown): all of
    them (``1 << 30``) while a request's exported outputs stay under :data:`EXPORT_BATCH_BYTES`."""
    if output_bytes <= 0:
        return 1 << 30
    return max(1, EXPORT_BATCH_BYTES // output_bytes)


def reference_runs_held(output_bytes: int) -> int:
    """Reference runs a keeper holds at once when one run's outputs take ``output_bytes``: those under
    its resident budget, plus the one in use and one being computed again."""
    from core.verification.devicemem import REFERENCE_RESIDENT_BYTES

    if output_bytes <= 0:
        return 1 << 30
    return REFERENCE_RESIDENT_BYTES // output_bytes + 2


def estimate(measured: dict[str, Any], *, trials: int, probes: int = 3, orders: int = 0, repeat: bool = True,
             float64_max_elements: int = 0, inputs_kept: bool = False, released_when_judged: bool = False) -> Footprint:
    """One verification's peak device memory from the task's tensors (``measured``: ``inputs``,
    ``weights``, ``outputs``, ``written`` bytes and ``elements`` of inputs + outputs, as
    :func:`core.evaluation.resize.measure` gives them): the largest of its phases (``Footprint.phases``),
    each the copies its workers hold at once then (``Footprint.parts`` names them):

    * keeper (reference worker), in every phase: the model's weights; the reference outputs held in the
      Vault (large ones are dropped beyond :data:`~core.verification.devicemem.REFERENCE_RESIDENT_BYTES` and
      computed again when used: one run's inputs and intermediates, while the candidate runs too); the
      inputs of every run when ``get_inputs`` is not reproducible by seed (``inputs_kept``). From the
      trials on: the candidate's outputs it adopts (cloned): with ``released_when_judged`` (every check
      declares the runs it reads) one kind at a time, the trials', then the shuffled orders', repeat's or
      probes' (each kind dropped once judged, :func:`core.verification.pipeline.release_unread`), none
      during timing; else all of them, kept; a comparison's temporaries (an output of over 2^24 elements a
      chunk at a time, keeping the reference's spread, :mod:`core.verification.largecompare`; a smaller one
      whole, about nine outputs' worth) and its jittered reruns of the reference (two outputs, one run's
      inputs and intermediates); the float64 truth when a trial holds at most ``float64_max_elements``;
    * candidate worker: its weights; in the trials and extra runs one run's inputs at a time,
      intermediates and the outputs of one request exported to the keeper until adopted (large outputs go a
      few runs per request, :func:`runs_per_request`); in the timed stage the task's model, the first draw of
      inputs and one fresh draw per run, the run's output, a checked run's reference output and its
      comparison's temporaries, and the flush buffer;
    * baseline worker: the task's baseline, beside the candidate's extra runs and timing: for a small task
      (:data:`EARLY_BASELINE_MAX_BYTES`) all of it; for a larger one its set-up (model, inputs, one output
      and intermediates while ``torch.compile`` builds; then the model and inputs until it is timed, after the
      candidate's timing, :func:`core.verification.observations.start_baselines`);
    * each worker's CUDA context and library workspaces.
    """
    i, w, o = (int(measured.get(k) or 0) for k in ("inputs", "weights", "outputs"))
    transient = max(0, int(measured.get("written") or 0) - o)
    elements = int(measured.get("elements") or 0)
    runs_ref = trials + probes
    runs_cand = trials + orders + (1 if repeat else 0) + probes
    extra_kind = max(orders + 1, 2 if repeat else 0, probes)  # the first trial beside a kind, or the probes
    # the timed stage: the task's model, the first draw of inputs and a fresh one per run, the runs' outputs, a checked
    # run's reference (its intermediates) and comparison (H100, 2026-12-05: 43 GiB measured for 6-GiB inputs and
    # outputs, 24.8 for an 8-GiB input where 2i + 4o was counted)
    timing = w + 3 * i + 5 * o + transient + TIMING_SCRATCH_BYTES
    small_baseline = timing <= EARLY_BASELINE_MAX_BYTES
    whole_compare = 9 * o if o <= LARGE_OUTPUT_BYTES else o  # the spread alone, for a chunked comparison
    parts = {
        "keeper_weights": w,
        "keeper_inputs": i,
        "keeper_intermediates": transient,
        "reference_outputs": min(runs_ref, reference_runs_held(o)) * o,
        "adopted_outputs": (trials if released_when_judged else runs_cand) * o,
        "keeper_compare": whole_compare + 2 * o + i + transient,
        "kept_inputs": runs_ref * i if inputs_kept else 0,
        "float64_truth": 2 * (w + i + o + transient) if elements and elements <= float64_max_elements else 0,
        "candidate_weights": w,
        "candidate_inputs": i,
        "candidate_intermediates": transient,
        "exported_outputs": min(max(trials, runs_cand - trials), runs_per_request(o)) * o,
        # the timed stages (the candidate's, then the task's baseline): the task's model, the first draw of
        # inputs and one fresh draw per run, the run's output, and a checked run's reference output with
        # its comparison's temporaries (H200, 2026-12-05: i + o here ran 6 level-1 tasks out of memory alone)
        "timing": timing,
        "worker_overhead": 2 * WORKER_OVERHEAD_BYTES,
    }
    p = parts
    keeper = p["keeper_weights"] + p["reference_outputs"] + p["kept_inputs"]
    recompute = p["keeper_inputs"] + p["keeper_intermediates"]  # a dropped reference output computed again
    # a run's inputs drawn and a probe's transformed copy, its output and the request's exports (H100, 2026-12-05:
    # 20-25 GiB measured for 6-GiB inputs and outputs)
    candidate_runs = p["candidate_weights"] + 2 * p["candidate_inputs"] + p["candidate_intermediates"] + o + \
        p["exported_outputs"]
    judging = max(recompute, p["keeper_compare"]) + p["float64_truth"]  # one at a time in the keeper
    kept_after = 0 if released_when_judged else runs_cand * o
    overhead = p["worker_overhead"]
    phases = {
        # the reference runs: a run's inputs drawn twice (digested, then again), a probe's transformed copy and
        # its output beside the resident ones (H100, 2026-12-05: 29.8 GiB measured for 6-GiB inputs and outputs)
        "reference": keeper + 2 * i + transient + o + p["float64_truth"] + overhead,
        "trials": keeper + p["adopted_outputs"] + judging + candidate_runs + overhead,
        "extra": keeper + (extra_kind if released_when_judged else runs_cand) * o + judging + candidate_runs
        + overhead,
        "timing": keeper + kept_after + p["candidate_weights"] + timing + overhead,
        "baseline": keeper + kept_after + p["candidate_weights"] + timing + overhead,
    }
    # The task's baseline in a worker of its own beside the candidate's extra runs and timing: a small task's
    # whole baseline (no timing after the candidate's), always; a larger one's set-up (its peak while
    # torch.compile builds and runs once, then its model and inputs until it is timed after the candidate)
    # only where that fits under the verification's peak without it (core.verification.observations).
    # (The baseline workers' CUDA contexts are there whether they work or idle: the admitted fraction's margin.)
    if small_baseline:
        p["early_baseline"] = timing
        phases["extra"] += timing
        phases["timing"] += timing
        phases["baseline"] = 0
    else:
        set_up, held = w + i + o + transient, w + i
        peak = max(phases.values())
        fits = phases["extra"] + set_up <= peak and phases["timing"] + held <= peak
        p["early_baseline"] = set_up if fits else 0
        if fits:
            phases["extra"] += set_up
            phases["timing"] += held
    return Footprint(max(phases.values()), parts, dict(measured), phases=phases)


def unknown_footprint(capacity: int, share: int, note: str) -> Footprint:
    """The task could not be measured: it gets an even share of the device (``share`` verifications)."""
    return Footprint(max(1, capacity // max(1, share)), {"unmeasured_share": capacity // max(1, share)}, {}, note)


def fmt_bytes(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if abs(n) >= GiB / 10 else f"{n / 2**20:.1f} MiB"


# --------------------------------------------------------------------------- the device's memory


def capacity_from(total_bytes: int | None, configured_gb: float | None = None,
                  fraction: float = DEFAULT_FRACTION) -> int | None:
    """Bytes admitted: a configured budget (GB) as it is, else ``fraction`` of the device's total."""
    if configured_gb:
        return int(float(configured_gb) * GiB)
    if total_bytes:
        return int(int(total_bytes) * float(fraction))
    return None


# --------------------------------------------------------------------------- host-wide admission


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class MemoryAdmission:
    """Host-wide admission of GPU memory for one physical GPU (``gpu_key``).

    ``with admission.reserve(nbytes, deadline, label) as r: ...`` waits until the reservation fits
    beside those held, then holds it: first come, first served, except that a request that fits now may
    start before those ahead of it when it could be held beside each of them (backfill: on KernelBench level 1
    a 98-GiB task at the head of the queue held the small ones behind it while it waited for memory); once
    one has waited :data:`BACKFILL_WAIT_S`, only beside it and every reservation granted since, so that
    nothing started after then delays it. A request for the device alone is never overtaken.
    ``r.alone`` is True when it has the device to itself: asked for
    (``alone=True``) or larger than the capacity. The ledger is a JSON file under a ``flock``; every
    process (shards, ranks) with the same key and directory shares it. ``journal`` records this
    object's reservations (label, bytes, alone, asked, got, done) for tests and reports.
    """

    def __init__(self, key: str, capacity: int, directory: str | os.PathLike | None = None, poll_s: float = 0.01):
        self.key, self.capacity, self.poll_s = key, int(capacity), poll_s
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
        root = Path(directory or tempfile.gettempdir()) / "kernelzero-device-locks"
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        self.directory = str(Path(directory or tempfile.gettempdir()))
        self.path = root / f"{safe}.memory.json"
        self.lock_path = root / f"{safe}.memory.lock"
        self.journal: list[dict[str, Any]] = []

    @classmethod
    def for_device(cls, capacity: int, device: str = "cuda", directory: str | os.PathLike | None = None) -> MemoryAdmission:
        return cls(gpu_key(device), capacity, directory)

    @contextlib.contextmanager
    def _ledger(self) -> Iterator[dict[str, Any]]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                state = json.loads(self.path.read_text())
            except (OSError, ValueError):
                state = {}
            state.setdefault("held", {})
            state.setdefault("queue", [])
            before = json.dumps(state, sort_keys=True)
            for table in ("held",):
                for token, entry in list(state[table].items()):
                    if not _alive(int(entry.get("pid", 0))):
                        del state[table][token]
            state["queue"] = [q for q in state["queue"] if _alive(int(q.get("pid", 0)))]
            yield state
            if json.dumps(state, sort_keys=True) != before:
                tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(state))
                os.replace(tmp, self.path)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _fits(self, state: dict[str, Any], nbytes: int, alone: bool) -> bool:
        held = list(state["held"].values())
        if alone:
            return not held
        if any(h.get("alone") for h in held):
            return False
        return sum(int(h["bytes"]) for h in held) + nbytes <= self.capacity

    def _may_overtake(self, state: dict[str, Any], entry: dict[str, Any]) -> bool:
        """Whether ``entry`` may start before every request queued ahead of it (see the class)."""
        now, ahead = time.time(), []
        for queued in state["queue"]:
            if queued["token"] == entry["token"]:
                break
            ahead.append(queued)
        return bool(ahead) and not entry["alone"] and all(
            not q.get("alone") and self._beside(state, q, int(entry["bytes"]), now) for q in ahead)

    def _beside(self, state: dict[str, Any], queued: dict[str, Any], nbytes: int, now: float) -> bool:
        """Whether ``nbytes`` started now would leave room for ``queued`` once the reservations it waits for
        end: beside it alone while it has waited under :data:`BACKFILL_WAIT_S`; after that, beside it and
        every reservation asked after it and granted since (its own is then reserved: those never delay it)."""
        reserved = int(queued["bytes"]) + nbytes
        asked = float(queued.get("since") or now)
        if now < asked + BACKFILL_WAIT_S:
            return reserved <= self.capacity
        backfilled = sum(int(h["bytes"]) for h in state["held"].values()  # asked after it, granted since its hold
                         if float(h.get("since") or 0) > asked and float(h.get("got") or 0) >= asked + BACKFILL_WAIT_S)
        return reserved + backfilled <= self.capacity

    def held(self) -> dict[str, Any]:
        """The reservations held now (token -> entry), every process's."""
        with self._ledger() as state:
            return dict(state["held"])

    @contextlib.contextmanager
    def reserve(self, nbytes: int, deadline: float | None = None, label: str = "",
                alone: bool = False) -> Iterator["Reservation"]:
        nbytes = max(0, int(nbytes))
        alone = bool(alone) or nbytes > self.capacity
        token = secrets.token_hex(8)
        entry = {"token": token, "pid": os.getpid(), "bytes": nbytes, "alone": alone, "label": label[:200],
                 "since": time.time()}
        asked = time.monotonic()
        with self._ledger() as state:
            state["queue"].append(entry)
        got = False
        try:
            while True:
                with self._ledger() as state:
                    head = state["queue"][0]["token"] if state["queue"] else None
                    first = head == token or self._may_overtake(state, entry)
                    if first and self._fits(state, nbytes, alone):
                        state["queue"] = [q for q in state["queue"] if q["token"] != token]
                        state["held"][token] = {**entry, "got": time.time()}
                        got = True
                    elif head is None or all(q["token"] != token for q in state["queue"]):
                        state["queue"].append(entry)  # dropped (a reused pid looked dead): queue again
                if got:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise DeviceLockTimeout(f"GPU {self.key}'s memory stayed taken past the deadline "
                                            f"({fmt_bytes(nbytes)} asked of {fmt_bytes(self.capacity)})")
                time.sleep(self.poll_s)
        finally:
            if not got:
                with self._ledger() as state:
                    state["queue"] = [q for q in state["queue"] if q["token"] != token]
        record = {"label": label, "bytes": nbytes, "alone": alone, "asked": asked, "got": time.monotonic(),
                  "done": None}
        self.journal.append(record)
        try:
            yield Reservation(nbytes, alone, record["got"] - asked)
        finally:
            record["done"] = time.monotonic()
            with self._ledger() as state:
                state["held"].pop(token, None)


@dataclass
class Reservation:
    bytes: int
    alone: bool
    waited_s: float


__all__ = ["DEFAULT_FRACTION", "Footprint", "GiB", "GpuOutOfMemory", "MemoryAdmission", "Reservation",
           "capacity_from", "estimate", "fmt_bytes", "is_out_of_memory", "unknown_footprint"]
