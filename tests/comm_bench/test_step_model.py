"""The reference model's eager rotary, op by op: the launches ``schedules.kernels`` charges it."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from comm_bench.step_model import apply_rotary, rotary_tables
from schedules.kernels import EAGER_ROTARY_LAUNCHES

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
