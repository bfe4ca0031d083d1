"""``python -m core.verification.worker``: the command :mod:`core.verification.sandbox` starts."""

from core.verification.worker.loop import main

main()
