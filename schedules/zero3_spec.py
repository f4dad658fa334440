"""DeepSpeed ZeRO stage 3 specs: one rank's model as hooked submodules, and its ZeRO-3 settings.

Modelled on DeepSpeed v0.16.4 (commit e2dc3eeb): every ``nn.Module`` gets pre/post forward and
backward hooks (``parameter_offload.py``, ``_register_deepspeed_module``), so a rank's model is
its modules in forward order (``Submodule``: direct parameter tensors and a share of the work),
and ``Zero3Rank`` holds the ``stage3_*`` settings at DeepSpeed's config defaults.
``layer_submodules`` gives a transformer layer's modules and tensors, ``split_recipe`` cuts a
layer's recipe across them. ``fetch="sync_per_weight"`` selects the parameter fetch of DeepSpeed
v0.3.13 (commit 12a53b43) instead: ``schedules.zero3_fetch`` and ``schedules.zero3_program``.

    spec = Zero3Rank(rank=0, num_microbatches=2, submodules=subs, groups={"dp": (0, 1)})
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.actions import ComputeStep, Step
from schedules.mla import LatentLinear
from schedules.offload import RankOffload

FETCH_MODES = ("prefetch", "sync_per_weight")
"""Parameter fetch behaviours: current DeepSpeed, or v0.3.x's synchronous per-weight gathers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Submodule:
    """One module in forward order; with direct parameters it is fetched, without it only
    triggers a prefetch (containers, activations: DeepSpeed hooks every module)."""

    name: str
    """Label, e.g. ``L3.qkv``."""
    num_params: float
    """Direct parameter elements on this GPU (after tensor parallelism, before ZeRO sharding)."""
    forward: tuple[Step, ...]
    """Its forward work (``ComputeStep`` / ``CommStep``)."""
    backward: tuple[Step, ...]
    """Its backward work; its gradients are ready when it ends."""
    tensors: tuple[float, ...] = ()
    """Elements of each parameter tensor (weight, bias) in registration order; empty means one
    tensor of ``num_params``. Persistence and v0.3.x's per-weight gathers are per tensor."""

    def __post_init__(self) -> None:
        if self.num_params < 0:
            raise ValueError(
                f"submodule {self.name}: num_params must be >= 0, got {self.num_params}"
            )
        if any(t <= 0 for t in self.tensors):
            raise ValueError(f"submodule {self.name}: tensor sizes must be > 0, got {self.tensors}")
        total = sum(self.tensors)
        if self.tensors and abs(total - self.num_params) > 1e-9 * max(total, 1.0):
            raise ValueError(
                f"submodule {self.name}: tensors sum to {total}, num_params is {self.num_params}"
            )

    @property
    def param_tensors(self) -> tuple[float, ...]:
        """Its tensors' element counts (none for a module without direct parameters)."""
        return self.tensors or ((self.num_params,) if self.num_params > 0 else ())


