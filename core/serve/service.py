"""A verification service: an executor (local pools or Ray actors), the dispatcher in front of it, and uvicorn.

``kernelzero serve`` runs one in the foreground (:func:`core.serve.cli.main`); tests and the load benchmark run
one in a background thread with :func:`running_service`::

    with running_service(ServiceConfig(workers=2)) as service:
        client = VerifierClient(service.url)
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from core.serve import wire
from core.serve.app import Activity, ServiceInfo, create_app, is_loopback
from core.serve.dispatch import Dispatcher


@dataclass
class ServiceConfig:
    """Everything ``kernelzero serve`` takes.

    :param workers: sandbox workers (per GPU on CUDA; in all on CPU, where each runs the Triton interpreter).
    :param executor: a registered executor (``local`` or ``ray``); ``executor_options`` are its keyword arguments.
    :param trials, timeout_s, checks, isolate: the verifier's (:class:`core.verify.Verifier`).
    :param token: required of every client when set; without it only loopback clients are answered.
    :param port: 0 picks a free port (the service's ``url`` says which).
    """

    backend: str = "triton"
    device: str = "auto"
    workers: int = 2
    executor: str = "local"
    executor_options: dict[str, Any] = field(default_factory=dict)
    trials: int = 5
    timeout_s: float = 120.0
    checks: list[str] | None = None
    isolate: bool = True
    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    limits: wire.Limits = field(default_factory=wire.Limits)

    def executor_node(self, device: str) -> dict[str, Any]:
        node: dict[str, Any] = {"name": self.executor, **self.executor_options}
        if self.executor == "local":
            node.setdefault("workers_per_gpu" if device == "cuda" else "cpu_workers", self.workers)
        elif self.executor == "ray":
            node.setdefault("workers", self.workers)
        return node

    def verifier_node(self) -> dict[str, Any]:
        node: dict[str, Any] = {"trials": self.trials, "timeout_s": self.timeout_s, "isolate": self.isolate}
        if self.checks:
            node["checks"] = list(self.checks)
        return node

    def settings(self, device: str) -> dict[str, Any]:
        """The settings a request may restate (``wire.SETTINGS``)."""
        return {"trials": self.trials, "timeout_s": self.timeout_s, "checks": self.checks or "all", "device": device}


class VerificationService:
    """The executor, the dispatcher and the ASGI app of one service; :meth:`close` stops them in that order's
    reverse, after every admitted pair has its verdict."""

    def __init__(self, config: ServiceConfig):
        from core.config import resolve_device
        from core.verification.executor import make_executor

        self.config = config
        self.token = config.token or os.environ.get(wire.TOKEN_ENV) or None
        self.device = resolve_device(config.device)
        self.executor = make_executor(config.executor_node(self.device), backend=config.backend, device=self.device,
                                      verifier=config.verifier_node())
        try:
            self.dispatcher = Dispatcher(self.executor, config.limits.max_queue)
            info = ServiceInfo(backend=config.backend, device=self.device, settings=config.settings(self.device),
                               executor=self.executor.describe(), isolation=_isolation(self.executor),
                               extra={"pid": os.getpid(), "isolate": config.isolate})
            self.activity = Activity()
            self.app = create_app(self.dispatcher, info, config.limits, self.token, self.activity)
        except Exception:
            self.executor.close()
            raise
        self.url = ""

    def warnings(self) -> list[str]:
        """Sentences for the operator at start: a public bind without a token answers nobody outside."""
        if not self.token and not is_loopback(_host_address(self.config.host)):
            return [(f"bound to {self.config.host} without a token: only loopback clients are answered; set "
                     f"--token (or {wire.TOKEN_ENV}) to serve other hosts")]
        return []

    def close(self) -> None:
        self.dispatcher.close()
        self.executor.close()


def sandbox_worker_pids(role: str = "candidate", parent_pid: int | None = None) -> list[int]:
    """Process ids of the sandbox workers of ``role`` that ``parent_pid`` (default: this process) started: the
    processes that run candidate code. Operators and the load benchmark use it to see (or kill) them."""
    parent = str(os.getpid() if parent_pid is None else parent_pid)
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "core.verification.worker" in argv and _flag(argv, "--role") == role and _flag(argv, "--parent-pid") == parent:
            found.append(int(entry.name))
    return sorted(found)


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def _isolation(executor: Any) -> str:
    for shard in getattr(executor, "shards", []):
        verifier = getattr(shard, "verifier", None)
        if verifier is not None:
            with contextlib.suppress(Exception):
                return str(verifier.isolation)
    return "in the executor's shard processes"


def _host_address(host: str) -> str:
    with contextlib.suppress(OSError):
        return socket.getaddrinfo(host, None)[0][4][0]
    return host


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port), IPv6 when ``host`` is an IPv6 address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def uvicorn_server(app: Any, log_level: str = "warning") -> Any:
    import uvicorn

    # h11 keeps the dependency set small; connections idle for 30 s are closed; the backlog matches bind()
    config = uvicorn.Config(app, log_level=log_level, http="h11", timeout_keep_alive=30, backlog=2048,
                            access_log=False, lifespan="off")
    return uvicorn.Server(config)


@contextlib.contextmanager
def running_service(config: ServiceConfig, log_level: str = "warning") -> Iterator[VerificationService]:
    """A service serving from a background thread until the block ends (then drained and closed)."""
    service = VerificationService(config)
    try:
        sock = bind(config.host, config.port)
        service.url = url_of(sock)
        server = uvicorn_server(service.app, log_level)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="kz-serve-http", daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not server.started:
            raise RuntimeError(f"the HTTP server did not start on {service.url}")
        try:
            yield service
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            sock.close()
    finally:
        service.close()
