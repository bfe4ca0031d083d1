"""The verification service's wire: every route, request body, answer and error code, in one module that the
server (:mod:`core.serve.app`) and the client (:mod:`core.serve.client`) both import.

Requests (JSON bodies)::

    POST /v1/verify        {"task": SOURCE | TASK, "candidate": SOURCE | CANDIDATE, "backend"?: str, "settings"?: {...}}
                           -> 200 VERDICT (the object ``python -m core.verify --json`` prints)
    POST /v1/verify/batch  {"pairs": [{"task": ..., "candidate": ...}, ...], "backend"?: str, "settings"?: {...}}
                           -> 200 {"verdicts": [VERDICT, ...]} (input order)
    GET  /health           -> 200 {"ready": true, "backend": ..., "settings": {...}, "limits": {...}, ...}
    GET  /metrics          -> 200 {"queue_depth": ..., "verdicts_per_s": ..., "check_s": {...}, ...}
                              (``?format=prometheus``: the same numbers as Prometheus text)

``SOURCE`` is a module's text; ``TASK`` / ``CANDIDATE`` are :meth:`core.task.Task.to_dict` /
:meth:`core.task.Candidate.to_dict` objects (so a proposer task keeps its metadata and id).

Errors are ``{"error": CODE, "message": "a sentence saying what to do"}`` with the status of :data:`ERRORS`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from core.task import Candidate, Task, TaskIdMismatch

VERIFY = "/v1/verify"
VERIFY_BATCH = "/v1/verify/batch"
HEALTH = "/health"
METRICS = "/metrics"

TOKEN_ENV = "KERNELZERO_SERVE_TOKEN"

# error code -> HTTP status. "busy" is the only one a client should retry (after Retry-After seconds).
ERRORS = {
    "malformed": 400,      # not JSON, or not the shape above; names the field
    "unsupported": 400,    # a backend or setting this service does not verify with
    "unauthorized": 401,   # a token is set and the request did not carry it
    "forbidden": 403,      # no token is set and the client is not on loopback
    "too_large": 413,      # body, one source, or batch over the limits in /health
    "busy": 503,           # the queue is full: nothing was queued, try again later
    "closing": 503,        # the service is shutting down
}
RETRYABLE = frozenset({"busy", "closing"})

# The verifier settings a request may name. A request may only restate the service's own value (the pool is
# started with them); anything else is refused with the value the service runs, so no reward is silently
# computed under other settings than the caller asked for.
SETTINGS = ("trials", "timeout_s", "checks", "device")


@dataclass(frozen=True)
class Limits:
    """What one request may carry, and how many pairs may wait; all in ``GET /health``."""

    max_body_bytes: int = 4 * 2**20
    max_source_bytes: int = 256 * 2**10
    max_batch: int = 64
    max_queue: int = 256  # pairs waiting or being verified; one more is answered "busy"

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class WireError(Exception):
    """A request the service refuses: its code (a key of :data:`ERRORS`) and a sentence for the user."""

    def __init__(self, code: str, message: str, retry_after_s: float | None = None):
        if code not in ERRORS:
            raise ValueError(f"unknown error code {code!r}; known: {sorted(ERRORS)}")
        super().__init__(message)
        self.code, self.message, self.retry_after_s = code, message, retry_after_s

    @property
    def status(self) -> int:
        return ERRORS[self.code]

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message}


@dataclass
class VerifyRequest:
    """One request's pairs and what it asked of the service (parsed from either verify route)."""

    pairs: list[tuple[Task, Candidate]]
    backend: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    batch: bool = False


def _source_of(value: Any, where: str, limits: Limits) -> None:
    text = value if isinstance(value, str) else value.get("source") if isinstance(value, dict) else None
    if not isinstance(text, str):
        kind = "a task" if where.endswith("task") else "a candidate"
        raise WireError("malformed", f"{where}: expected {kind}'s source text or an object with a 'source' string; "
                        f"found {type(value).__name__}")
    if len(text.encode("utf-8", "surrogatepass")) > limits.max_source_bytes:
        raise WireError("too_large", f"{where}: the source is {len(text.encode('utf-8', 'surrogatepass'))} bytes; "
                        f"this service takes at most {limits.max_source_bytes} per source")


