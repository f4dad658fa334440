"""Which kernel stack runs a plan's layers when ``training.stack`` does not say: one home for the
choice, the reason for it (said in the report's basis line) and the warning when the guess may
be wrong.

The stacks price the same layer very differently (Megatron's fused kernels against PyTorch
eager modules: 20% of the step on Korthikanti et al.'s runs), so the default follows what the
plan says: ``training.stack`` when given; else ``megatron`` for the distributed optimizer (the
data-parallel kind's ``default_stack``) or when the plan sets a knob only Megatron-LM has away
from its default (``MEGATRON_KNOBS``) or sets Megatron-Core's cross-entropy
(``MEGATRON_TRAINING_KNOBS``); else ``eager``, and a plan that looks like Megatron-LM
(tensor and sequence parallel over DDP) gets a warning naming the assumption.

    stack = kernel_stack(plan); why = stack_source(plan)
"""

from __future__ import annotations

import dataclasses

from schedules.data_parallel.registry import data_parallel_kind
from schedules.plan import ParallelConfig, Plan

MEGATRON_KNOBS = (
    "tp_comm_overlap",
    "overlap_param_gather",
    "pp_scatter_gather",
    "first_stage_layers",
    "last_stage_layers",
    "embedding_as_layer",
    "loss_as_layer",
    "recompute_modules",
    "overlap_moe_expert_parallel_comm",
    "delay_wgrad_compute",
)
"""``parallel`` keys that only Megatron-LM has (``--tp-comm-overlap``,
``--overlap-param-gather``, its scatter-gather pipeline p2p, its pipeline-split flags, its
``--recompute-modules``, ``--overlap-moe-expert-parallel-comm`` and
``--delay-wgrad-compute``): a plan
setting one away from the default describes a Megatron run."""
MEGATRON_TRAINING_KNOBS = ("cross_entropy_fusion",)
"""``training`` keys that only Megatron-Core has (its cross-entropy implementation), the same
way: set at all, they describe a Megatron run."""
MEGATRON_MODEL_KNOBS = ("mtp_num_layers",)
"""``model`` keys only Megatron-Core trains (multi-token prediction): set, they describe a
Megatron run."""

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ParallelConfig)}


def megatron_knobs_set(plan: Plan) -> list[str]:
    """The ``MEGATRON_KNOBS`` the plan sets away from their defaults, then the
    ``MEGATRON_TRAINING_KNOBS`` and ``MEGATRON_MODEL_KNOBS`` it sets, in that order."""
    parallel = [k for k in MEGATRON_KNOBS if getattr(plan.parallel, k) != _DEFAULTS[k]]
    training = [k for k in MEGATRON_TRAINING_KNOBS if getattr(plan.training, k) is not None]
    model = [k for k in MEGATRON_MODEL_KNOBS if getattr(plan.model, k)]
    return parallel + training + model


def kernel_stack(plan: Plan) -> str:
    """``training.stack``; else ``megatron`` for the distributed optimizer or a plan setting
    Megatron-only knobs; else ``eager``."""
    if plan.training.stack is not None:
        return plan.training.stack
    default = data_parallel_kind(plan.parallel).default_stack
    if default == "eager" and megatron_knobs_set(plan):
        return "megatron"
    return default


def stack_source(plan: Plan) -> str:
    """Why ``kernel_stack`` chose its stack, for the report: ``""`` when the plan says it,
    else a few words (``"inferred from tp_comm_overlap"``, ``"assumed: training.stack
    unset"``)."""
    if plan.training.stack is not None:
        return ""
    if data_parallel_kind(plan.parallel).default_stack != "eager":
        return f"the default of data_parallel {plan.parallel.data_parallel}"
    knobs = megatron_knobs_set(plan)
    if knobs:
        return f"inferred from {', '.join(knobs)}"
    return "assumed: training.stack unset"


def stack_warning(plan: Plan) -> str | None:
    """A line when the plan runs on the assumed ``eager`` stack but looks like Megatron-LM
    (tensor parallel with sequence parallel over DDP, Megatron's layout), else None."""
    parallel = plan.parallel
    if kernel_stack(plan) != "eager" or plan.training.stack is not None:
        return None
    replicated = not data_parallel_kind(parallel).shards_gradients_or_optimizer  # ddp
    if parallel.tp > 1 and parallel.sequence_parallel and replicated:
        return (
            "training.stack unset: priced as PyTorch eager modules, but tensor and sequence "
            "parallel over ddp is Megatron-LM's layout: set training.stack: megatron if it "
            "runs Megatron (fused kernels, Transformer Engine), or eager to silence this"
        )
    return None


def loss_compiled(plan: Plan) -> bool:
    """Whether ``torch.compile`` fuses the plan's cross-entropy: on the ``compile`` stack unless
    ``training.compile_loss`` is false."""
    return kernel_stack(plan) == "compile" and plan.training.compile_loss is not False


def megatron_cross_entropy(plan: Plan) -> str:
    """The Megatron-Core cross-entropy the plan runs (``training.cross_entropy_fusion``; unset:
    ``none``, Megatron-LM's default)."""
    return plan.training.cross_entropy_fusion or "none"
