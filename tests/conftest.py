"""Shared test set-up: a predictable plugin manager, the Triton interpreter on CPU, GPU markers."""

from __future__ import annotations

import os

# Third-party entry points would make registries depend on what is installed; tests opt in.
os.environ.setdefault("KERNELZERO_DISABLE_AUTOLOAD", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
# `python -m core.verify` would judge on a matching running `kernelzero serve` (--server auto): the tests' own calls
# judge in-process unless a test asks otherwise, and the services tests start register in a directory of their own
# rather than the user's (core.serve.registry), where the user's calls would find them.
os.environ.setdefault("KERNELZERO_SERVER", "none")
if "KERNELZERO_TEST_RUNTIME_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["KERNELZERO_TEST_RUNTIME_DIR"] = os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="kz-test-run-")
    atexit.register(shutil.rmtree, os.environ["XDG_RUNTIME_DIR"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before triton is imported anywhere in the test process.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Triton 3.9's interpreter leaves triton.language patched after a direct (grid-less) call of a
    # @jit function; the verifier's workers repair that before any candidate runs, and so does the
    # test process, so that one test's direct call cannot break a later test's GPU-target compile.
    from plugins.backends.triton_gpu_compile import restore_after_device_calls  # noqa: E402

    restore_after_device_calls()


# `make test-e2e`'s tests (marker `e2e`; `make test` leaves them out, CI runs both): the red team and the
# verifier suites that judge many candidates in real sandboxed workers, and the CLIs run as subprocesses.
E2E_PATHS = (
    "tests/redteam/",
    "tests/test_train_e2e.py",
    "tests/test_run_cli.py",
    "tests/test_verify_cli.py",
    "tests/test_warm_verify.py",
    "tests/test_cuda_backend_cli.py",
    "tests/test_propose_cli.py",
    "tests/test_external_plugin.py",
    "tests/test_wheel.py",
    "tests/test_ray.py",
    "tests/test_runtime_guard.py",
    "tests/test_stability_float64.py",
    "tests/test_compare_on_device.py",
    "tests/envs/",
)


def is_e2e(path: str) -> bool:
    """Whether the test file at ``path`` (relative to the repository, / separated) is an e2e one."""
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in E2E_PATHS)


def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    for item in items:
        try:
            rel = item.path.relative_to(root).as_posix()
        except ValueError:
            continue
        if is_e2e(rel):
            item.add_marker(pytest.mark.e2e)
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def plugin_manager():
    """A fresh process-wide plugin manager for one test; the previous one is restored afterwards."""
    from core import plugins

    old = plugins._pm
    pm = plugins.make_plugin_manager(autoload=False)
    plugins.set_plugin_manager(pm)
    yield pm
    plugins.set_plugin_manager(old)


@pytest.fixture
def register_plugin(plugin_manager):
    """Register an in-test plugin object (module or class instance) and undo it afterwards."""
    from core import plugins

    def _register(obj, name=None):
        plugin_manager.register(obj, name=name)
        plugin_manager.check_pending()
        plugins.set_plugin_manager(plugin_manager)  # drop cached registries
        return obj

    return _register