def parse_task(value: Any, where: str, limits: Limits) -> Task:
    """A task from a source text or a :meth:`Task.to_dict` object; :class:`WireError` naming ``where``."""
    _source_of(value, where, limits)
    if isinstance(value, str):
        task = Task(source=value)
    else:
        try:
            task = Task.from_dict(value)
        except TaskIdMismatch as exc:
            raise WireError("malformed", f"{where}: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise WireError("malformed", f"{where}: not a task object ({exc})") from None
    try:  # the reference is the caller's to fix, not the candidate's fault: refused before anything runs
        compile(task.source, "<reference>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        raise WireError("malformed", f"{where}: the reference does not compile"
                        f"{f' (its line {line})' if line else ''}: {getattr(exc, 'msg', exc)}") from None
    return task


def parse_candidate(value: Any, where: str, limits: Limits) -> Candidate:
    _source_of(value, where, limits)
    if isinstance(value, str):
        return Candidate(source=value)
    try:
        return Candidate.from_dict(value)
    except (TypeError, ValueError) as exc:
        raise WireError("malformed", f"{where}: not a candidate object ({exc})") from None


def _pair(row: Any, where: str, limits: Limits) -> tuple[Task, Candidate]:
    if not isinstance(row, dict):
        raise WireError("malformed", f"{where}: expected an object with 'task' and 'candidate'; found {type(row).__name__}")
    missing = [k for k in ("task", "candidate") if k not in row]
    if missing:
        raise WireError("malformed", f"{where}: missing {' and '.join(repr(k) for k in missing)} "
                        f"(found keys {sorted(row) or 'none'})")
    return parse_task(row["task"], f"{where}.task", limits), parse_candidate(row["candidate"], f"{where}.candidate", limits)


def parse_request(body: bytes, batch: bool, limits: Limits) -> VerifyRequest:
    """The request in ``body`` (already read within ``limits.max_body_bytes``); :class:`WireError` otherwise."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError("malformed", f"the body is not JSON ({exc}); send Content-Type: application/json") from None
    if not isinstance(data, dict):
        raise WireError("malformed", f"the body must be a JSON object; found {type(data).__name__}")
    known = {"pairs"} if batch else {"task", "candidate"}
    unknown = sorted(set(data) - known - {"backend", "settings"})
    if unknown:
        raise WireError("malformed", f"unknown key(s) {unknown}; this route takes "
                        f"{sorted(known | {'backend', 'settings'})}")
    if batch:
        rows = data.get("pairs")
        if not isinstance(rows, list) or not rows:
            raise WireError("malformed", "'pairs' must be a non-empty list of {'task', 'candidate'} objects")
        if len(rows) > limits.max_batch:
            raise WireError("too_large", f"the batch has {len(rows)} pairs; this service takes at most "
                            f"{limits.max_batch} per request (split it, or the client does: VerifierClient.verify_many)")
        pairs = [_pair(row, f"pairs[{i}]", limits) for i, row in enumerate(rows)]
    else:
        pairs = [_pair(data, "body", limits)]
    backend = data.get("backend")
    if backend is not None and not isinstance(backend, str):
        raise WireError("malformed", f"'backend' must be a string; found {type(backend).__name__}")
    settings = data.get("settings") or {}
    if not isinstance(settings, dict):
        raise WireError("malformed", f"'settings' must be an object; found {type(settings).__name__}")
    return VerifyRequest(pairs=pairs, backend=backend, settings=settings, batch=batch)


def check_served(request: VerifyRequest, backend: str, settings: dict[str, Any]) -> None:
    """Refuse a request for a backend or settings the service does not verify with (``unsupported``)."""
    wanted = {request.backend} | {c.backend for _, c in request.pairs if request.backend is None}
    wrong = sorted(b for b in wanted if b is not None and b != backend)
    if request.backend is None and wrong == ["triton"] and backend != "triton":
        wrong = []  # a bare source text defaults to Candidate.backend == "triton": it means "the service's"
    if wrong:
        raise WireError("unsupported", f"this service verifies backend {backend!r}; the request asked for "
                        f"{', '.join(map(repr, wrong))} (start another: kernelzero serve --backend {wrong[0]})")
    for key, value in request.settings.items():
        if key not in SETTINGS:
            raise WireError("unsupported", f"unknown setting {key!r}; a request may restate {list(SETTINGS)}")
        if _normal(value) != _normal(settings.get(key)):
            raise WireError("unsupported", f"this service verifies with {key}={settings.get(key)!r}; the request "
                            f"asked for {value!r} (start a service with that setting: kernelzero serve --help)")


def _normal(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return sorted(map(str, value))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def verify_body(task: Task | str, candidate: Candidate | str, backend: str | None = None,
                settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of ``POST /v1/verify`` (client side)."""
    body: dict[str, Any] = {"task": _wire(task), "candidate": _wire(candidate)}
    if backend is not None:
        body["backend"] = backend
    if settings:
        body["settings"] = dict(settings)
    return body


def batch_body(pairs: list[tuple[Task | str, Candidate | str]], backend: str | None = None,
               settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of ``POST /v1/verify/batch`` (client side)."""
    body: dict[str, Any] = {"pairs": [{"task": _wire(t), "candidate": _wire(c)} for t, c in pairs]}
    if backend is not None:
        body["backend"] = backend
    if settings:
        body["settings"] = dict(settings)
    return body


def _wire(value: Task | Candidate | str) -> Any:
    return value if isinstance(value, str) else value.to_dict()
