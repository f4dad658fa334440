"""The reference model's eager rotary and composite QK norm, op by op: what ``schedules.kernels``
charges them."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from comm_bench.step_model import apply_rotary, rotary_tables
from schedules.kernels import EAGER_QK_NORM, EAGER_ROTARY_LAUNCHES

VIEWS = {"view", "_unsafe_view", "slice", "select", "transpose", "expand", "alias", "detach"}
"""Ops that only make views: no kernel."""
KERNELS_PER_OP = {"slice_backward": 2}
"""CUDA kernels of an op that launches more than one: slice_backward zero-fills the input's
gradient and copies the slice's into it."""


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None) -> Any:  # type: ignore[no-untyped-def]
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _kernels(names: list[str]) -> int:
    return sum(KERNELS_PER_OP.get(name, 1) for name in names if name not in VIEWS)


def test_the_eager_rotary_launches_what_the_kernel_inventory_charges() -> None:
    cos, sin = rotary_tables(16, 8)
    x = torch.randn(1, 4, 16, 8, dtype=torch.bfloat16, requires_grad=True)
    with _Ops() as forward:
        y = apply_rotary(x, cos, sin)
    grad = torch.ones_like(y)
    with _Ops() as backward:
        y.backward(grad)
    # per tensor: 2 casts of the tables, 4 mul, sub, add, stack; backward 4 mul, neg, 3 add and
    # two slice_backward; Q and K each
    assert _kernels(forward.names) == 9
    assert _kernels(backward.names) == 12
    counted = {"forward": 2.0 * _kernels(forward.names), "backward": 2.0 * _kernels(backward.names)}
    assert counted == EAGER_ROTARY_LAUNCHES


def _bytes_per_element(ops: list[tuple[str, int]], elements: int) -> float:
    return sum(size for _, size in ops) / elements


class _Traffic(TorchDispatchMode):
    """Each op and the bytes it reads and writes in tensors of the normed size (row statistics
    and the d-wide weight are too small to count)."""

    def __init__(self, elements: int) -> None:
        super().__init__()
        self.elements = elements
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None) -> Any:  # type: ignore[no-untyped-def]
        from torch.utils._pytree import tree_flatten

        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            tensors = [
                t
                for t in (*tree_flatten((args, kwargs))[0], *tree_flatten(out)[0])
                if isinstance(t, torch.Tensor) and t.numel() >= self.elements // 4
            ]
            self.ops.append((name, sum(t.numel() * t.element_size() for t in tensors)))
        return out


def test_the_composite_qk_norm_moves_and_launches_what_the_inventory_charges() -> None:
    """An RMSNorm over d channels with fp32 weights, fed a bf16 projection under autocast, runs
    torch's composite (the fused kernel needs matching dtypes): its passes, op by op, give
    ``EAGER_QK_NORM``'s bytes and (with the memset the weight-gradient sum starts with on a GPU)
    its launches, for the query and the key norm."""
    import warnings

    shape = (2, 64, 4, 32)
    elements = 2 * 64 * 4 * 32
    norm = torch.nn.RMSNorm(32)  # fp32 weights, as the reference loop keeps them
    x = torch.randn(shape, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(shape, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own note that it cannot use the fused kernel
        with torch.autocast("cpu", torch.bfloat16), _Traffic(elements) as forward:
            y = norm(x)
        with _Traffic(elements) as backward:
            y.backward(grad)
    assert y.dtype == torch.bfloat16 and x.grad is not None
    forward_bytes, backward_bytes = EAGER_QK_NORM["bytes"]
    assert _bytes_per_element(forward.ops, elements) == forward_bytes == 40
    assert _bytes_per_element(backward.ops, elements) == backward_bytes == 108
    memsets = 1  # the weight gradient's sum over every row zeroes its output first (H200 trace)
    launches = {"forward": len(forward.ops), "backward": len(backward.ops) + memsets}
    assert launches == {"forward": 8, "backward": 17}
    assert EAGER_QK_NORM["launches"] == (2.0 * launches["forward"], 2.0 * launches["backward"])
