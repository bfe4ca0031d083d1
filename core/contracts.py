"""The interfaces plugins implement. Registry factories return objects of these shapes.

They are ``typing.Protocol`` s: a plugin needs no base class, only the attributes and methods.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from core.task import Candidate, Task
from core.verdict import Verdict


@dataclass
class CurriculumState:
    """What the curriculum tells the proposer about the task distribution it wants next.

    :param param_scale: multiplies the proposer's parameter/shape ranges (the published rule
        shrinks it by 0.7 when accuracy is low).
    :param max_tier: highest op tier the proposer may use (new APIs are introduced by raising it).
    :param perf_share: share of tasks that are performance samples (large enough to time).
    :param allowed_ops: optional explicit allow-list of op names; ``None`` means "every op up to
        ``max_tier``".
    """

    param_scale: float = 1.0
    max_tier: int = 0
    perf_share: float = 0.0
    allowed_ops: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Proposer(Protocol):
    name: str

    def propose(self, n: int, curriculum: CurriculumState) -> list[Task]:
        """Return ``n`` tasks drawn for the given curriculum state (deterministic given the seed)."""

    def feedback(self, solve_rates: dict[str, float]) -> None:
        """Receive verified solve rates (task id -> share of accepted samples) after a step."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Coder(Protocol):
    name: str

    def generate(self, tasks: Sequence[Task], backend: str, num_samples: int = 1) -> list[list[Candidate]]:
        """Return, for each task, ``num_samples`` candidates for ``backend``.

        A coder that cannot answer a task returns candidates with ``declined`` set to the reason.
        """


@runtime_checkable
class TrainableCoder(Coder, Protocol):
    """A coder the training loop can update (the ``llm`` coder): what :mod:`core.loop` calls on it.

    :ivar model: the weights it loads (a path, a hub name, or ``"embedded"``).
    :ivar tokenizer: where its tokenizer comes from (defaults to ``model``).
    :ivar adapter: a LoRA adapter directory loaded on top of ``model``, or None.
    """

    model: str | None
    tokenizer: str | None
    adapter: str | None

    @property
    def hf_model(self) -> Any:
        """The ``transformers`` model (loaded by :meth:`load`)."""

    @property
    def hf_tokenizer(self) -> Any:
        """Its tokenizer."""

    def load(self, corpus: Sequence[str] | None = None) -> Any:
        """Load ``model`` (an embedded model is built, its tokenizer trained on ``corpus``)."""

    def set_model(self, model: Any) -> None:
        """Use ``model`` (a trainer's updated model) from now on."""

    def corpus(self, tasks: Sequence[Task], solutions: Sequence[str], backend: str) -> list[str]:
        """Text an embedded tokenizer is trained on: these tasks' prompts and these solutions."""

    def prompt(self, task: Task, backend: str) -> str:
        """The prompt for ``task``."""

    def fits(self, prompt: str) -> bool:
        """Whether ``prompt`` fits the prompt budget."""

    def completion_for(self, solution_source: str) -> str:
        """The completion that answers a prompt with this solution (SFT targets)."""

    def extract(self, completion: str) -> str:
        """The candidate source inside a completion."""

    def to_candidate(self, task: Task, completion: str, backend: str) -> Candidate:
        """A completion as a candidate for ``task``."""


@runtime_checkable
class RewardTerm(Protocol):
    name: str

    def __call__(self, verdicts: Sequence[Verdict], tasks: Sequence[Task], **context: Any) -> list[float]:
        """One reward per verdict. ``context`` may hold ``candidates`` (same order as ``verdicts``).

        Rejected candidates are given the mix's ``failure_reward`` unless the term sets
        ``scores_failures = True`` and scores them itself.

        A term that can only be nonzero where something is measured (GPU timing) says so through the
        optional ``supports(device) -> str | None``: None where it can be nonzero on ``device``
        ("cpu"/"cuda"), else why not (a sentence); a run that weighs it there warns once at start.
        """


