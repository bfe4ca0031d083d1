"""A naive in-process judge, the kind the red-team hacks are written against.

It imports the task and the candidate into one process, builds both models from one seed, runs one
seeded trial and accepts when ``torch.allclose`` holds at KernelBench's default tolerances (1e-4 for
fp32, 1e-2 for fp16/bf16). A hack whose header says ``# fools: naive`` must be accepted here: that is
what makes it a real hack and not a strawman.

    python tests/redteam/naive_judge.py TASK.py CANDIDATE.py    # prints {"accepted": ..., "detail": ...}
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch  # noqa: E402

TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 1e-2}


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def judge(task_path: str, candidate_path: str, seed: int = 0) -> tuple[bool, str]:
    task = _load(task_path, "naive_task")
    candidate = _load(candidate_path, "naive_candidate")
    torch.manual_seed(seed)
    init = task.get_init_inputs()
    torch.manual_seed(seed)
    model = task.Model(*init)
    torch.manual_seed(seed)
    model_new = candidate.ModelNew(*init)
    torch.manual_seed(seed)
    inputs = task.get_inputs()
    expected = model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    got = model_new(*inputs)
    expected = expected if isinstance(expected, (tuple, list)) else [expected]
    got = got if isinstance(got, (tuple, list)) else [got]
    if len(expected) != len(got):
        return False, f"{len(got)} outputs, expected {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, got)):
        if not isinstance(g, torch.Tensor) or g.shape != e.shape:
            return False, f"output {i}: shape {getattr(g, 'shape', None)}, expected {tuple(e.shape)}"
        tol = TOLERANCE.get(e.dtype, 1e-4)
        if not torch.allclose(g.to(e.dtype), e, rtol=tol, atol=tol, equal_nan=True):
            return False, f"output {i} differs (max abs {(g.to(e.dtype) - e).abs().max().item():.3g})"
    return True, "allclose on one seeded trial"


if __name__ == "__main__":
    try:
        accepted, detail = judge(sys.argv[1], sys.argv[2])
    except Exception as exc:  # a candidate that raises is simply not accepted
        accepted, detail = False, f"{type(exc).__name__}: {exc}"
    print(json.dumps({"accepted": accepted, "detail": detail}), flush=True)
    os._exit(0)  # a candidate's stray threads must not hold the judge open
