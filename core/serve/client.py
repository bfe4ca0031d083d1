"""A client of the verification service, with timeouts and retries, sync and async.

It has the executor's surface (``verify``, ``verify_many``, ``workers``, ``describe``, ``close``, a context
manager), so anything that takes an executor (``core.loop.refinement.RefinementEnv``, the adapters of
``kernelzero.envs``) takes a remote service the same way::

    with VerifierClient("http://127.0.0.1:8000") as client:
        verdict = client.verify(task, candidate)            # core.verdict.Verdict
        verdicts = client.verify_many(pairs)                # split into batches the service accepts
        verdict = await client.averify(task, candidate)     # from a coroutine (TRL, verl, verifiers)

Retries: a connection that failed or timed out, and the service's ``busy``/``closing`` answers (after their
``Retry-After``), are tried again up to ``retries`` times with exponential back-off; a refusal that would be
refused again (malformed, too large, unauthorized, unsupported) raises :class:`ServiceError` at once.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Sequence
from typing import Any

from core.serve import wire
from core.task import Candidate, Task
from core.verdict import Verdict

Pair = tuple[Task, Candidate]


class ServiceError(RuntimeError):
    """The service refused a request (``code`` from :data:`core.serve.wire.ERRORS`) or could not be reached."""

    def __init__(self, code: str, message: str, status: int | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status = code, message, status


class ServiceBusy(ServiceError):
    """Still busy after every retry."""


class VerifierClient:
    """Calls one service. ``token`` defaults to ``KERNELZERO_SERVE_TOKEN``.

    :param timeout_s: the whole of one HTTP request (a batch waits for its slowest verdict): give it the
        service's per-verification timeout times the batch's depth in its queue, at least.
    :param connect_timeout_s: connecting only.
    :param retries: further attempts after the first, for retryable failures only.
    :param backoff_s: the first wait; doubled each retry, with jitter, at most ``max_backoff_s`` (a
        ``Retry-After`` from the service is waited out when it is longer).
    """

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = 600.0, connect_timeout_s: float = 10.0,
                 retries: int = 5, backoff_s: float = 0.5, max_backoff_s: float = 30.0, batch_size: int | None = None):
        import httpx

        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get(wire.TOKEN_ENV) or None
        self.retries, self.backoff_s, self.max_backoff_s = int(retries), float(backoff_s), float(max_backoff_s)
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._headers = headers
        self._sync: Any = None
        self._async: dict[int, Any] = {}  # one AsyncClient per event loop (httpx clients are loop-bound)
        self._batch_size = batch_size
        self._health: dict[str, Any] | None = None

    # -- plumbing

    def _client(self) -> Any:
        import httpx

        if self._sync is None:
            self._sync = httpx.Client(base_url=self.url, timeout=self._timeout, headers=self._headers)
        return self._sync

    def _aclient(self) -> Any:
        import httpx

        loop = asyncio.get_running_loop()
        client = self._async.get(id(loop))
        if client is None or client.is_closed:
            limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
            client = self._async[id(loop)] = httpx.AsyncClient(base_url=self.url, timeout=self._timeout,
                                                               headers=self._headers, limits=limits)
        return client

    def _wait_s(self, attempt: int, retry_after: float | None) -> float:
        wait = min(self.max_backoff_s, self.backoff_s * 2 ** attempt) * (0.5 + random.random() / 2)
        return max(wait, retry_after or 0.0)

    def _outcome(self, response: Any) -> tuple[Any, ServiceError | None, float | None]:
        """``(json, None, _)`` for an answer; ``(None, error, retry_after)`` for a refusal."""
        if response.status_code == 200:
            return response.json(), None, None
        try:
            body = response.json()
            code, message = str(body.get("error", "http")), str(body.get("message", response.text))
        except ValueError:
            code, message = "http", response.text[:300] or response.reason_phrase
        retry_after = None
        if response.headers.get("retry-after", "").replace(".", "", 1).isdigit():
            retry_after = float(response.headers["retry-after"])
        return None, ServiceError(code, message, response.status_code), retry_after

    @staticmethod
    def _retryable(error: ServiceError) -> bool:
        return error.code in wire.RETRYABLE or error.code == "unreachable" or (error.status or 0) in (502, 504)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import httpx

        last: ServiceError | None = None
        for attempt in range(self.retries + 1):
            retry_after = None
            try:
                response = self._client().request(method, path, json=body)
                data, last, retry_after = self._outcome(response)
                if last is None:
                    return data
            except httpx.TransportError as exc:  # connect, read or write failed or timed out
                last = ServiceError("unreachable", f"{self.url}{path}: {type(exc).__name__}: {exc}")
            if not self._retryable(last) or attempt == self.retries:
                break
            time.sleep(self._wait_s(attempt, retry_after))
        raise _final(last)

    async def _arequest(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import httpx

        last: ServiceError | None = None
        for attempt in range(self.retries + 1):
            retry_after = None
            try:
                response = await self._aclient().request(method, path, json=body)
                data, last, retry_after = self._outcome(response)
                if last is None:
                    return data
            except httpx.TransportError as exc:
                last = ServiceError("unreachable", f"{self.url}{path}: {type(exc).__name__}: {exc}")
            if not self._retryable(last) or attempt == self.retries:
                break
            await asyncio.sleep(self._wait_s(attempt, retry_after))
        raise _final(last)

    # -- the service

    def health(self) -> dict[str, Any]:
        self._health = self._request("GET", wire.HEALTH)
        return self._health

    def metrics(self) -> dict[str, Any]:
        return self._request("GET", wire.METRICS)

    @property
    def batch_size(self) -> int:
        if self._batch_size is None:
            self._batch_size = int((self._health or self.health())["limits"]["max_batch"])
        return self._batch_size

    @property
    def workers(self) -> int:
        return int((self._health or self.health()).get("workers", 1))

    def describe(self) -> str:
        info = self._health or self.health()
        return f"service {self.url}: {info.get('executor', '')} ({info.get('backend')}, {info.get('device')})"

    def verify(self, task: Task | str, candidate: Candidate | str, *, backend: str | None = None,
               settings: dict[str, Any] | None = None) -> Verdict:
        """``backend``, ``settings`` (of :data:`core.serve.wire.SETTINGS`): what the request restates; a
        service that verifies otherwise refuses it (``unsupported``) instead of judging differently."""
        return Verdict.from_dict(self._request("POST", wire.VERIFY, wire.verify_body(task, candidate, backend, settings)))

    def verify_many(self, pairs: Sequence[tuple[Task | str, Candidate | str]], on_verdicts: Any = None,
                    deadline: float | None = None, *, backend: str | None = None,
                    settings: dict[str, Any] | None = None) -> list[Verdict]:
        """One verdict per pair, in order, in batches of the service's ``max_batch`` (sent one after another;
        for concurrency use :meth:`averify_many`). ``deadline`` is not supported by the service and ignored;
        ``backend`` and ``settings`` as in :meth:`verify`."""
        pairs = list(pairs)
        out: list[Verdict] = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start:start + self.batch_size]
            data = self._request("POST", wire.VERIFY_BATCH, wire.batch_body(chunk, backend, settings))
            verdicts = [Verdict.from_dict(v) for v in data["verdicts"]]
            if on_verdicts is not None:
                on_verdicts(list(range(start, start + len(chunk))), verdicts)
            out.extend(verdicts)
        return out

    async def averify(self, task: Task | str, candidate: Candidate | str) -> Verdict:
        return Verdict.from_dict(await self._arequest("POST", wire.VERIFY, wire.verify_body(task, candidate)))

    async def averify_many(self, pairs: Sequence[tuple[Task | str, Candidate | str]]) -> list[Verdict]:
        """One verdict per pair, in order; the batches go out at once (the service queues them)."""
        pairs = list(pairs)
        if self._batch_size is None:
            self._health = await self._arequest("GET", wire.HEALTH)
        size = self.batch_size
        chunks = [pairs[i:i + size] for i in range(0, len(pairs), size)]
        answers = await asyncio.gather(*(self._arequest("POST", wire.VERIFY_BATCH, wire.batch_body(c)) for c in chunks))
        return [Verdict.from_dict(v) for data in answers for v in data["verdicts"]]

    # -- lifetime

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None
        self._async.clear()  # async clients close with their loops; aclose() closes this loop's now

    async def aclose(self) -> None:
        client = self._async.pop(id(asyncio.get_running_loop()), None)
        if client is not None:
            await client.aclose()

    def __enter__(self) -> VerifierClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _final(error: ServiceError | None) -> ServiceError:
    assert error is not None
    if error.code in wire.RETRYABLE:
        return ServiceBusy(error.code, f"{error.message} (still so after the client's retries)", error.status)
    return error