@runtime_checkable
class Curriculum(Protocol):
    name: str
    state: CurriculumState

    def update(self, metrics: dict[str, float]) -> list[str]:
        """Adjust ``state`` from a step's metrics; return the decisions taken, for the log."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU model: its peak rates, measured where possible (say where in ``source``), and the facts
    compilers and tilers read of it. Adding a GPU is one ``register_devices`` implementation.

    :param peak_flops: FLOP/s per dtype name (``"float32"``, ``"bfloat16"``, ``"float16"``).
    :param peak_bandwidth: device-memory bytes per second (read + written).
    :param sms: streaming multiprocessors (a tiler's notion of one wave); 0: unknown.
    :param arch: compile target (``"sm_90"``); ``""``: unknown.
    :param warp_size: threads per warp.
    :param reference: the GPU a compile without a device targets (the project's own; one registered GPU sets it).
    """

    name: str
    peak_flops: dict[str, float] = field(default_factory=dict)
    peak_bandwidth: float = 0.0
    l2_bytes: int = 0
    source: str = ""
    sms: int = 0
    arch: str = ""
    warp_size: int = 32
    reference: bool = False


# --------------------------------------------------------------------------- verifier: backends, checks
# Added by the verifier (issue 3). ``core.verify`` and ``core.verification.worker`` are the only callers.

from typing import TYPE_CHECKING  # noqa: E402

if TYPE_CHECKING:  # names used only in the annotations below
    import ast
    from types import ModuleType
    from typing import ContextManager

    from core.verdict import CheckResult
    from core.verification.evidence import Evidence


@runtime_checkable
class LaunchTracker(Protocol):
    """Counts launches of a backend's kernels; made by :meth:`Backend.launch_tracker` in the worker.

    :ivar count: launches since the tracker was entered.
    :ivar kernels: names of the kernels launched, in order (may be capped).
    :ivar inside: True while a launch is running; the ATen audit ignores ops a backend's own
        launcher runs (the Triton interpreter copies arguments with ``aten.copy_``).
    """

    count: int
    kernels: list[str]
    inside: bool


@runtime_checkable
class Backend(Protocol):
    """A kernel language a candidate may be written in (Triton, CUDA C through CuPy ...).

    The judging process only uses the static parts (``name``, ``language``, ``guide``,
    ``supports``, ``detect_kernels``, ``worker_env``); everything else runs inside sandboxed
    worker processes (:mod:`core.verification.worker`), never where verdicts are decided.

    :ivar name: registry name (``"triton"``); ``Candidate.backend`` holds it.
    :ivar language: human name of the kernel language, for prompts and reports.
    :ivar guide: prompt text that tells a coder the expected candidate format (a KernelBench
        ``ModelNew`` module whose forward launches this backend's kernels).
    """

    name: str
    language: str
    guide: str

    def supports(self, device: str) -> str | None:
        """``None`` when candidates can run on ``device`` ("cpu"/"cuda"); else why not (a sentence).

        When it refuses, the verifier falls back to a *compile-only* verdict (static checks, import,
        :meth:`load`; ``compiled`` set, never accepted, the sentence in ``reason``) if the backend's
        optional ``compiles_on(device) -> bool`` says so (default: only on ``"cpu"``)."""

    def detect_kernels(self, tree: "ast.Module") -> list[str]:
        """Judge side, static: names of this backend's kernels defined in the parsed candidate."""

    def worker_env(self, device: str) -> dict[str, str]:
        """Environment variables a worker needs before anything is imported (``TRITON_INTERPRET``)."""

    def prepare_worker(self, device: str) -> None:
        """Worker side, once per worker before any candidate is loaded: import the toolchain and
        install instrumentation (launch counting, interpreter bounds checks)."""

    def load(self, module: "ModuleType", device: str) -> None:
        """Worker side, compile step: called after the candidate module was imported.
        Raise with the compiler's message when its kernels do not build.

        A backend may also offer ``precompile(source, device) -> dict``: the part of the compile that
        needs only the candidate's text (nothing of it runs), which a verifier sends before the load
        takes its turn on a shared GPU, so the load holds the GPU for less time. And
        ``compile_ahead(model, inputs) -> dict``: after the load, the loaded model's kernels compiled for
        the task's input shapes (uninitialised tensors) with no work on the GPU, so the first trial's
        shared turn does not hold the GPU while they compile (``{"compiled": n, ...}``)."""

    def launch_tracker(self) -> "ContextManager[LaunchTracker]":
        """Worker side: a context manager counting this backend's kernel launches inside it."""

    def capabilities(self, device: str) -> frozenset[str]:
        """Optional instrumentation this backend offers on ``device``:
        ``"bounds_check"`` (:meth:`bounds_checking`) and ``"program_order"`` (:meth:`program_order`)."""

    def bounds_checking(self) -> "ContextManager[list[str]]":
        """Worker side: while inside, every load/store is checked against the storages of the
        launch's tensor arguments; out-of-bounds accesses are suppressed (never performed) and
        described in the yielded list."""

    def program_order(self, seed: int | None) -> "ContextManager[None]":
        """Worker side: while inside, the programs of each launched grid run in a shuffled order
        drawn from ``seed`` (``None``: the natural order)."""


