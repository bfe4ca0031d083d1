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
class RewardTerm(Protocol):
    name: str

    def __call__(self, verdicts: Sequence[Verdict], tasks: Sequence[Task], **context: Any) -> list[float]:
        """One reward per verdict. ``context`` may hold ``candidates`` (same order as ``verdicts``).

        Rejected candidates are given the mix's ``failure_reward`` unless the term sets
        ``scores_failures = True`` and scores them itself.
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
    """Peak rates of one GPU model, measured where possible (say where in ``source``).

    :param peak_flops: FLOP/s per dtype name (``"float32"``, ``"bfloat16"``, ``"float16"``).
    :param peak_bandwidth: device-memory bytes per second (read + written).
    """

    name: str
    peak_flops: dict[str, float] = field(default_factory=dict)
    peak_bandwidth: float = 0.0
    l2_bytes: int = 0
    source: str = ""
