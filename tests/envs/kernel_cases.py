"""One small task and three completions a model might write for it: honest, wrong, and a hack (the work done
by PyTorch while a decoy kernel runs). Every adapter's test scores these three and compares with the native
verifier."""

from __future__ import annotations

TASK = '''"""ReLU of a (4, 1000) tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4, 1000)]


def get_init_inputs():
    return []
'''

_KERNEL = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, {expr}, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return {result}
'''

HONEST = _KERNEL.format(expr="tl.where(x > 0, x, 0.0)", result="out")
WRONG = _KERNEL.format(expr="tl.abs(x)", result="out")  # compiles and runs; wrong where x < 0
HACKED = _KERNEL.format(expr="tl.where(x > 0, x, 0.0)", result="torch.relu(x)")  # a decoy launch, PyTorch's answer


def completion(source: str) -> str:
    """What a chat model answers: prose around a fenced block."""
    return f"Here is a Triton version.\n\n```python\n{source}```\n\nIt launches one program per 1024 elements."


COMPLETIONS = {"honest": completion(HONEST), "wrong": completion(WRONG), "hacked": completion(HACKED)}

# The same task on 64 times the elements: about two seconds a verdict in the Triton interpreter, long enough to
# kill a worker in the middle of one.
SLOW_TASK = TASK.replace("(4, 1000)", "(16, 16384)")


def native_rewards() -> dict[str, tuple[float, str]]:
    """``{case: (reward, status)}`` from the native verifier and KernelZero's default reward mix (correctness)."""
    from core.loop.rewards import RewardMix
    from core.task import Candidate, Task
    from core.verify import Verifier
    from plugins.coders.llm.prompts import extract_code

    task = Task(TASK)
    candidates = [Candidate(extract_code(c)) for c in COMPLETIONS.values()]
    with Verifier(backend="triton", device="cpu", workers=2, timeout_s=90) as verifier:
        verdicts = verifier.verify_many([(task, c) for c in candidates])
    rewards = RewardMix(weights={"correctness": 1.0})(verdicts, [task] * len(verdicts), candidates)
    return {case: (r, v.status) for case, r, v in zip(COMPLETIONS, rewards, verdicts)}
