"""Layout ops lowered to views in ``forward`` (no data moves), or a strided copy kernel and a view
when PyTorch's reshape would have to copy (a flatten of a transposed tensor, say)."""

from __future__ import annotations

from plugins.coders.expert_lowering.codegen import Kernel, value_name
from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.plan import Group, Plan

COPY_HELPER = '''@triton.jit
def _strided_copy(src, dst, numel, D1, D2, D3, D4, D5, S0, S1, S2, S3, S4, S5, BLOCK: tl.constexpr):
    # dst (contiguous) <- src (any strides), as a rank-6 index space.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    i5 = offs % D5
    rem = offs // D5
    i4 = rem % D4
    rem = rem // D4
    i3 = rem % D3
    rem = rem // D3
    i2 = rem % D2
    rem = rem // D2
    i1 = rem % D1
    i0 = rem // D1
    x = tl.load(src + i0 * S0 + i1 * S1 + i2 * S2 + i3 * S3 + i4 * S4 + i5 * S5, mask=mask)
    tl.store(dst + offs, x, mask=mask)


def _view_or_copy(x, shape):
    """``x.reshape(shape)`` without PyTorch compute: a view when the strides allow, else a kernel copy."""
    try:
        return x.view(shape)
    except RuntimeError:
        pass
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    pad = 6 - x.dim()
    sizes = [1] * pad + list(x.shape)
    strides = [0] * pad + list(x.stride())
    block = 1024 if x.is_cuda else 16384
    _strided_copy[(max(1, triton.cdiv(x.numel(), block)),)](x, y, x.numel(), *sizes[1:], *strides, BLOCK=block)
    return y.view(shape)
'''


def view_expr(plan: Plan, value: int) -> str:
    node = plan.node(value)
    x = value_name(node.args[0], len(plan.program.inputs))
    rank = len(plan.shapes[node.args[0]])
    if rank > 6 or len(plan.shapes[value]) > 6:
        raise Unsupported(f"{node.op} of a rank-{rank} tensor (the copy kernel handles rank <= 6)")
    if node.op == "transpose":
        return f"{x}.transpose(-1, -2)"
    if node.op == "permute":
        dims = tuple(int(d) for d in node.params["dims"])
        return f"{x}.permute{dims!r}"
    if node.op in ("flatten", "split_last", "reshape"):
        return f"_view_or_copy({x}, s{value})"
    if node.op == "expand":
        return f"{x}.expand(s{value})"
    raise Unsupported(f"layout op {node.op!r} has no lowering")


def view_kernel(plan: Plan, group: Group, index: int) -> Kernel:
    """No kernel: the view is made in ``forward``; the copy helper is included for reshapes."""
    value = group.anchor
    node = plan.node(value)
    helpers = {"_strided_copy"} if node.op in ("flatten", "split_last", "reshape") else set()
    return Kernel("", "", [f"v{value} = {view_expr(plan, value)}"], helpers)
