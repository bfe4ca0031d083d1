"""Honest GPU timing: what a kernel costs, measured so that the usual tricks do not pay.

Per timed run (:func:`time_gpu`):

1. fresh inputs are made (outside the timed window), so no result can be cached by address or
   value, and no input is warm in L2 from the previous run;
2. L2 is flushed by writing a buffer larger than it (outside the window);
3. the device is synchronised, the start event recorded, the function called, an end event
   recorded on the current stream, then **the whole device is synchronised** (every stream) and a
   second end event recorded. Work hidden on a side stream is invisible to the first end event but
   not to the second;
4. the run's time is ``max(stream time, device time - sync overhead)``, where the overhead of the
   synchronise-and-record step is calibrated on an empty call. For an honest kernel both agree;
   for a side-stream trick the second is the real cost, and ``side_stream_ms`` records the gap.

With ``hide_launch_us`` > 0 (the default) the host's launch latency (Python, the Triton launcher, the driver:
tens of microseconds, and jittery) is kept out of the window: a filler kernel that takes every
thread slot of every SM runs for that long on the current stream just before the start event, so
the candidate's launches are queued while it runs and start the moment the event is recorded.
Because the filler holds the whole GPU, work a candidate puts on a side stream cannot run in that
unseen window either; it waits, and lands after the start event where step 3 sees it. The filler
grows to twice the host's launch time seen in warm-up (at most ``MAX_FILLER_US``), and a timed run
whose launch still outlasted it (the host was descheduled) is run again, ``launch_retries`` times
at most; ``launch_exposed_runs`` counts those that stayed exposed.

Warm-up runs until ``warmup_ms`` of kernel time has passed (at least ``min_warmup`` runs); the
number of timed runs is then adapted to the kernel's length (:func:`plan_runs`): many for short
kernels, at least ``min_runs`` for long ones. Every ``settle_every`` runs the timer stops early once
the median's distribution-free 95% interval is within ``settle_rel`` of it (:func:`median_settled`);
a kernel whose runs vary keeps going to its planned runs. The median is reported with the spread.

The statistics and planning helpers are pure and tested on CPU; :func:`time_gpu` needs CUDA.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

MiB = 1 << 20
MAX_FILLER_US = 5000.0  # the filler adapts to the host's launch time up to this


@dataclass(frozen=True)
class TimingPolicy:
    """How hard to look. Defaults aim at 1% repeatability of the median for kernels >= 50 us."""

    # 5 ms of warm-up runs: the first call (compilation, loading) is made, untimed, before them; on the
    # H200 5 ms kept repeated medians within 1% as 25 ms did (2026-11-30, CHANGELOG.md's history)
    warmup_ms: float = 5.0
    min_warmup: int = 3
    max_warmup: int = 200
    budget_ms: float = 400.0  # kernel time to spend on timed runs
    min_runs: int = 10
    max_runs: int = 500
    flush_l2: bool = True
    fresh_inputs: bool = True
    # the L2 flush writes at least this many bytes and twice the device's L2 (0: just twice the L2, 100 MiB on
    # an H200). On the H200 twice the L2 kept repeated medians within 1% as 256 MiB did, in less time per run.
    l2_flush_bytes: int = 0
    # >0: fill the GPU this long before the start event (module docstring). On the H200 this took the
    # spread of 8 repeated medians from 9.7% to 0.09% (x*2 over 128 MiB), docs/benchmarks.md.
    hide_launch_us: float = 100.0
    # the filler covers this many times the 90th percentile of the host's launch time seen in warm-up
    # (each timed run pays for it: on a loaded host 160-430 us of a ~0.5 ms run at 2x, docs/benchmarks.md);
    # a run whose launch outlasts it anyway is run again (launch_retries)
    filler_margin: float = 1.3
    launch_retries: int = 2  # re-runs of a timed run whose launch outlasted the filler (host descheduled)
    # >0: stop timing once the median is known to this relative width (a 95% distribution-free interval,
    # :func:`median_settled`), checked every ``settle_every`` runs; 0: always the planned runs. On the
    # H200 0.5% kept repeated medians within 1% and cut a 70 us kernel's timing from 500 runs to ~125.
    settle_rel: float = 0.005
    settle_every: int = 10

    def __post_init__(self) -> None:
        if self.min_runs < 1 or self.max_runs < self.min_runs:
            raise ValueError(f"need 1 <= min_runs <= max_runs, got {self.min_runs}, {self.max_runs}")
        if self.min_warmup < 1 or self.max_warmup < self.min_warmup:
            raise ValueError(f"need 1 <= min_warmup <= max_warmup, got {self.min_warmup}, {self.max_warmup}")
        if not 0.0 <= self.hide_launch_us <= 10_000.0:
            raise ValueError(f"hide_launch_us must be in [0, 10000], got {self.hide_launch_us}")
        if not 0.0 <= self.settle_rel < 1.0:
            raise ValueError(f"settle_rel must be in [0, 1), got {self.settle_rel}")
        if self.filler_margin < 1.0:
            raise ValueError(f"filler_margin must be >= 1 (the filler must outlast the launch), "
                             f"got {self.filler_margin}")
        if self.settle_every < 1:
            raise ValueError(f"settle_every must be >= 1, got {self.settle_every}")
        if self.l2_flush_bytes < 0:
            raise ValueError(f"l2_flush_bytes must be >= 0, got {self.l2_flush_bytes}")


def flush_bytes(policy: TimingPolicy, l2_bytes: int = 0, device_l2_bytes: int = 0) -> int:
    """What the L2 flush between runs writes: at least ``policy.l2_flush_bytes`` and twice the L2,
    whose size is the registered device's (``l2_bytes``) or else the driver's (``device_l2_bytes``);
    0 when the policy does not flush. A flush of nothing would leave inputs warm in L2, unsaid: refused.

    >>> flush_bytes(TimingPolicy(), l2_bytes=50 * MiB) // MiB
    100
    >>> flush_bytes(TimingPolicy(l2_flush_bytes=256 * MiB), l2_bytes=50 * MiB) // MiB
    256
    """
    if not policy.flush_l2:
        return 0
    nbytes = max(policy.l2_flush_bytes, 2 * int(l2_bytes or device_l2_bytes))
    if nbytes <= 0:
        raise ValueError("flush_l2 needs l2_flush_bytes > 0 or the device's L2 size (l2_bytes)")
    return nbytes


def plan_runs(estimate_ms: float, policy: TimingPolicy = TimingPolicy()) -> int:
    """Timed runs for a kernel of about ``estimate_ms``: ``budget / estimate`` within [min, max].

    >>> plan_runs(3.0), plan_runs(0.05), plan_runs(1000.0)
    (134, 500, 10)
    """
    if not estimate_ms > 0 or math.isinf(estimate_ms):
        return policy.max_runs if not estimate_ms > 0 else policy.min_runs
    return int(min(policy.max_runs, max(policy.min_runs, math.ceil(policy.budget_ms / estimate_ms - 1e-9))))


def median_interval(samples: Sequence[float]) -> tuple[float, float]:
    """A ~95% confidence interval of the median that assumes no distribution: the order statistics
    at ranks n/2 -/+ 0.98 sqrt(n) (binomial(n, 1/2) within 1.96 standard deviations)."""
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        raise ValueError("no samples")
    half = 0.98 * math.sqrt(n)
    lo = max(0, int(math.floor(n / 2 - half)))
    hi = min(n - 1, int(math.ceil(n / 2 + half)) - 1)
    return xs[lo], xs[max(lo, hi)]


def median_settled(samples: Sequence[float], rel: float, min_samples: int = 10) -> bool:
    """Whether the median of ``samples`` is known within ``rel`` of itself (interval width / median)."""
    if rel <= 0 or len(samples) < max(min_samples, 10):
        return False
    lo, hi = median_interval(samples)
    med = statistics.median(samples)
    return med > 0 and (hi - lo) / med <= rel


def plan_warmup(estimate_ms: float, policy: TimingPolicy = TimingPolicy()) -> int:
    """Warm-up runs so that about ``warmup_ms`` of kernel time passes, within [min, max]."""
    if not estimate_ms > 0:
        return policy.max_warmup
    return int(min(policy.max_warmup, max(policy.min_warmup, math.ceil(policy.warmup_ms / estimate_ms))))


@dataclass
class TimingStats:
    """Summary of timed runs, in milliseconds."""

    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float
    iqr_ms: float
    runs: int

    @property
    def cv(self) -> float:
        """Coefficient of variation (std / mean)."""
        return self.std_ms / self.mean_ms if self.mean_ms > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cv"] = self.cv
        return d


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values (``q`` in [0, 1])."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_ms: Sequence[float]) -> TimingStats:
    """Median, spread and extremes of timed runs."""
    if not samples_ms:
        raise ValueError("no timing samples to summarise")
    xs = sorted(float(x) for x in samples_ms)
    return TimingStats(
        median_ms=statistics.median(xs),
        mean_ms=statistics.fmean(xs),
        std_ms=statistics.pstdev(xs) if len(xs) > 1 else 0.0,
        min_ms=xs[0],
        max_ms=xs[-1],
        p10_ms=quantile(xs, 0.10),
        p90_ms=quantile(xs, 0.90),
        iqr_ms=quantile(xs, 0.75) - quantile(xs, 0.25),
        runs=len(xs),
    )


def relative_spread(values: Sequence[float]) -> float:
    """``(max - min) / median`` of repeated measurements (the repeatability target is <= 0.01)."""
    if not values:
        raise ValueError("no values")
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else float("inf")


def honest_sample(stream_ms: float, device_ms: float, overhead_ms: float,
                  jitter_ms: float = 0.02, jitter_rel: float = 0.05) -> float:
    """One run's time: the stream-event time, unless the device-wide time (less the calibrated cost
    of synchronising) shows work the stream events missed.

    The device-wide time includes host wake-up jitter (tens of microseconds), so it only replaces
    the stream time when it exceeds it by more than that jitter; otherwise the precise stream
    time is kept, which is what makes repeated medians agree to 1%.
    """
    hidden = device_ms - overhead_ms
    if hidden - stream_ms > max(jitter_ms, jitter_rel * stream_ms):
        return hidden
    return stream_ms


# --------------------------------------------------------------------------- GPU side


@dataclass
class TimingResult:
    """What :func:`time_gpu` measured."""

    stats: TimingStats
    warmup_runs: int
    overhead_ms: float  # calibrated cost of the device-wide synchronise + second end event
    side_stream_ms: float  # median (device - stream - overhead): work the stream events missed
    stream_median_ms: float
    flush_bytes: int
    fresh_inputs: bool
    method: str = "cuda-events; device-wide sync before the end event; L2 flush; fresh inputs; median"
    launch_hidden_us: float = 0.0  # length of the GPU filler before the start event (0: launch latency timed)
    launch_exposed_runs: int = 0  # timed runs whose launch outlasted the filler even after retries
    filler_fills_gpu: bool | None = None  # whether the filler held every thread slot (None: no filler)
    samples_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0  # host time the warm-up and the timed runs took (what a timed stage costs)

    @property
    def median_ms(self) -> float:
        return self.stats.median_ms

    def to_dict(self, keep_samples: bool = False) -> dict[str, Any]:
        d = {
            **self.stats.to_dict(),
            "warmup_runs": self.warmup_runs,
            "overhead_ms": self.overhead_ms,
            "side_stream_ms": self.side_stream_ms,
            "stream_median_ms": self.stream_median_ms,
            "l2_flush_bytes": self.flush_bytes,
            "fresh_inputs": self.fresh_inputs,
            "method": self.method,
            "launch_hidden_us": self.launch_hidden_us,
            "launch_exposed_runs": self.launch_exposed_runs,
            "filler_fills_gpu": self.filler_fills_gpu,
            "wall_s": self.wall_s,
        }
        if keep_samples:
            d["samples_ms"] = list(self.samples_ms)
        return d


# _Profile reads a tensor this many elements at a time: at KernelBench's sizes (1.6e9 elements) a boolean
# mask's indexing took 24 GiB of int64 indices at once, and ran the performance stage out of memory
PROFILE_CHUNK = 1 << 24


def _chunks(x: Any, chunk: int) -> Iterator[Any]:
    """Views of ``x`` along its first dimension, about ``chunk`` elements each (a copy of one is bounded)."""
    if x.dim() == 0:
        yield x.reshape(1)
        return
    row = max(1, x[0].numel())
    rows = max(1, chunk // row)
    for start in range(0, x.shape[0], rows):
        part = x[start:start + rows]
        if part.dim() > 1 and part[0].numel() > chunk:  # one row is itself larger: go a level deeper
            for sub in part:
                yield from _chunks(sub, chunk)
        else:
            yield part


def finite_stats(x: Any, chunk: int = PROFILE_CHUNK) -> tuple[int, float, float, float, float]:
    """(count, min, max, mean, unbiased std) of ``x``'s finite values, read ``chunk`` elements at a time
    (the std combined across chunks by Chan's rule, in float64)."""
    import torch

    n, lo, hi, mean, m2 = 0, math.inf, -math.inf, 0.0, 0.0
    for part in _chunks(x.detach(), chunk):
        f = part.reshape(-1).to(torch.float64)
        f = f[torch.isfinite(f)]  # a chunk's indices, not the tensor's
        k = int(f.numel())
        if k == 0:
            continue
        lo, hi = min(lo, float(f.min())), max(hi, float(f.max()))
        k_mean = float(f.mean())
        k_m2 = float(((f - k_mean) ** 2).sum())
        total = n + k
        delta = k_mean - mean
        mean += delta * k / total
        m2 += k_m2 + delta * delta * n * k / total
        n = total
    std = math.sqrt(m2 / (n - 1)) if n > 1 else 1.0
    return n, lo, hi, mean, std


class _Profile:
    """How to draw fresh values like a given tensor: normal, uniform, integer range or bool."""

    def __init__(self, x: Any):
        import torch

        self.kind = "copy"
        if x.numel() == 0:
            self.kind = "empty"
        elif x.dtype == torch.bool:
            self.kind = "bool"
        elif x.is_floating_point():
            n, lo, hi, mean, std = finite_stats(x)
            if n == 0:
                self.kind = "copy"
            elif lo >= 0.0:
                self.kind, self.a, self.b = "uniform", lo, hi if hi > lo else lo + 1.0
            else:
                self.kind, self.a, self.b = "normal", mean, std
        elif not x.is_complex():
            self.kind, self.a, self.b = "int", int(x.min()), int(x.max()) + 1

    def fill(self, flat: Any, generator: Any) -> None:
        if self.kind == "bool":
            flat.bernoulli_(0.5, generator=generator)  # in place: no float tensor of the input's size
        elif self.kind == "uniform":
            flat.uniform_(self.a, self.b, generator=generator)
        elif self.kind == "normal":
            flat.normal_(self.a, self.b if self.b > 0 else 1.0, generator=generator)
        elif self.kind == "int":
            flat.random_(self.a, self.b, generator=generator)


def fresh_like(base: Sequence[Any], generator: Any, profiles: list[_Profile | None] | None = None) -> list[Any]:
    """New tensors with the same shape, strides, storage offset, dtype and device as ``base``, holding
    fresh values drawn like the originals (non-tensors are passed through)."""
    import torch

    if profiles is None:
        profiles = [_Profile(x) if isinstance(x, torch.Tensor) else None for x in base]
    out: list[Any] = []
    for x, prof in zip(base, profiles):
        if not isinstance(x, torch.Tensor) or prof is None or prof.kind in ("copy", "empty"):
            out.append(x.clone() if isinstance(x, torch.Tensor) else x)
            continue
        n = x.untyped_storage().nbytes() // x.element_size()
        flat = torch.empty(n, dtype=x.dtype, device=x.device)
        prof.fill(flat, generator)
        out.append(flat.as_strided(x.size(), x.stride(), x.storage_offset()))
    return out


def fresh_arguments(base: Sequence[Any], seed: int) -> Callable[[int], list[Any]]:
    """``make_args`` for :meth:`GpuTimer.time`: at every call, fresh values shaped and drawn like
    ``base`` (CUDA tensors; other arguments as they are), from a generator seeded with ``seed``."""
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    profiles = [_Profile(x) if isinstance(x, torch.Tensor) else None for x in base]
    return lambda _: fresh_like(base, gen, profiles)


def warm_filler() -> None:
    """Compile and load the filler's kernel now (a tiny launch), so a timed stage that holds the GPU
    alone does not spend that time; its calibration stays in the timer, where the GPU is quiet."""
    import torch

    out = torch.empty(GpuFiller.THREADS, dtype=torch.float32, device="cuda")
    for iters in (16, 17):  # Triton specialises an int on divisibility by 16: the calibration's and any other
        _filler_kernel()[(1,)](out, iters, BLOCK=GpuFiller.THREADS, num_warps=GpuFiller.THREADS // 32)
    torch.cuda.synchronize()


@functools.lru_cache(maxsize=None)
def _filler_kernel() -> Any:
    """The filler's Triton kernel, defined once per process: a kernel object made per timer would be
    looked up and specialised anew inside every performance stage, while it holds the GPU alone."""
    import triton
    import triton.language as tl

    @triton.jit
    def _fill(out_ptr, iters, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = offs.to(tl.float32)
        for _ in range(iters):
            x = x * 0.999 + 0.5
        tl.store(out_ptr + offs, x)

    return _fill


class GpuFiller:
    """A kernel that holds every thread slot of every SM for a set time (``hide_launch_us``).

    Blocks of 1024 threads, as many per SM as the SM has thread slots; a block fits that often only
    if it needs few enough registers, which :attr:`fills_gpu` reports after compilation. The loop
    is a chain of dependent multiply-adds whose result is stored, so it cannot be optimised away;
    its trip count follows from the time per iteration, measured once with CUDA events.
    """

    THREADS = 1024

    def __init__(self, micros: float):
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.blocks_per_sm = max(1, props.max_threads_per_multi_processor // self.THREADS)
        self.grid = (props.multi_processor_count * self.blocks_per_sm,)
        self._kernel = _filler_kernel()
        self._out = torch.empty(self.grid[0] * self.THREADS, dtype=torch.float32, device="cuda")
        self.per_iter_us = self._time_per_iteration()
        self.resize(micros)
        regs = getattr(self._compiled, "n_regs", None)
        limit = props.regs_per_multiprocessor if hasattr(props, "regs_per_multiprocessor") else 65536
        self.fills_gpu = regs is not None and regs * self.THREADS * self.blocks_per_sm <= limit

    def __call__(self, iters: int | None = None) -> None:
        self._compiled = self._kernel[self.grid](self._out, self.iters if iters is None else iters,
                                                 BLOCK=self.THREADS, num_warps=self.THREADS // 32)

    def _time_per_iteration(self) -> float:
        import torch

        probe = 4096
        self(probe)  # compile
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(5):
            start.record()
            self(probe)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return max(1000.0 * statistics.median(times) / probe, 1e-6)

    def resize(self, micros: float) -> None:
        """Hold the GPU for ``micros`` from now on."""
        self.micros = float(micros)
        self.iters = max(1, int(micros / self.per_iter_us))


class GpuTimer:
    """Times callables on the current CUDA device with the protocol in the module docstring."""

    def __init__(self, policy: TimingPolicy = TimingPolicy(), l2_bytes: int = 0):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("GPU timing needs CUDA; none is visible (performance is measured on a GPU only)")
        self.torch = torch
        self.policy = policy
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        nbytes = flush_bytes(policy, l2_bytes, int(getattr(props, "L2_cache_size", 0) or 0))
        self.flush_bytes = nbytes
        self._flush = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda") if nbytes else None
        self._overhead_ms: float | None = None
        self._filler: GpuFiller | None = None
        self.filler_error = ""
        if policy.hide_launch_us > 0:
            try:
                self._filler = GpuFiller(policy.hide_launch_us)
            except Exception as exc:  # no Triton for this GPU: time with the launch latency, and say so
                self.filler_error = f"{type(exc).__name__}: {exc}"[:300]

    def flush(self) -> None:
        if self._flush is not None:
            self._flush.zero_()

    def _one(self, fn: Callable[..., Any], args: Sequence[Any]) -> tuple[float, float, Any, float]:
        """One timed call: (stream ms, device ms, output, host microseconds from the filler's launch
        to fn's return, i.e. how long the filler had to cover)."""
        torch = self.torch
        start, end_stream, end_device = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        self.flush()
        torch.cuda.synchronize()
        host0 = time.perf_counter()
        if self._filler is not None:
            self._filler()  # holds the whole GPU while the host launches fn (module docstring)
        start.record()
        out = fn(*args)
        host_us = 1e6 * (time.perf_counter() - host0)
        end_stream.record()
        torch.cuda.synchronize()  # every stream of the device, so side-stream work is counted
        end_device.record()
        end_device.synchronize()
        return start.elapsed_time(end_stream), start.elapsed_time(end_device), out, host_us

    def _exposed(self, host_us: float) -> bool:
        """Whether the host took longer to launch than the filler held the GPU (latency in the window)."""
        return self._filler is not None and host_us > 0.8 * self._filler.micros

    def overhead_ms(self, samples: int = 50) -> float:
        """Cost of the synchronise-and-record step, measured on a call that does no work: the 10th
        percentile of its gaps. Other processes on the GPU only ever lengthen a gap, so a low
        quantile is the step's own cost; a median would absorb the neighbours' work and then
        subtract it from the candidate's side-stream work, hiding that work (seen on a shared H200)."""
        if self._overhead_ms is None:
            gaps = []
            for _ in range(samples):
                s, d, _, _ = self._one(lambda: None, ())
                gaps.append(max(0.0, d - s))
            self._overhead_ms = quantile(sorted(gaps), 0.1)
        return self._overhead_ms

    def time(
        self,
        fn: Callable[..., Any],
        make_args: Callable[[int], Sequence[Any]],
        *,
        check: Callable[[int, Sequence[Any], Any], None] | None = None,
        check_runs: Sequence[int] = (),
    ) -> TimingResult:
        """Time ``fn(*make_args(i))``; ``make_args`` is called before each run, outside the window.

        ``check(i, args, out)`` is called (outside the window) after the timed runs listed in
        ``check_runs`` (negative indices count from the end), e.g. to verify outputs while timing.
        """
        policy = self.policy
        began = time.perf_counter()
        overhead = self.overhead_ms()
        warm: list[float] = []
        launches: list[float] = []
        i = 0
        while True:
            s, d, _, host_us = self._one(fn, make_args(i))
            i += 1
            warm.append(honest_sample(s, d, overhead))
            launches.append(host_us)
            recent = statistics.median(warm[-5:])
            if len(warm) >= plan_warmup(recent, policy):
                break
        if self._filler is not None:
            # As long as this host takes to launch fn (a loaded host, a chatty forward), within bounds.
            recent_launches = (launches[1:] or launches)[-20:]  # the first call also compiled
            needed = policy.filler_margin * quantile(sorted(recent_launches), 0.9)
            self._filler.resize(min(MAX_FILLER_US, max(policy.hide_launch_us, needed)))
        runs = plan_runs(statistics.median(warm[-5:]), policy)
        wanted = {r % runs for r in check_runs}
        samples, stream, gaps = [], [], []
        exposed = 0
        for r in range(runs):
            for attempt in range(1 + policy.launch_retries):  # a descheduled host: run again
                args = None  # the last run's inputs go before the next are drawn (inputs of GiB at real sizes)
                args = make_args(i)
                i += 1
                s, d, out, host_us = self._one(fn, args)
                if not self._exposed(host_us):
                    break
                if attempt < policy.launch_retries:
                    del out
            exposed += self._exposed(host_us)
            samples.append(honest_sample(s, d, overhead))
            stream.append(s)
            gaps.append(max(0.0, d - s - overhead))
            settled = policy.settle_rel > 0 and (r + 1) % policy.settle_every == 0 and r + 1 < runs and \
                median_settled(samples, policy.settle_rel, policy.settle_every)
            # stopping early makes this run the last: a check asked of a later (the last) run happens here
            if check is not None and (r in wanted or (settled and any(w > r for w in wanted))):
                check(r, args, out)
            del out
            if settled:
                break
        return TimingResult(
            stats=summarize(samples),
            warmup_runs=len(warm),
            overhead_ms=overhead,
            side_stream_ms=statistics.median(gaps),
            stream_median_ms=statistics.median(stream),
            flush_bytes=self.flush_bytes,
            fresh_inputs=policy.fresh_inputs,
            launch_hidden_us=self._filler.micros if self._filler is not None else 0.0,
            launch_exposed_runs=exposed,
            filler_fills_gpu=self._filler.fills_gpu if self._filler is not None else None,
            samples_ms=samples,
            wall_s=time.perf_counter() - began,
        )


def time_gpu(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    policy: TimingPolicy = TimingPolicy(),
    *,
    l2_bytes: int = 0,
    seed: int | None = None,
    exclusive: bool = True,
) -> TimingResult:
    """Time ``fn`` on fresh inputs shaped like ``inputs`` (CUDA tensors), by the module's protocol.

    ``exclusive``: hold the host-wide lock of this GPU (:class:`core.verification.devicelock.DeviceLock`)
    alone while timing, as the verifier's performance stage does, so no other KernelZero process on
    the host (a verifier's workers, another timer) uses the GPU meanwhile. Processes that do not take
    the lock are not held back by it."""
    import torch

    from core.api.workers import DeviceLock

    timer = GpuTimer(policy, l2_bytes=l2_bytes)
    if policy.fresh_inputs:
        make_args = fresh_arguments(inputs, seed if seed is not None else torch.seed())
    else:
        def make_args(_: int) -> Sequence[Any]:
            return inputs
    if not exclusive:
        return timer.time(fn, make_args)
    with DeviceLock.for_device("cuda").exclusive():
        return timer.time(fn, make_args)
