"""Megatron-Core's selective recompute by module (``parallel.recompute_modules``,
``--recompute-modules``): what each module's recompute stops keeping for the backward and what
it runs again.

Megatron-Core (``TransformerConfig.recompute_modules``, core_v0.15 and later) reruns, under
``--recompute-granularity selective``, the modules listed (default ``core_attn``):

- ``core_attn``: the attention core (normal checkpointing: Korthikanti et al.'s selective
  recompute; with fused attention it keeps only the row statistics anyway);
- ``mla_up_proj``: multi-head latent attention's up projections and rotary, by
  output-discarding checkpointing (``CheckpointWithoutOutput``): the Q, K and V they make are
  dropped once the attention has read them and made again before its backward;
- ``mlp``: a dense layer's MLP (normal checkpointing: the norm fused into its first linear, the
  up projection's output and the activation's are not kept; only its input is);
- ``moe_act``: the experts' activation (output-discarding: its output, the down projection's
  input, is not kept);
- ``layernorm``: the norms that are modules of their own (output-discarding: their outputs, the
  next linear's inputs, are not kept): the input norm before latent attention's down
  projections (a plain attention fuses it into its QKV linear) and an MoE layer's pre-MLP norm
  (a dense layer fuses it into its first MLP linear);
- ``shared_experts``: an MoE layer's shared experts (normal checkpointing).

``moe`` (the whole MoE layer) is refused: its all-to-alls would run again. The TP collectives a
rerun module repeats (the MLP's under TP, the latents' gathers under sequence parallelism) are
not priced.

    selective_modules(plan.parallel)  # frozenset({"core_attn"}) by default
"""

from __future__ import annotations

from schedules.activations import ACTIVATION_BYTES, attention_core_bytes
from schedules.mla import latent_norm_elements, latent_split
from schedules.moe import expert_tokens, expert_width
from schedules.plan import ParallelConfig, Plan
from schedules.stacks import kernel_stack
from schedules.transformer_engine import te_recipe

DEFAULT_MODULES = ("core_attn",)
"""Megatron-Core's ``recompute_modules`` default."""


def selective_modules(parallel: ParallelConfig) -> frozenset[str]:
    """The modules selective recompute reruns: ``recompute_modules``, Megatron's default
    (``core_attn``) when unset (an empty list: none); none without ``recompute:
    selective``."""
    if parallel.recompute != "selective":
        return frozenset()
    modules = parallel.recompute_modules
    return frozenset(DEFAULT_MODULES if modules is None else modules)


def separate_norms(plan: Plan, *, moe_layer: bool) -> int:
    """Norms of one layer that are modules of their own in Megatron-Core's Transformer Engine
    layer spec (what ``layernorm`` recomputes): the input norm before latent attention (the
    plain attention's is fused into ``linear_qkv``) and the pre-MLP norm of an MoE layer (a
    dense layer's is fused into ``linear_fc1``)."""
    return (1 if plan.model.multi_latent else 0) + (1 if moe_layer else 0)


def check_recompute_modules(plan: Plan) -> None:
    """``recompute_modules`` on the stack and model it describes: Megatron-Core's knob, its
    ``mla_up_proj`` for latent attention only, its ``moe_act`` and ``shared_experts`` for
    models with experts (and shared experts)."""
    modules = plan.parallel.recompute_modules
    if modules is None:
        return
    stack = kernel_stack(plan)
    if stack != "megatron":
        raise ValueError(
            f"parallel.recompute_modules is Megatron-Core's --recompute-modules; stack {stack} "
            "has no such knob (use recompute: selective, op or full)"
        )
    model = plan.model
    needs = {
        "mla_up_proj": (model.multi_latent, "model.kv_lora_rank (multi-head latent attention)"),
        "moe_act": (bool(model.num_experts), "model.num_experts"),
        "shared_experts": (
            bool(model.num_experts and model.moe_shared_expert_ffn_hidden_size),
            "model.moe_shared_expert_ffn_hidden_size",
        ),
    }
    for module, (present, what) in needs.items():
        if module in modules and not present:
            raise ValueError(f"parallel.recompute_modules: {module} needs {what}")
    cast_late = [m for m in ("moe_act", "layernorm") if m in modules]
    if cast_late and te_recipe(plan) == "delayed":  # transformer_config.py refuses the pair
        raise ValueError(
            f"parallel.recompute_modules: {', '.join(cast_late)} with training.te_fp8_recipe "
            "delayed: Megatron-Core refuses it (delayed scaling does not support moe_act and "
            "layernorm recompute for FP8); use te_fp8_recipe: current"
        )


def module_saved_delta(plan: Plan, *, moe_layer: bool) -> float:
    """Bytes one layer keeps per micro-batch on one GPU beyond (positive) or short of
    (negative) the ``selective`` count of ``schedules.activations`` (which leaves out the
    attention core), for the plan's modules; 0 unless ``recompute: selective``. ``moe_layer``:
    an MoE layer (its MLP is the experts': ``mlp`` leaves it alone, ``moe_act`` and
    ``shared_experts`` apply)."""
    if plan.parallel.recompute != "selective":
        return 0.0
    modules = selective_modules(plan.parallel)
    model, parallel, b = plan.model, plan.parallel, plan.training.micro_batch_size
    t, sp = parallel.tp, parallel.tp if parallel.sequence_parallel else 1
    tokens = b * model.seq_len / parallel.cp
    gated = 3 if model.gated_mlp else 2  # the up projection's output (2f gated) and the act's
    delta = 0.0
    if "core_attn" not in modules:
        core = attention_core_bytes(
            model, b, cp=parallel.cp, flash_attention=plan.training.flash_attention
        )
        delta += core / t
    if "mla_up_proj" in modules and model.multi_latent:
        # the Q, K and V the up projections make, and the latent norms' outputs they read (the
        # checkpoint runs them without autograd and keeps only its inputs, the latents)
        delta -= ACTIVATION_BYTES * tokens * (model.q_size + model.kv_size + model.value_size) / t
        delta -= ACTIVATION_BYTES * latent_norm_elements(
            model, tokens, latent_split(plan.parallel, kernel_stack(plan))
        )
    if "layernorm" in modules:  # the separate norms' outputs
        delta -= (
            ACTIVATION_BYTES
            * tokens
            * model.hidden_size
            * separate_norms(plan, moe_layer=moe_layer)
            / sp
        )
    if "mlp" in modules and not moe_layer:  # the fused norm's output and the MLP's hidden
        delta -= (
            ACTIVATION_BYTES * tokens * (gated * model.ffn_hidden_size / t + model.hidden_size / sp)
        )
    if "moe_act" in modules and moe_layer:  # the experts' activation outputs
        delta -= ACTIVATION_BYTES * expert_tokens(plan) * expert_width(model) / parallel.expert_tp
    if "shared_experts" in modules and moe_layer:
        delta -= ACTIVATION_BYTES * tokens * gated * model.moe_shared_expert_ffn_hidden_size / t
    return delta
