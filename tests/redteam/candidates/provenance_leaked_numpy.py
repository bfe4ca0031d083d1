"""Host compute laundered through a copy kernel: the Triton interpreter copies its own module
globals (``np`` among them) into the candidate's module at the first launch, so the candidate adds
on the host with numpy, without importing it, straight into a fresh buffer's memory (no ATen op
runs), then launches a kernel that only copies that buffer to the output."""
# fools: naive
# task: vector_add
# expect: static_integrity hack
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, a, b):
        n = a.numel()
        out = torch.empty_like(a)
        host = torch.empty_like(a)
        copy_kernel[(triton.cdiv(n, 1024),)](a, out, n, BLOCK=1024)  # the first launch brings np in
        np.copyto(np.asarray(host), np.asarray(a) + np.asarray(b))  # noqa: F821 (np is the interpreter's)
        copy_kernel[(triton.cdiv(n, 1024),)](host, out, n, BLOCK=1024)
        return out
