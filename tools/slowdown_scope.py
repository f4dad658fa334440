"""Which kernels does the multi-GPU in-step slowdown stand for? A leave-one-source-out test.

The compute model's in-step slowdown (``sim.compute.compute_model.IN_STEP_SLOWDOWN``) scales
every kernel of a multi-GPU step and the gaps between them. A mechanism behind it would slow
only some of them: the power cap lowers the SM clock, which tensor-core kernels feel and
memory-bound kernels hardly do; a per-kernel cost would grow with the kernel count, not with
the time. This script restricts the factor to one class and reruns ``commsim validate
--leave-one-source-out`` with it (each source scored with the factor fitted on the others): a
scope that stands for the missing time better scores better there, and its per-run values
spread less.

    python tools/slowdown_scope.py --scope gemm             # one scope, about 4 min here
    python tools/slowdown_scope.py --scope all --scope memory -j 2

Scopes: ``all`` (the shipped model), ``gemm`` (GEMMs only), ``tensor`` (GEMMs and fused
attention), ``memory`` (memory-bound kernels and the small kernels' fixed cost), ``per_kernel``
(none of the kernels' time: the factor s adds s x ``PER_KERNEL_S`` to the gap before every
launch). A GEMM's or attention kernel's memory term (where its bytes outlast its FLOPs) takes
the memory-bound part's factor, as its time is then the memory system's. The restriction
patches ``ComputeModel`` for this process and the worker processes it forks; it is a test of
the defaults, not an option of the model.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from refdata import CASES_PATH
from schedules.kernels import Kernel
from sim.compute.compute_model import (
    SMALL_KERNEL_S,
    ComputeModel,
    attention_head_dim_factor,
    gemm_alignment,
)
from sim.validation.cases import load_cases
from sim.validation.loso import REFERENCE_SLOWDOWN, leave_one_source_out

SCOPES = ("all", "gemm", "tensor", "memory", "per_kernel")
PER_KERNEL_S = 500e-6
"""Gap per launch that a slowdown of 1.0 stands for under ``per_kernel``: the refit searches
0-1 (``sim.validation.loso.SLOWDOWN_RANGE``), so 0-500 us a launch, above any run's need (a
step time is linear in it, so the leave-one-source-out interpolation is exact)."""
SLOWED = {
    "gemm": {"gemm"},
    "tensor": {"gemm", "attention"},
    "memory": {"memory", "small"},
    "per_kernel": set(),
}
"""Scope -> the parts of the compute stream the factor scales."""


SHIPPED = {
    name: getattr(ComputeModel, name) for name in ("memory_time_s", "kernel_time_s", "run_s")
}
"""The model's own methods: ``all`` runs them, so its figure is the shipped model's."""


def restrict(scope: str) -> None:
    """Patch ``ComputeModel`` so that the in-step slowdown scales only ``SLOWED[scope]`` (the
    patched ``kernel_time_s`` and ``run_s`` copy the shipped formulas with a factor per part)."""
    if scope == "all":
        for name, method in SHIPPED.items():
            setattr(ComputeModel, name, method)
        return
    slowed = SLOWED[scope]

    def factor(model: ComputeModel, part: str) -> float:
        return model.time_factor if part in slowed else model.calibration.time_scale

    def memory_time_s(
        self: ComputeModel, num_bytes: float, memory_class: str = "", *, converts: bool = True
    ) -> float:
        rate = self.memory_bandwidth_bytes_per_s(memory_class, converts=converts)
        return num_bytes / rate * factor(self, "memory")

    def kernel_time_s(self: ComputeModel, kernel: Kernel) -> float:
        # ComputeModel.kernel_time_s with each part's own factor
        small_s = kernel.small_kernels * SMALL_KERNEL_S * factor(self, "small")
        if kernel.kind == "memory":
            return small_s + self.memory_time_s(
                kernel.bytes, kernel.memory_class, converts=kernel.converts
            )
        fit = self.kernel_fit(kernel.kind, kernel.dtype, kernel.backend)
        if kernel.kind == "gemm":
            scale = factor(self, "gemm") / gemm_alignment(kernel.dims, kernel.dtype)
        else:
            scale = factor(self, "attention") / attention_head_dim_factor(
                kernel.head_dim, kernel.kind, kernel.backend, self.gpu.family
            )
        compute_s = fit.time_s(kernel.flops, kernel.dims) * scale
        return small_s + max(compute_s, fit.latency_s * scale + self.memory_time_s(kernel.bytes))

    def run_s(self: ComputeModel, kernels: tuple[Kernel, ...], loop: str) -> float:
        launches = self.launch_count(kernels, loop)
        extra = self.in_step_slowdown * PER_KERNEL_S if scope == "per_kernel" else 0.0
        return self.price(kernels) + launches * (self.kernel_gap_s * factor(self, "gap") + extra)

    ComputeModel.memory_time_s = memory_time_s  # type: ignore[method-assign]
    ComputeModel.kernel_time_s = kernel_time_s  # type: ignore[method-assign]
    ComputeModel.run_s = run_s  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scope", action="append", choices=SCOPES, required=True)
    parser.add_argument("-j", "--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    cases = load_cases(CASES_PATH)
    for scope in args.scope:
        restrict(scope)
        report = leave_one_source_out(cases, jobs=args.jobs)
        summary = report.summary()
        print(f"scope {scope}: leave-one-source-out MAPE {summary['all']['mape']:.1%}")
        for source, figures in summary.items():
            if source != "all":
                print(
                    f"  {source:<14} factor {figures['in_step_slowdown']:.3f}"
                    f"  MAPE {figures['mape']:.1%}"
                )
        for family in ("ampere", "hopper"):
            needed = [
                REFERENCE_SLOWDOWN
                * (line.measured_s - line.without_s)
                / (line.at_reference_s - line.without_s)
                for line in report.lines
                if line.family == family and line.at_reference_s != line.without_s
            ]
            quartiles = statistics.quantiles(needed, n=4)
            print(
                f"  {family}: each run alone {quartiles[0]:.3f} / {quartiles[1]:.3f} / "
                f"{quartiles[2]:.3f} (quartiles of {len(needed)} runs)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
