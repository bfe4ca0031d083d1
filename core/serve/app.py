"""The HTTP face of the verification service (Starlette): routes, who may call them, and how big a request may be.

The service judges nothing itself: it parses requests (:mod:`core.serve.wire`), admits their pairs to the
:class:`core.serve.dispatch.Dispatcher`, and answers with the verdicts the executor's sandboxed workers reached.
Candidate code never runs in this process.

Who may call: with a token (``--token`` or ``KERNELZERO_SERVE_TOKEN``) every request must carry
``Authorization: Bearer TOKEN``; without one, only loopback clients are answered, and a request that a proxy
forwarded (``Forwarded`` / ``X-Forwarded-For`` / ``X-Real-IP``) is not taken for a loopback one, since the
proxy's own address says nothing about the client behind it.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from core.serve import wire
from core.serve.dispatch import Dispatcher
from core.verdict import Verdict

FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


@dataclass
class ServiceInfo:
    """What ``GET /health`` tells a client about the service (and the settings a request may restate)."""

    backend: str
    device: str
    settings: dict[str, Any]
    executor: str = ""
    isolation: str = "unknown"
    extra: dict[str, Any] = field(default_factory=dict)


class Activity:
    """When the service last answered an authorized request, and how many it is answering now: what
    ``kernelzero serve --idle-exit`` waits on (a request still being judged is never idle time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._open = 0

    def begin(self) -> None:
        with self._lock:
            self._open += 1
            self._last = time.monotonic()

    def end(self) -> None:
        with self._lock:
            self._open -= 1
            self._last = time.monotonic()

    def idle_s(self) -> float:
        """Seconds since the last request ended; 0 while one is open."""
        with self._lock:
            return 0.0 if self._open else time.monotonic() - self._last


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address as the server saw it) is this machine's loopback.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("10.0.0.2"), is_loopback("testclient")
    (True, True, False, False)
    """
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def error_response(error: wire.WireError) -> JSONResponse:
    headers = {"Retry-After": str(max(1, round(error.retry_after_s)))} if error.retry_after_s is not None else None
    return JSONResponse(error.to_dict(), status_code=error.status, headers=headers)


def authorize(request: Request, token: str | None) -> None:
    """Raise :class:`wire.WireError` unless this request may be answered (see the module doc)."""
    if token:
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
            raise wire.WireError("unauthorized", "this service needs a token: send 'Authorization: Bearer TOKEN' "
                                 "(VerifierClient(url, token=...) or KERNELZERO_SERVE_TOKEN)")
        return
    host = request.client.host if request.client else None
    forwarded = [h for h in FORWARDING_HEADERS if h in request.headers]
    if not is_loopback(host) or forwarded:
        who = f"a request forwarded by a proxy ({forwarded[0]})" if forwarded and is_loopback(host) else f"client {host}"
        raise wire.WireError("forbidden", f"this service has no token, so it answers loopback clients only; {who} "
                             f"is not one. Start it with --token (or {wire.TOKEN_ENV}) and send "
                             "'Authorization: Bearer TOKEN'")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (``too_large``) as soon as it passes ``limit`` bytes: a declared length is checked
    before anything is read, and a chunked body is read no further than the limit."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise wire.WireError("malformed", f"Content-Length {declared!r} is not a number") from None
        if size > limit:
            raise wire.WireError("too_large", f"the body is {size} bytes; this service takes at most {limit} "
                                 "(send fewer pairs per request)")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise wire.WireError("too_large", f"the body passed {limit} bytes; this service takes at most {limit} "
                                 "(send fewer pairs per request)")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(dispatcher: Dispatcher, info: ServiceInfo, limits: wire.Limits, token: str | None = None,
               activity: Activity | None = None) -> Starlette:
    """The ASGI application over a running dispatcher (the caller owns both, and closes the dispatcher).
    ``activity`` is told of every authorized request (a stranger's refused one keeps nothing alive).

    Starlette, not FastAPI: requests are parsed and bounded by :mod:`core.serve.wire`, so FastAPI's pydantic
    models and OpenAPI pages would add a compiled dependency (pydantic-core) and nothing this service uses."""

    async def gate(request: Request, call_next: Any) -> Response:
        # before routing, so an unknown path from a stranger learns nothing either
        try:
            authorize(request, token)
        except wire.WireError as exc:
            return error_response(exc)
        if activity is None:
            return await call_next(request)
        activity.begin()
        try:
            return await call_next(request)
        finally:
            activity.end()

    async def refused(request: Request, exc: wire.WireError) -> Response:
        return error_response(exc)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ready": not dispatcher.closing, "backend": info.backend, "device": info.device,
                             "executor": info.executor, "isolation": info.isolation,
                             "workers": dispatcher.metrics()["workers"], "settings": info.settings,
                             "limits": limits.to_dict(), **info.extra})

    async def metrics(request: Request) -> Response:
        numbers = dispatcher.metrics()
        format = request.query_params.get("format", "json")
        if format == "prometheus":
            return PlainTextResponse(prometheus_text(numbers))
        if format != "json":
            raise wire.WireError("malformed", f"format={format!r}: use json or prometheus")
        return JSONResponse(numbers)

    async def judge(request: Request, batch: bool) -> list[Verdict]:
        body = await read_body(request, limits.max_body_bytes)
        parsed = wire.parse_request(body, batch, limits)
        wire.check_served(parsed, info.backend, info.settings)
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in parsed.pairs]

        def done(index: int, verdict: Verdict) -> None:
            def settle() -> None:
                if not futures[index].done():
                    futures[index].set_result(verdict)
            loop.call_soon_threadsafe(settle)

        if not dispatcher.admit(parsed.pairs, done):
            if dispatcher.closing:
                raise wire.WireError("closing", "the service is shutting down; try another, or again once it is back",
                                     retry_after_s=5.0)
            raise wire.WireError("busy", f"the queue is full ({dispatcher.max_queue} pairs waiting or being "
                                 "verified); nothing was queued, try again after Retry-After seconds",
                                 retry_after_s=dispatcher.retry_after_s())
        # a client that hangs up does not cancel its pairs: they were admitted, so they are verified (and counted)
        return list(await asyncio.gather(*(asyncio.shield(f) for f in futures)))

    async def verify(request: Request) -> JSONResponse:
        verdict = (await judge(request, batch=False))[0]
        return JSONResponse(verdict_json(verdict))

    async def verify_batch(request: Request) -> JSONResponse:
        return JSONResponse({"verdicts": [verdict_json(v) for v in await judge(request, batch=True)]})

    app = Starlette(routes=[Route(wire.HEALTH, health, methods=["GET"]), Route(wire.METRICS, metrics, methods=["GET"]),
                            Route(wire.VERIFY, verify, methods=["POST"]),
                            Route(wire.VERIFY_BATCH, verify_batch, methods=["POST"])],
                    middleware=[Middleware(BaseHTTPMiddleware, dispatch=gate)],
                    exception_handlers={wire.WireError: refused})
    app.state.dispatcher, app.state.info, app.state.limits = dispatcher, info, limits
    app.state.activity = activity
    return app


def verdict_json(verdict: Verdict) -> dict[str, Any]:
    """What the CLI prints of a verdict (``Verdict.to_dict``), as plain JSON values."""
    return json.loads(json.dumps(verdict.to_dict(), default=str))


def prometheus_text(numbers: dict[str, Any]) -> str:
    """The numbers of ``GET /metrics`` in Prometheus' text format (gauges and counters, ``kernelzero_serve_``)."""
    lines = []

    def add(name: str, kind: str, value: Any, labels: str = "") -> None:
        if value is None:
            return
        if not any(line.startswith(f"# TYPE kernelzero_serve_{name} ") for line in lines):
            lines.append(f"# TYPE kernelzero_serve_{name} {kind}")
        lines.append(f"kernelzero_serve_{name}{labels} {float(value):g}")

    for key in ("queue_depth", "in_flight", "max_queue", "workers", "verdicts_per_s", "uptime_s"):
        add(key, "gauge", numbers[key])
    for key in ("verdicts_total", "busy_total", "executor_errors"):
        add(key, "counter", numbers[key])
    for status, count in sorted(numbers["verdicts_by_status"].items()):
        add("verdicts_by_status", "counter", count, f'{{status="{status}"}}')
    for group in ("check_s", "queue_wait_s"):
        for stat, value in numbers[group].items():
            add(group, "gauge", value, f'{{stat="{stat}"}}')
    lines.append(f"# generated {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
    return "\n".join(lines) + "\n"
