"""A plan's model as the modules DeepSpeed ZeRO-3 hooks: which parameters each fetch gathers.

DeepSpeed registers hooks on every ``nn.Module`` and gathers a module's direct parameters before
it runs (``schedules.zero3_fetch``). For the decoder models here the modules with parameters
are, in forward order: the token embedding (with learned positions), per layer Hugging Face
Llama's ``input_layernorm, q_proj, k_proj, v_proj, o_proj, post_attention_layernorm, gate_proj,
up_proj, down_proj`` (ZeRO-3 is mostly run on Hugging Face models; Megatron-DeepSpeed fuses QKV
and gate/up, which changes the fetch count, not the bytes), the final norm and the LM head. The
tensors are per tensor-parallel rank and add up to ``schedules.params``' counts.

    modules = zero3_modules(plan)  # [("embed", (V h / t,), "embed", -1), ...]
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.mla import latent_linears, latent_norm_widths
from schedules.params import norm_params, qk_norm_params
from schedules.plan import Plan
from schedules.zero3_fetch import zero3_buffer_bytes
from schedules.zero3_spec import Submodule, Zero3Rank, layer_submodules


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleShape:
    """One module with direct parameters, in forward order."""

    name: str
    """Label, e.g. ``L3.q_proj``."""
    tensors: tuple[float, ...]
    """Elements of each parameter tensor on one tensor-parallel rank."""
    part: str
    """``embed``, ``layer`` or ``head``: whose recipe its compute comes from."""
    layer: int = -1
    """Layer index (``layer`` modules)."""


def zero3_modules(plan: Plan) -> tuple[ModuleShape, ...]:
    """Every module ZeRO-3 hooks, in forward order; those without parameters fetch nothing but
    each starts a prefetch walk (DeepSpeed's ``fetch_sub_module`` runs for every module)."""
    model, tp = plan.model, plan.parallel.tp
    h, v = model.hidden_size, model.vocab_size
    embed = [v * h / tp] + (
        [float(model.seq_len * h)] if model.position_embedding == "learned" else []
    )
    per_layer = layer_submodules(
        hidden=h,
        ffn=model.ffn_hidden_size,
        kv_size=model.kv_size,
        q_size=model.q_size,
        qk_norm_params=qk_norm_params(model),
        gated=model.gated_mlp,
        bias=model.linear_bias,
        norm_params=norm_params(model),
        tp=tp,
        parallel_block=model.parallel_block,
        latent=latent_linears(model) if model.multi_latent else (),
        latent_norms=latent_norm_widths(model) if model.multi_latent else (),
        out_size=model.attention_out_size,
    )
    norm = norm_params(model)
    final_norm = (float(h), float(norm - h)) if norm > h else (float(norm),)
    modules = [
        ModuleShape(name="model", tensors=(), part="embed"),
        ModuleShape(name="embed", tensors=tuple(embed), part="embed"),
    ]
    if model.position_embedding == "rope":
        modules.append(ModuleShape(name="rotary_emb", tensors=(), part="embed"))
    for layer in range(model.num_layers):
        modules += [
            ModuleShape(name=_layer_name(layer, name), tensors=tensors, part="layer", layer=layer)
            for name, tensors in _with_containers(per_layer, model.gated_mlp)
        ]
    modules.append(ModuleShape(name="final_norm", tensors=final_norm, part="head"))
    if not model.tied_embeddings:
        modules.append(ModuleShape(name="lm_head", tensors=(v * h / tp,), part="head"))
    return tuple(modules)


def _layer_name(layer: int, name: str) -> str:
    return f"L{layer}.{name}" if name else f"L{layer}"


def _with_containers(
    per_layer: list[tuple[str, tuple[float, ...]]], gated: bool
) -> list[tuple[str, tuple[float, ...]]]:
    """A layer's modules with the parameterless ones DeepSpeed hooks too, in forward order: the
    decoder layer, ``self_attn`` before its projections, ``mlp`` and (gated) ``act_fn``."""
    out: list[tuple[str, tuple[float, ...]]] = [("", ())]
    for name, tensors in per_layer:
        if name == "q_proj":
            out.append(("self_attn", ()))
        if name in ("gate_proj", "up_proj") and not any(n == "mlp" for n, _ in out):
            out.append(("mlp", ()))
        out.append((name, tensors))
        if name == "gate_proj" and gated:
            out.append(("mlp.act_fn", ()))
    return out


def zero3_runtime_bytes(plan: Plan, *, dp: int) -> dict[str, float]:
    """ZeRO-3's buffers at its peak on one GPU (``zero3_buffer_bytes``) for this plan's model."""
    par = plan.parallel
    submodules = tuple(
        Submodule(
            name=m.name, num_params=sum(m.tensors), forward=(), backward=(), tensors=m.tensors
        )
        for m in zero3_modules(plan)
    )
    spec = Zero3Rank(
        rank=0,
        num_microbatches=1,
        submodules=submodules,
        groups={"dp": tuple(range(dp))},
        prefetch_bucket_elems=par.zero_prefetch_bucket_elems,
        max_live_parameters=par.zero_max_live_parameters,
        persistence_threshold=par.zero_param_persistence_threshold,
        reduce_bucket_elems=par.zero_bucket_elems,
    )
    return zero3_buffer_bytes(spec)