@dataclass(frozen=True, slots=True, kw_only=True)
class Zero3Rank:
    """Everything one rank's ZeRO-3 step program depends on (DeepSpeed's config defaults)."""

    rank: int
    """Global rank."""
    num_microbatches: int
    """Gradient-accumulation micro-batches (each a forward and a backward)."""
    submodules: tuple[Submodule, ...]
    """The whole model in forward order: embedding, each layer's modules, final norm, head."""
    groups: dict[str, tuple[int, ...]]
    """Ranks by group name: ``dp`` (ZeRO's partition group), ``tp``/``cp`` for the recipes, and
    the grad-norm groups."""
    param_bytes: float = 2.0
    """Bytes per parameter element gathered (bf16)."""
    grad_bytes: float = 2.0
    """Bytes per gradient element reduce-scattered (``communication_data_type``: the model's)."""
    prefetch_bucket_elems: int = 50_000_000
    """``stage3_prefetch_bucket_size``: numel one prefetch walk may gather (0: no prefetch)."""
    max_live_parameters: int = 1_000_000_000
    """``stage3_max_live_parameters``: prefetch stops while this many elements are gathered."""
    max_reuse_distance: int = 1_000_000_000
    """``stage3_max_reuse_distance``: a module used again within this many elements of trace
    keeps its parameters."""
    persistence_threshold: int = 100_000
    """``stage3_param_persistence_threshold``: tensors this small stay gathered."""
    reduce_bucket_elems: int = 500_000_000
    """``reduce_bucket_size``: gradient elements per reduce-scatter bucket."""
    overlap_comm: bool = True
    """Reduce (and all-gather) on side streams (stage-3 default) or on the compute stream."""
    fetch: str = "prefetch"
    """``prefetch`` (current DeepSpeed) or ``sync_per_weight`` (v0.3.x)."""
    host_loop_s: float = 0.0
    """``fetch="sync_per_weight"`` (v0.3.x): host seconds per dp rank of the Python loops that
    build one tensor view per rank before each weight's all-gather and each gradient's
    reduce-scatter (``_allgather_param``, ``_reduce_scatter_gradient``)."""
    host_copy_s: float = 0.0
    """``fetch="sync_per_weight"``: host seconds per dp rank of torch's list-based collectives,
    which copy each rank's tensor out of (all_gather) or into (reduce_scatter) a flat buffer,
    one ``copy_`` per rank (``ProcessGroupNCCL::allgather`` / ``reduce_scatter``)."""
    host_ahead: bool = True
    """True: the host runs ahead of the GPU, so an all-gather starts once the dp FIFO lets it
    (DeepSpeed's only limiter waits for earlier all-gathers). False: the host reaches each hook
    only when the compute before it has ended (CPU-bound hooks), so all-gathers wait for it."""
    grad_norm_groups: tuple[str, ...] = ()
    """Groups of the step-end norm all-reduces, in order; DeepSpeed: ``("dp", "mp")`` (dp, then
    the model-parallel group when an ``mpu`` is given). Empty: none."""
    num_norm_groups: int = 1
    """Optimizer sub-groups (param groups split at ``sub_group_size``); each all-reduces."""
    recompute_blocks: tuple[tuple[int, int], ...] = ()
    """Activation checkpointing: ``(start, stop)`` ranges of submodules whose forward runs again
    in the backward, hooks and all, right before their backward (their ``backward`` recipes then
    leave the recompute out)."""
    optimizer_s: float = 0.0
    """Optimizer step on the local partition."""
    offload: RankOffload | None = None
    """ZeRO-Offload / ZeRO-Infinity host copies (``schedules.offload``); None: no offload."""

    def __post_init__(self) -> None:
        stops = [0, *(b for block in self.recompute_blocks for b in block)]
        if (
            stops != sorted(stops)
            or stops[-1] > len(self.submodules)
            or any(a >= b for a, b in self.recompute_blocks)
        ):
            raise ValueError(
                f"recompute_blocks {self.recompute_blocks} must be disjoint, ordered, non-empty "
                f"ranges of the {len(self.submodules)} submodules"
            )
        if self.num_microbatches < 1 or self.num_norm_groups < 1:
            raise ValueError(
                f"rank {self.rank}: num_microbatches={self.num_microbatches} and "
                f"num_norm_groups={self.num_norm_groups} must be >= 1"
            )
        if self.fetch not in FETCH_MODES:
            raise ValueError(f"fetch must be one of {FETCH_MODES}, got {self.fetch!r}")
        limits = ("prefetch_bucket_elems", "max_live_parameters", "max_reuse_distance")
        for name in (*limits, "persistence_threshold", "reduce_bucket_elems"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.host_loop_s < 0 or self.host_copy_s < 0:
            raise ValueError(
                f"host_loop_s={self.host_loop_s}, host_copy_s={self.host_copy_s}: must be >= 0"
            )
        if self.param_bytes <= 0 or self.grad_bytes <= 0:
            raise ValueError(f"param_bytes={self.param_bytes}, grad_bytes={self.grad_bytes}: > 0")
        missing = [g for g in ("dp", *self.grad_norm_groups) if g not in self.groups]
        if missing:
            raise ValueError(
                f"rank {self.rank}: groups {missing} missing from {sorted(self.groups)}"
            )


def layer_submodules(
    *,
    hidden: int,
    ffn: int,
    kv_size: int,
    gated: bool,
    bias: bool,
    norm_params: int,
    tp: int = 1,
    fused: bool = False,
    parallel_block: bool = False,
    q_size: int = 0,
    qk_norm_params: int = 0,
    latent: tuple[LatentLinear, ...] = (),
    latent_norms: tuple[int, ...] = (),
    out_size: int = 0,
) -> list[tuple[str, tuple[float, ...]]]:
    """A transformer layer's modules with direct parameters and their tensors on one TP rank.

    ``fused``: Megatron's names and fused QKV / gate-up (``input_norm, qkv, dense,
    post_attn_norm, fc1, fc2``); otherwise Hugging Face Llama's (``q_proj`` ... ``down_proj``).
    Column-parallel weights and biases are split ``tp`` ways; row-parallel weights too, their
    biases and the norms are replicated: the sizes sum to ``schedules.params.layer_params_per_gpu``.
    A ``parallel_block`` has the input norm only. ``q_size``: the query width a*d (0: hidden);
    ``qk_norm_params``: the query and key norms' weights (replicated), a module of their own.
    ``latent``: multi-head latent attention's linears (``schedules.mla.latent_linears``, the down
    projections replicated) in place of Q, K and V, with its ``latent_norms`` (each a module of
    its own, Hugging Face DeepSeek's ``q_a_layernorm`` and ``kv_a_layernorm``) and an output
    projection ``out_size`` wide at its input (a * v_head_dim).

    >>> layer_submodules(hidden=4, ffn=8, kv_size=2, gated=True, bias=False, norm_params=4)[1]
    ('q_proj', (16.0,))
    """
    h, f, q = hidden, ffn, q_size or hidden

    def linear(rows: int, cols: int, column_parallel: bool) -> tuple[float, ...]:
        weight = rows * cols / tp
        if not bias:
            return (weight,)
        return (weight, cols / tp if column_parallel else float(cols))

    norm = (float(h), float(norm_params - h)) if norm_params > h else (float(norm_params),)
    num_in = 2 if gated else 1
    if fused:
        attention = [("qkv", linear(h, q + 2 * kv_size, True)), ("dense", linear(q, h, False))]
        mlp = [("fc1", linear(h, num_in * f, True)), ("fc2", linear(f, h, False))]
    else:
        attention = [
            ("q_proj", linear(h, q, True)),
            ("k_proj", linear(h, kv_size, True)),
            ("v_proj", linear(h, kv_size, True)),
            ("o_proj", linear(q, h, False)),
        ]
        mlp = [("gate_proj", linear(h, f, True))] if gated else []
        mlp += [("up_proj", linear(h, f, True)), ("down_proj", linear(f, h, False))]
    if latent:  # its linears and latent norms, then the output projection
        attention = [
            *_latent_submodules(latent, latent_norms, norm_params > h, tp=tp),
            (attention[-1][0], linear(out_size, h, False)),
        ]
    if qk_norm_params and not latent:  # latent norms are modules of their own (above)
        attention.append(("qk_norm", (float(qk_norm_params),)))
    second_norm = [] if parallel_block else [("post_attn_norm", norm)]
    return [("input_norm", norm), *attention, *second_norm, *mlp]


LATENT_MODULE_NAMES = {
    "q_down": "q_a_proj",
    "q_up": "q_b_proj",
    "q": "q_proj",
    "kv_down": "kv_a_proj_with_mqa",
    "kv_up": "kv_b_proj",
}
"""Hugging Face DeepSeek-V2/V3's names of multi-head latent attention's linears
(``modeling_deepseek.py``), by ``schedules.mla`` name."""


def _latent_submodules(
    latent: tuple[LatentLinear, ...],
    norms: tuple[int, ...],
    layernorm: bool,
    *,
    tp: int,
) -> list[tuple[str, tuple[float, ...]]]:
    """Multi-head latent attention's linears (weights only) and latent norms, in forward order:
    each down projection (whole on every TP rank) and, before each up projection, the norm of
    its latent (its weight, and a bias for a LayerNorm)."""
    out: list[tuple[str, tuple[float, ...]]] = []
    widths = iter(norms)
    for x in latent:
        if x.name.endswith("_up"):
            width = float(next(widths))
            norm_name = "q_a_layernorm" if x.name == "q_up" else "kv_a_layernorm"
            out.append((norm_name, (width, width) if layernorm else (width,)))
        # no biases (Megatron-Core's latent linears have none); the down projections whole
        weight = x.in_width * x.out_width / (1 if x.duplicated else tp)
        out.append((LATENT_MODULE_NAMES[x.name], (float(weight),)))
    return out


def split_recipe(steps: tuple[Step, ...], fractions: tuple[float, ...]) -> list[tuple[Step, ...]]:
    """Cut a pass recipe into consecutive parts holding ``fractions`` of its compute time.

    A ``ComputeStep`` straddling a cut is split in two (same name); ``CommStep`` and ``MarkStep``
    stay where they are, in the part whose compute they follow (the first part before any
    compute). A recipe without compute time goes whole into the first part.

    >>> parts = split_recipe((ComputeStep(name="fwd", duration_s=4.0),), (0.25, 0.75))
    >>> [[step.duration_s for step in part] for part in parts]
    [[1.0], [3.0]]
    """
    if not fractions or any(x < 0 for x in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be >= 0 and sum to 1, got {fractions}")
    total = sum(s.duration_s for s in steps if isinstance(s, ComputeStep))
    parts: list[list[Step]] = [[] for _ in fractions]
    cuts = [total * sum(fractions[: i + 1]) for i in range(len(fractions))]
    part, elapsed = 0, 0.0
    for step in steps:
        if not isinstance(step, ComputeStep) or total <= 0:
            parts[part].append(step)
            continue
        left = step.duration_s
        while part < len(parts) - 1 and elapsed + left > cuts[part] * (1 + 1e-12):
            piece = cuts[part] - elapsed
            if piece > 0:
                parts[part].append(step.part(piece))
                left, elapsed = left - piece, cuts[part]
            part += 1
        parts[part].append(step.part(left))
        elapsed += left
    return [tuple(p) for p in parts]