@runtime_checkable
class Check(Protocol):
    """One verification check (a stage of DESIGN.md), registered through ``register_verifiers``.

    :ivar name: key in ``Verdict.checks``.
    :ivar stage: order; see the constants in :mod:`core.verification.evidence` (STATIC=0 ... PERFORMANCE=8).
    :ivar hard: a failure rejects the candidate (soft checks only record their finding).
    :ivar where: ``"judge"`` for checks that only read the source (run before anything executes);
        ``"worker"`` for checks that need the candidate run (their ``evaluate`` still runs in the
        judging process, on what the worker observed).
    :ivar needs: observations the worker must make for this check, from
        :data:`core.verification.evidence.OBSERVATIONS` (``"trials"``, ``"shuffled"``, ``"repeat"``, ``"probes"``).

    A check that needs its own measurement in the worker (GPU timing, a sanitizer run) also
    defines ``collect(session) -> dict``: it runs inside the worker with a
    :class:`core.verification.worker.Session` (the loaded model, input helpers, the backend) and returns plain
    data (numbers, strings, lists, dicts, tensors), found at ``evidence.extra[check.name]``.
    """

    name: str
    stage: int
    hard: bool
    where: str
    needs: frozenset[str]

    def applies(self, backend: str, device: str) -> bool:
        """Whether this check runs for candidates of ``backend`` on ``device``."""

    def evaluate(self, evidence: "Evidence") -> "CheckResult":
        """Decide, in the judging process, from what was observed."""


# --------------------------------------------------------------------------- optional members
# The engine reads these members of a plugin only through :func:`optional`, so everything it may
# touch is declared here with its default; a plugin that lacks one behaves as the default says.


def _never() -> bool:
    return False


def _no_dirs() -> list[str]:
    return []


def _compiles_on_cpu(device: str) -> bool:
    return device == "cpu"


def _every_device(device: str) -> None:
    return None


