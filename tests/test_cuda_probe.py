"""core.api.devices.cuda_visible: whether torch could run on a GPU, asked before torch is imported.

A one-shot ``core.verify --device cuda`` spawns its workers only after its backend says the device is
supported; that question imported torch (3.6 s on the H100 host, 2026-12-07) and the workers spawned 4.6 s
after the call began. These run in fresh interpreters, where torch is not imported yet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _fresh(code: str, env_extra: dict[str, str] | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, text=True, capture_output=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", ["triton", "cuda", "cuda_inline"])
def test_a_backend_answers_for_the_gpu_without_importing_torch(backend):
    got = _fresh(f"""
import json, sys
from core.plugins import registry
answer = registry("backend").create({backend!r}).supports("cuda")
print(json.dumps({{"torch": "torch" in sys.modules, "answer": answer}}))
""")
    assert got["torch"] is False
    import torch

    if not torch.cuda.is_available():  # this machine: the same answer torch gives, a reason
        assert got["answer"]


def test_the_probe_agrees_with_torch_here_and_hides_devices_as_torch_does():
    import torch

    code = """
import json, sys
from core.api.devices import cuda_visible, driver_device_count
print(json.dumps({"visible": cuda_visible(), "count": driver_device_count(), "torch": "torch" in sys.modules}))
"""
    got = _fresh(code)
    assert got["torch"] is False and got["visible"] is torch.cuda.is_available()
    hidden = _fresh(code, {"CUDA_VISIBLE_DEVICES": ""})
    assert hidden == {"visible": False, "count": 0, "torch": False}


def test_auto_resolves_without_importing_torch():
    import torch

    got = _fresh("""
import json, sys
from core.config import resolve_device
print(json.dumps({"device": resolve_device("auto"), "torch": "torch" in sys.modules}))
""")
    assert got == {"device": "cuda" if torch.cuda.is_available() else "cpu", "torch": False}


def test_once_torch_is_imported_its_answer_is_the_probes(monkeypatch):
    # what the driver probe cannot see (a driver too old for torch's CUDA), torch's own answer says
    import torch

    from core.api.devices import cuda_visible

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_visible() is True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_visible() is False


def test_the_judge_asks_the_backend_again_once_torch_is_imported(monkeypatch):
    # the probe said yes before the workers spawned; torch says no (a driver too old for its CUDA): a clear
    # configuration error, and no worker left behind
    from core.plugins import registry
    from core.verification import judge
    from core.verify import Verifier, VerifierConfigError

    answers = iter([None, "backend 'triton' on device 'cuda' needs a GPU; none is visible"])
    backend_type = type(registry("backend").create("triton"))
    monkeypatch.setattr(backend_type, "supports", lambda self, device: next(answers))
    closed = []
    real_pool = judge.WorkerPool

    class CountingPool(real_pool):
        def close(self) -> None:
            closed.append(self.role)
            super().close()

    monkeypatch.setattr(judge, "WorkerPool", CountingPool)
    with pytest.raises(VerifierConfigError, match="needs a GPU"):
        Verifier(backend="triton", device="cuda", workers=1, warm_up=False)
    assert sorted(closed) == ["candidate", "reference"]
