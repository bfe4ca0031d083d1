"""``kernelzero serve`` / ``python -m core.serve``: the verification service in the foreground.

The ``kernelzero`` script is :func:`kernelzero`: ``kernelzero serve ...`` runs the service, anything else is the
training job (``core.run``, Hydra overrides) as before.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
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
    try:
        uvicorn_server(service.app, args.log_level).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        print("kernelzero serve: draining admitted requests, then stopping the workers", file=sys.stderr, flush=True)
        service.close()
        sock.close()
    return 0


def kernelzero(argv: list[str] | None = None) -> None:
    """The ``kernelzero`` console script: ``serve`` runs the service; everything else is ``core.run``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        sys.exit(main(argv[1:]))
    from core.run import main as run_main

    run_main()