OPTIONAL_MEMBERS: dict[str, dict[str, Any]] = {
    "Check": {
        # collect(session) -> dict: the check's own measurement inside the worker (GPU timing, a
        # sanitizer run); found at evidence.extra[check.name].
        "collect": None,
        # prepare(session, config) -> dict: set-up in the worker while the GPU is shared, so that an
        # exclusive stage only times; its answer is passed to collect as config["prepared"].
        "prepare": None,
        # baseline(session, config) -> dict: measure the task's reference (eager, torch.compile) in a
        # reference worker; baseline_key(config) -> hashable says which baselines are the same.
        "baseline": None,
        # baseline_prepare(task, init_seed) -> state: the baseline's set-up (the model, inputs, the
        # torch.compile build) while the GPU is shared; the worker keeps the state and hands it to
        # baseline(task, init_seed, prepared=state), which then only times, with the GPU alone.
        "baseline_prepare": None,
        # start(evidence) -> None: begin the check's own work (on other hardware: interp_races' CPU
        # analysis) as soon as the judge-side checks pass, so it overlaps the GPU stages; its
        # ``evaluate`` later collects the result.
        "start": None,
        "baseline_key": None,
        "baseline_per_task": False,  # one baseline per task, shared by its candidates
        "dirties_worker": _never,  # collect leaves the candidate worker unusable: replace it after
        "exclusive_device": False,  # collect holds the GPU alone (timing)
        "locks_device_itself": False,  # collect takes the GPU lock itself (a sanitizer subprocess)
        "orders": 0,  # shuffled program orders this check needs run
        # reads: the runs whose outputs evaluate compares, a set of "trials", "first_trial", "shuffled",
        # "repeat", "probes"; None: any. Once no check still to be evaluated reads a run's outputs, the
        # keeper drops them (KernelBench level 1: outputs of 4-8 GiB per run). Reading an undeclared
        # run's outputs after that is an error verdict (of the engine, not the candidate).
        "reads": None,
        # verdict_fields(result) -> dict: the Verdict fields this check's recorded result fills ("accuracy",
        # "correct": the correctness check's; "timing", "roofline": the performance check's). None: none.
        "verdict_fields": None,
        # warm_up(device) -> None, or a short split of its seconds for the worker's hello: done once in an
        # idle worker before its first verdict (compile the check's own kernels, load its libraries), so no
        # verdict pays for it.
        "warm_up": None,
        # warm_up_roles: the worker roles ("candidate", "reference") whose warm-up runs the hook; None: every role
        "warm_up_roles": None,
        # open(settings) -> None: start what the check holds beyond one verdict (the interpreter race
        # check's CPU verifier), without waiting for it, while the Verifier's own workers start;
        # settings: {"tolerances": ..., "workers": the Verifier's candidate workers}. close() -> None: release it; called from Verifier.close.
        "open": None,
        "close": None,
    },
    "Backend": {
        "compiles_on": _compiles_on_cpu,  # compiles_on(device): a compile-only verdict is possible
        "warm_up_candidate": None,  # a candidate (source) judged once per worker before verdicts
        "compiler_dirs": _no_dirs,  # compiler_dirs(): the only folders a worker may start programs from
        "precompile": None,  # precompile(source, device) -> dict: compile from the text alone
        # compile_ahead(model, inputs) -> dict: compile the loaded model's kernels for these (uninitialised)
        # inputs with no work on the GPU, before the first trial's turn on it
        "compile_ahead": None,
        # static_policy: what a candidate's source may name (plugins.verifiers.policy.StaticPolicy:
        # modules, members, builtins); None: the strictest policy, torch and math only.
        "static_policy": None,
        # sandbox: a core.api.sandbox.SandboxNeeds, what the worker must know of the toolchain (frames and
        # code it trusts, state it snapshots, environment, GPU tools that apply); None: nothing.
        "sandbox": None,
        # toolchain() -> {name: version}: the compilers and libraries a verdict depends on (the eval
        # cache keys verdicts on them); the default, dict(), declares none
        "toolchain": dict,
        # instrumentation() -> {dotted name: object}: what prepare_worker patched or keeps state in (launch
        # wrappers, interpreter hooks, trackers); the worker verifies each is still in place after every
        # candidate call (core.verification.worker.tamper). The default, dict(), patched nothing.
        "instrumentation": dict,
        # provenance(inputs, model) -> context manager yielding a ledger, for backends whose
        # capabilities include "provenance" (plugins.backends.provenance.Ledger: after_op(func,
        # args, kwargs, result) from the ATen audit, check_outputs(outputs) -> findings).
        "provenance": None,
        # output_owner(storage) -> storage: the storage whose memory an output's storage is a view of, when
        # the backend hands candidates memory torch sees only through a new storage (the CUDA array
        # interface, DLPack); the worker then sees an earlier output returned again, however wrapped.
        # None: every output storage is its own.
        "output_owner": None,
        # judge_kernels(device) -> core.verification.devicekernels.JudgeKernels | None: kernels the judge may use
        # for its own work on very large tensors of that device (the plain bound's passes, the input digest's
        # sums), read from the registered class; None: torch computes the same figures.
        "judge_kernels": None,
    },
    # What the training and self-play loop (core/loop/) reads of a coder beyond ``generate``. A coder
    # that trains (hf_model, hf_tokenizer, prompt, to_candidate, load) is a language model; these are
    # its knobs. max_new_tokens: 512, LLMCoder's own default (it bounds both the SFT budget and GRPO's
    # completions; every coder that can train defines it).
    "Coder": {
        "model": None,  # the weights it loads; "embedded" has its tokenizer trained on a corpus first
        "corpus_tasks": 200,  # tasks in the embedded tokenizer's corpus
        "max_prompt_tokens": 1024,  # prompt budget (SFT budget = this + max_new_tokens)
        "max_new_tokens": 512,  # completion budget
        "temperature": 1.0,  # GRPO sampling
        "top_p": 1.0,  # GRPO sampling
        "turns": 1,  # attempts per GRPO episode; > 1: rejected attempts get the verdict's feedback (core.loop.refinement)
        "feedback_tokens": 96,  # token budget of that feedback (the verdict's reason + failing check's detail)
        # prompt_format: a core.loop.distillation.PromptFormat, the prompt a student coder is given
        # and the completion that answers it; core.distill writes its rows in it.
        "prompt_format": None,
    },
    "RewardTerm": {
        "scores_failures": False,  # True: the term scores rejected candidates itself (no failure_reward)
        # supports(device) -> str | None: None where the term can be nonzero for candidates verified on
        # device ("cpu"/"cuda"); else why not (speedup and roofline need GPU timing). A run whose reward
        # weighs such a term warns once at start (core.loop.rewards.reward_notes). The default: every device.
        "supports": _every_device,
    },
}


