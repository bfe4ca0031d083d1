"""``python -m core.verify``'s way to a warm verifier: which running ``kernelzero serve`` may judge this call
(``--server auto``), and starting one that outlives the call (``--keep-warm SECONDS``).

A fresh ``core.verify`` process starts its own sandbox pools, and on a GPU that start-up (torch, CUPTI, the
``torch.compile`` baseline) is most of its wall time; through a running service a call pays none of it
(docs/benchmarks.md has the measured figures). So ``--server`` defaults to ``auto``, unless ``KERNELZERO_SERVER``
says otherwise (``none``, ``auto`` or a URL; ``--server`` on the command line wins over it). Why that default
is safe:

* A verdict never silently comes from a service that judges otherwise. ``auto`` takes only a service whose
  registered settings (:data:`core.serve.registry.MATCHED`: backend, device as resolved, checks, trials,
  timeout, isolation, executor, and a fingerprint of the judging code and plugins) equal what this call would
  judge with in its own process, defaults included; its ``GET /health`` must say the same, from the registered
  pid; and the request restates the settings, so a service that judges otherwise refuses it. A service started
  before a file of ``core/`` or ``plugins/`` was edited no longer matches.
* Same user only. The registry is a private directory (0700, this user's, else refused), and an entry counts
  only while its pid is a live ``kernelzero serve`` process of this user that started when the entry says.
* Nothing breaks without one. When no service matches, the call judges in its own process as before and says
  so on stderr in one line, with the command that makes the next call fast. ``--server none`` (or
  ``KERNELZERO_SERVER=none``) judges in-process without looking; a benchmark of cold calls sets it.
* A named URL (``--server URL``) keeps its meaning: that service's settings apply, and only the settings given
  on the command line are restated (a mismatch is exit 2, as before).

Candidate code never runs in the calling process either way: a service judges in its own sandboxed workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import Any

from core.serve import registry

ENV = "KERNELZERO_SERVER"
TOKEN_ENV = "KERNELZERO_SERVE_TOKEN"  # core.serve.wire.TOKEN_ENV, without importing the wire's dependencies
START_TIMEOUT_S = 120.0  # --keep-warm waits this long for the service it started, then judges in-process
LOGS_KEPT = 20


def server_mode(flag: str | None) -> str:
    """``auto``, ``none`` or a URL: ``--server`` if given, else ``KERNELZERO_SERVER``, else ``auto``."""
    source = "--server" if flag is not None else ENV
    value = (flag if flag is not None else os.environ.get(ENV, "")).strip() or "auto"
    if value.lower() in ("auto", "none"):
        return value.lower()
    if value.startswith(("http://", "https://")):
        return value
    raise ValueError(f"{source}={value!r}: expected auto, none or a service's URL (http://HOST:PORT)")


@dataclass(frozen=True)
class Wanted:
    """What one call would judge with in its own process: a service must match all of it."""

    backend: str
    device: str  # resolved: cpu or cuda
    checks: tuple[str, ...] | None
    trials: int
    timeout_s: float
    isolate: bool
    code: str
    executor: str = "local"

    @classmethod
    def of(cls, backend: str, device: str, checks: list[str] | None, trials: int, timeout_s: float,
           isolate: bool) -> Wanted:
        from core.config import resolve_device

        normal = registry.normal_checks(checks)
        return cls(backend=backend, device=resolve_device(device), checks=tuple(normal) if normal else None,
                   trials=int(trials), timeout_s=float(timeout_s), isolate=bool(isolate),
                   code=registry.code_fingerprint())

    def settings(self) -> dict[str, Any]:
        return {"backend": self.backend, "device": self.device, "checks": list(self.checks) if self.checks else None,
                "trials": self.trials, "timeout_s": self.timeout_s, "isolate": self.isolate,
                "executor": self.executor, "code": self.code}

    def request_settings(self) -> dict[str, Any]:
        """All of them restated in each request (``core.serve.wire.SETTINGS``): the service checks them too."""
        return {"trials": self.trials, "timeout_s": self.timeout_s, "device": self.device,
                "checks": list(self.checks) if self.checks else "all"}

    def describe(self) -> str:
        return (f"backend {self.backend}, device {self.device}, checks {','.join(self.checks or ['all'])}, "
                f"trials {self.trials}, timeout {self.timeout_s:g} s{'' if self.isolate else ', --no-isolate'}")

    def serve_args(self, workers: int, idle_exit_s: float | None = None) -> list[str]:
        """``kernelzero serve``'s arguments for a service that matches (loopback, any free port)."""
        return ["--port", "0", "--backend", self.backend, "--device", self.device, "--workers", str(workers),
                *(["--checks", ",".join(self.checks)] if self.checks else []),
                "--trials", str(self.trials), "--timeout", f"{self.timeout_s:g}",
                *([] if self.isolate else ["--no-isolate"]),
                *(["--idle-exit", f"{idle_exit_s:g}"] if idle_exit_s else [])]


