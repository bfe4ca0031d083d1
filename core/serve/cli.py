"""``kernelzero serve`` / ``python -m core.serve``: the verification service in the foreground.

The ``kernelzero`` script is :func:`kernelzero`: ``kernelzero serve ...`` runs the service, anything else is the
training job (``core.run``, Hydra overrides) as before.

Once it answers, the service registers itself in this user's runtime directory (:mod:`core.serve.registry`;
``--no-register``: not), so ``python -m core.verify`` finds it; the entry goes when it stops. ``--idle-exit S``
stops it after S seconds without a request (``core.verify --keep-warm`` starts it so).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from core.serve import wire


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kernelzero serve",
        description="Serve the sandboxed verifier over HTTP: POST /v1/verify, /v1/verify/batch; GET /health, /metrics.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port, printed at start)")
    p.add_argument("--backend", default="triton")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--workers", type=int, default=2, help="sandbox workers (per GPU on CUDA)")
    p.add_argument("--executor", default="local", help="a registered executor: local (this machine) or ray")
    p.add_argument("--executor-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an executor keyword argument, e.g. address=ray://head:10001 (YAML value)")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per verification")
    p.add_argument("--checks", default=None, help="comma-separated check names (default: all that apply)")
    p.add_argument("--no-isolate", action="store_true", help="skip namespaces (limits + audit hook only)")
    p.add_argument("--token-file", type=Path, help=f"file holding the token clients must send (or set {wire.TOKEN_ENV}); "
                   "without a token only loopback clients are answered")
    defaults = wire.Limits()
    p.add_argument("--max-queue", type=int, default=defaults.max_queue, help="pairs waiting or running; more: 503 busy")
    p.add_argument("--max-batch", type=int, default=defaults.max_batch, help="pairs per request at most")
    p.add_argument("--max-body-kb", type=int, default=defaults.max_body_bytes // 1024)
    p.add_argument("--max-source-kb", type=int, default=defaults.max_source_bytes // 1024)
    p.add_argument("--log-level", default="info")
    p.add_argument("--idle-exit", type=float, default=0.0, metavar="SECONDS",
                   help="stop after SECONDS without a request (0: never)")
    p.add_argument("--no-register", action="store_true", help="do not register in this user's runtime directory "
                   "(python -m core.verify --server auto then does not find this service)")
    return p


def config_from(args: argparse.Namespace):  # -> ServiceConfig
    import yaml

    from core.serve.service import ServiceConfig

    options = {}
    for item in args.executor_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--executor-option {item!r}: expected KEY=VALUE")
        options[key] = yaml.safe_load(value)
    token = args.token_file.read_text().strip() if args.token_file else os.environ.get(wire.TOKEN_ENV) or None
    if args.token_file and not token:
        raise ValueError(f"--token-file {args.token_file} is empty")
    limits = wire.Limits(max_body_bytes=args.max_body_kb * 1024, max_source_bytes=args.max_source_kb * 1024,
                         max_batch=args.max_batch, max_queue=args.max_queue)
    return ServiceConfig(backend=args.backend, device=args.device, workers=args.workers, executor=args.executor,
                         executor_options=options, trials=args.trials, timeout_s=args.timeout,
                         checks=[c.strip() for c in args.checks.split(",")] if args.checks else None,
                         isolate=not args.no_isolate, host=args.host, port=args.port, token=token, limits=limits)


def main(argv: list[str] | None = None) -> int:
    from core.cli import cannot_start

    args = parser().parse_args(argv)
    with cannot_start(ValueError, OSError):
        from core.serve.service import VerificationService, bind, url_of, uvicorn_server

        config = config_from(args)
        sock = bind(config.host, config.port)  # before the pools start: a taken port fails in a second
        service = VerificationService(config)
    service.url = url_of(sock)
    for warning in service.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    access = "token required" if service.token else "loopback clients only (no token)"
    print(f"kernelzero serve: {service.url} ({service.executor.describe()}; {access})", file=sys.stderr, flush=True)
    # uvicorn answers what it accepted, then raises the signal again: SIGINT becomes KeyboardInterrupt and SIGTERM
    # SystemExit here, so the admitted pairs drain and the workers stop below either way
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = uvicorn_server(service.app, args.log_level)
    registered: list[Path] = []
    threading.Thread(target=_while_serving, args=(server, service, args, registered), name="kz-serve-registry",
                     daemon=True).start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        _unregister(registered)  # first: no new client picks a service that is stopping
        print("kernelzero serve: draining admitted requests, then stopping the workers", file=sys.stderr, flush=True)
        service.close()
        sock.close()
    return 0


def _while_serving(server, service, args: argparse.Namespace, registered: list[Path]) -> None:
    """Once uvicorn answers: register (unless ``--no-register``); then, with ``--idle-exit``, stop the server
    after that many seconds without a request."""
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.05)
    if not args.no_register:
        from core.serve import registry

        try:
            registered.append(registry.register(registry_entry(service, args)))
        except OSError as exc:  # RegistryError among them: serve on, unregistered
            print(f"warning: not registered, so core.verify --server auto will not find this service: {exc}",
                  file=sys.stderr, flush=True)
    if args.idle_exit > 0:
        while not server.should_exit:
            if service.activity.idle_s() >= args.idle_exit:
                print(f"kernelzero serve: no request for {args.idle_exit:g} s (--idle-exit); stopping",
                      file=sys.stderr, flush=True)
                _unregister(registered)
                server.should_exit = True
                return
            time.sleep(min(1.0, args.idle_exit / 4))


def _unregister(registered: list[Path]) -> None:
    while registered:
        try:
            registered.pop().unlink()
        except OSError:
            pass


def registry_entry(service, args: argparse.Namespace):  # -> registry.Entry
    """What this service registers: how to reach it and what it judges with (``registry.MATCHED``)."""
    from core.serve import registry

    url = service.url
    for unspecified, loopback in (("//0.0.0.0:", "//127.0.0.1:"), ("//[::]:", "//[::1]:")):
        url = url.replace(unspecified, loopback)  # bound to every address: reached on loopback
    config = service.config
    return registry.Entry(url=url, pid=os.getpid(), backend=config.backend, device=service.device,
                          checks=registry.normal_checks(config.checks), trials=config.trials,
                          timeout_s=float(config.timeout_s), isolate=config.isolate, executor=config.executor,
                          code=registry.code_fingerprint(), token_required=bool(service.token),
                          idle_exit_s=float(args.idle_exit), workers=config.workers,
                          log=os.environ.get("KERNELZERO_SERVE_LOG"))


def kernelzero(argv: list[str] | None = None) -> None:
    """The ``kernelzero`` console script: ``serve`` runs the service; everything else is ``core.run``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        sys.exit(main(argv[1:]))
    from core.run import main as run_main

    run_main()
