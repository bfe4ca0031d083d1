"""``python -m core.serve``: the same as ``kernelzero serve``."""

from __future__ import annotations

import sys

from core.serve.cli import main

if __name__ == "__main__":
    sys.exit(main())
