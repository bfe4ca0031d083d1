"""Evaluation: suites (KernelBench layout), the held-out wall, the verdict cache and the report."""