def health(url: str, token: str | None, timeout_s: float = 5.0) -> dict[str, Any]:
    """``GET /health`` of ``url`` (standard library: no client package needed to look); OSError if no answer."""
    import json
    import urllib.request

    request = urllib.request.Request(url.rstrip("/") + "/health",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        return json.loads(answer.read())


def health_problem(info: dict[str, Any], entry: registry.Entry, wanted: Wanted) -> str | None:
    """Why a service's own ``/health`` rules it out for ``wanted`` (None: it does not)."""
    if not info.get("ready"):
        return "it is stopping"
    if info.get("pid", entry.pid) != entry.pid:
        return f"another process (pid {info.get('pid')}) answers at {entry.url}"
    said = info.get("settings") or {}
    checks = said.get("checks")
    have = {"backend": info.get("backend"), "device": info.get("device"), "trials": said.get("trials"),
            "timeout_s": said.get("timeout_s"), "checks": None if checks == "all" else checks,
            "isolate": info.get("isolate", entry.isolate)}
    diff = registry.differences(have, {k: v for k, v in wanted.settings().items() if k in have})
    return f"its /health says {', '.join(diff)}" if diff else None


def find(wanted: Wanted, token: str | None = None) -> tuple[registry.Entry | None, list[str]]:
    """The newest live, healthy, registered service that judges as ``wanted``; else None and why each was not."""
    reasons = []
    for entry in registry.entries():
        diff = registry.differences(entry.settings(), wanted.settings())
        if diff:
            reasons.append(f"pid {entry.pid} judges with {', '.join(diff)}")
            continue
        if entry.token_required and not token:
            reasons.append(f"pid {entry.pid} needs a token ({TOKEN_ENV})")
            continue
        try:
            problem = health_problem(health(entry.url, token), entry, wanted)
        except (OSError, ValueError, HTTPException) as exc:
            problem = f"/health did not answer ({exc})"
        if problem is None:
            return entry, reasons
        reasons.append(f"pid {entry.pid}: {problem}")
    return None, reasons


def hint(wanted: Wanted, workers: int, reasons: list[str]) -> str:
    """The one line a call that found no warm service prints: what it looked for and how to have one."""
    others = f" ({'; '.join(reasons)})" if reasons else ""
    return (f"judging in this process: no running kernelzero serve judges with {wanted.describe()}{others}. "
            f"For fast calls add --keep-warm 900, or run: {sys.executable} -m core.serve "
            f"{' '.join(wanted.serve_args(workers))} &")


def start(wanted: Wanted, keep_warm_s: float, workers: int, token: str | None = None,
          wait_s: float = START_TIMEOUT_S) -> tuple[registry.Entry | None, str]:
    """A service for ``wanted`` that stops after ``keep_warm_s`` seconds without a request, started in the
    background (its own session, its log in the runtime directory) unless another call started one meanwhile;
    ``(entry, what happened)``, or ``(None, why not)`` once ``wait_s`` has passed or it failed."""
    directory = registry.runtime_dir()
    began = time.monotonic()
    with registry.spawn_lock(directory, wait_s) as held:
        if not held:
            return None, f"another call has been starting a service for {wait_s:g} s"
        entry, _ = find(wanted, token)  # started by the call that held the lock before this one
        if entry is not None:
            return entry, f"found the warm service that another call started (pid {entry.pid}, {entry.url})"
        proc, log = _spawn(directory, wanted.serve_args(workers, keep_warm_s))
        entry, problem = _wait_for(proc, log, wanted, token, began + wait_s)
    if entry is None:
        return None, problem
    return entry, (f"started a warm service in {time.monotonic() - began:.1f} s (pid {entry.pid}, {entry.url}, "
                   f"log {log}); it stops after {keep_warm_s:g} s without a request")


def _spawn(directory: Path, args: list[str]) -> tuple[subprocess.Popen, Path]:
    import core

    _prune_logs(directory)
    log = directory / f"serve-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    root = str(Path(core.__file__).resolve().parent.parent)  # the service imports this call's core
    env = {**os.environ, "KERNELZERO_SERVE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "core.serve", "--log-level", "warning", *args],
                                stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd=root, env=env,
                                start_new_session=True, close_fds=True)
    finally:
        os.close(fd)
    return proc, log


def _wait_for(proc: subprocess.Popen, log: Path, wanted: Wanted, token: str | None,
              deadline: float) -> tuple[registry.Entry | None, str]:
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return None, (f"the service it started exited with status {code} before it answered: {_tail(log)} "
                          f"(log {log})")
        entry = next((e for e in registry.entries(cleanup=False) if e.pid == proc.pid), None)
        if entry is not None:
            diff = registry.differences(entry.settings(), wanted.settings())
            if diff:
                return None, f"the service it started (pid {proc.pid}) judges with {', '.join(diff)}"
            try:
                if health_problem(health(entry.url, token), entry, wanted) is None:
                    return entry, ""
            except (OSError, ValueError, HTTPException):
                pass
        time.sleep(0.05)
    return None, (f"the service it started (pid {proc.pid}) did not answer in time; it goes on starting in the "
                  f"background, for the next calls (log {log})")


def _tail(log: Path, lines: int = 3) -> str:
    try:
        text = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    return " | ".join(text[-lines:])[-400:] or "an empty log"


def _prune_logs(directory: Path) -> None:
    """Keep the newest :data:`LOGS_KEPT` service logs of the runtime directory."""
    def mtime(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0

    for old in sorted(directory.glob("serve-*.log"), key=mtime, reverse=True)[LOGS_KEPT:]:
        try:
            old.unlink()
        except OSError:
            pass