def optional(plugin: Any, protocol: str, member: str) -> Any:
    """``plugin.member``, or the declared default of that optional member of ``protocol``.

    A member that is not declared in :data:`OPTIONAL_MEMBERS` raises ``KeyError``: the engine may
    not read what the contract does not promise.
    """
    default = OPTIONAL_MEMBERS[protocol][member]
    return getattr(plugin, member, default)


# --------------------------------------------------------------------------- executors

from collections.abc import Callable  # noqa: E402

Pair = tuple[Task, Candidate]


@runtime_checkable
class Executor(Protocol):
    """Spreads verification over workers, GPUs or machines; registered through ``register_executors``.

    Exactly what the training loop, self-play and the CLIs call (``core.verification.executor``
    holds the shared base). Used as a context manager: leaving it stops every shard. Optional:
    ``verify_stream(feed, on_verdicts)``, pairs put into a ``PairFeed`` from other threads verified as
    they come (``BaseExecutor`` has it; GRPO's overlapped verification uses it where present).

    :ivar workers: candidates verified at once over all shards (0 once closed).
    """

    workers: int

    def verify(self, task: Task, candidate: Candidate) -> Verdict:
        """The verdict of one candidate."""

    def verify_many(self, pairs: Sequence[Pair], on_verdicts: Callable[[list[int], list[Verdict]], None] | None = None,
                    deadline: float | None = None) -> list[Verdict | None]:
        """One verdict per ``(task, candidate)`` pair, in input order; ``on_verdicts(indices, verdicts)``
        reports each verdict once, as it lands (indices into ``pairs``). ``deadline``
        (``time.monotonic()``): no verification starts after it (the first excepted); the pairs never
        started are ``None`` (core.evaluation.runner's ``budget_s``)."""

    def describe(self) -> str:
        """One line for the log: the executor's name, its shards and workers."""

    def close(self) -> None:
        """Stop every shard; the executor verifies nothing afterwards."""

    def __enter__(self) -> "Executor": ...

    def __exit__(self, *exc: object) -> None: ...
