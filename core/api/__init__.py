"""The public contract of KernelZero: everything a plugin author, built-in or third-party, may import.

Besides core's top-level modules (``core`` for ``hookimpl``, :mod:`core.hookspecs`, :mod:`core.contracts`,
the data model :mod:`core.task`, :mod:`core.verdict`, :mod:`core.program`, and :mod:`core.plugins` for
``registry``), a plugin imports only these modules:

- :mod:`core.api.evidence`  what a check decides from: ``Evidence``, ``Trial``, stage order, finding prefixes
- :mod:`core.api.session`   the session a worker-side check's ``prepare``/``collect`` receives
- :mod:`core.api.policy`    the static policy a backend declares (``StaticPolicy``)
- :mod:`core.api.numerics`  inputs drawn by seed, output comparison and tolerances, the float64 truth
- :mod:`core.api.devices`   GPU facts from the device registry: the reference GPU, the visible one, SMs, arch;
                            whether torch could run on a GPU here, asked without importing torch
- :mod:`core.api.sandbox`   what a backend declares the sandbox needs of its toolchain (`SandboxNeeds`)
- :mod:`core.api.tasks`     a task's memory footprint (for a check that sizes workers of its own)
- :mod:`core.api.workers`   sandboxed workers and the GPU lock, for a check that runs work of its own
- :mod:`core.api.executor`  the executor base (shards, scheduling) an executor plugin implements
- :mod:`core.api.timing`    the timer base: what a timing method provides

The engine, ``core.verification``, is private: these modules are its public face, and
``tests/test_architecture.py`` keeps every plugin to them. What two plugin groups share belongs here.
"""
