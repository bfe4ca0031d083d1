"""The verification service: the sandboxed verifier over HTTP, for training stacks that are not ours.

``kernelzero serve`` (or ``python -m core.serve``) starts it on the existing executors (local pools, or Ray
actors); :class:`core.serve.client.VerifierClient` calls it with timeouts and retries. The wire (routes,
bodies, error codes) is :mod:`core.serve.wire`; docs/environments.md shows it from each framework.
"""
