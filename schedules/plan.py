"""The plan file: a model, a cluster, a parallel layout and a batch, loaded strictly and validated.

A plan says *what* is trained (a dense decoder-only transformer), *where* (a cluster preset or
file, resolved later by ``topologies.config.load_cluster``), *how* it is split (TP, CP, PP, DP,
the pipeline schedule, the data-parallel kind and its framework knobs) and *with which batch*.
Unknown keys are errors; every value is type-checked; ``resolve_plan`` checks that the degrees fit
the world size and the model, printing every value involved.

    plan = resolve_plan(load_plan("plan.yaml"), world_size=256)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fileio.strict import MAX_CONFIG_BYTES, did_you_mean, load_yaml, read_input, shorten
from schedules.model_presets import resolve_model_preset
from schedules.pipeline_schedules import SCHEDULES as PIPELINE_SCHEDULES
from schedules.whatif import WhatIf, parse_whatif

MLP_ACTIVATIONS = {"gelu": False, "relu": False, "swiglu": True, "geglu": True}
"""Known MLP activations and whether each is gated (three matrices instead of two)."""
POSITION_EMBEDDINGS = ("rope", "learned", "none")
NORMS = ("rmsnorm", "layernorm")
SCHEDULES = tuple(PIPELINE_SCHEDULES)
"""Pipeline schedule names (``schedules.pipeline_schedules``, in its order)."""
RECOMPUTE_MODES = ("none", "selective", "op", "full")  # least recomputed first
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "mlp", "moe_act", "layernorm", "shared_experts")
"""What Megatron-Core's selective recompute can rerun (``--recompute-modules``,
``TransformerConfig.recompute_modules``; its ``moe``, the whole MoE layer, is not modelled)."""
DATA_PARALLEL_KINDS = ("ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp", "distributed_optimizer")
FSDP2_ALIAS = "fsdp2"
"""``data_parallel: fsdp2`` is read as ``fsdp`` with ``fsdp_version: 2`` (``fully_shard``)."""
FSDP_VERSIONS = (1, 2)
ZERO_FETCH_MODES = ("prefetch", "sync_per_weight")
REDUCE_DTYPES = ("fp32", "bf16")
FSDP_PP_REDUCE = ("after_send", "before_send")
"""When FSDP2 reduce-scatters a pipeline stage's gradients (``parallel.fsdp_pp_reduce``)."""
PRECISIONS = ("bf16", "fp16", "fp8")
STACKS = ("eager", "compile", "megatron")
"""Which implementation runs the layers (``training.stack``; ``schedules.kernels`` inventories)."""
ATTENTION_BACKENDS = ("cudnn", "flash2")
"""Which fused-attention kernel runs (``training.attention_backend``; priced in sim.compute)."""
FLOAT8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
"""torchao's float8 training recipes (``Float8LinearRecipeName``; ``schedules.float8``)."""
TE_FP8_RECIPES = ("delayed", "current")
"""Transformer Engine's FP8 recipes on the megatron stack (``DelayedScaling``,
``Float8CurrentScaling``; ``schedules.transformer_engine``)."""
CROSS_ENTROPY_FUSIONS = ("none", "native", "te", "te_inplace")
"""Megatron-Core's cross-entropy implementations (``training.cross_entropy_fusion``;
``schedules.kernels.MEGATRON_CROSS_ENTROPY``)."""
FSDP_BACKWARD_PREFETCH = ("backward_pre", "backward_post", "none")
MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
"""Megatron-Core's token dispatchers (``moe_token_dispatcher_type``); ``flex`` with DeepEP
(``schedules.moe.dispatch_bytes``)."""
CP_ROTATE_METHODS = ("allgather", "alltoall")
"""How torch's context parallel passes K and V around (``context_parallel_rotate_method``)."""
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
"""Where ``offload_optimizer`` / ``offload_param`` put their state (DeepSpeed's
``OffloadDeviceEnum``); the rest of the offload checks are ``schedules.offload.check_offload``."""
OPTIMIZER_STATE_DTYPES = ("fp32", "fp16", "bf16", "fp8")
"""Megatron's ``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` choices (Adam's moments under
``--use-precision-aware-optimizer``)."""
MAIN_PARAMS_DTYPES = ("fp32", "fp16")
"""Megatron's ``--main-params-dtype`` choices (the optimizer's master weights)."""
MIXED_PRECISIONS = ("autocast", "bf16_weights")
"""How a torch DDP (or one-GPU) step keeps its weights: ``training.mixed_precision``."""


def _check_choice(key: str, value: str, choices: tuple[str, ...] | list[str]) -> None:
    if value not in choices:
        raise ValueError(
            f"{key}={shorten(value)} is not one of {', '.join(choices)}"
            f"{did_you_mean(value, choices)}"
        )


def _check_positive(owner: object, section: str, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(owner, name)
        if value <= 0:
            raise ValueError(f"{section}.{name} must be > 0, got {value}")


MODEL_LIMITS = {
    "num_layers": 10_000,
    "hidden_size": 1 << 20,
    "num_heads": 1 << 16,
    "num_kv_heads": 1 << 16,
    "head_dim": 1 << 14,
    "q_lora_rank": 1 << 16,
    "kv_lora_rank": 1 << 16,
    "qk_rope_head_dim": 1 << 14,
    "v_head_dim": 1 << 14,
    "ffn_hidden_size": 1 << 22,
    "vocab_size": 1 << 24,
    "seq_len": 1 << 24,
    "mtp_num_layers": 16,
}
"""Upper bounds of the model dimensions: 10-100x past the largest published dense models (126
layers, hidden 16,384, 128k vocabulary, 1M-token context), so a typo of a few digits or 1e30 is
an error instead of a step of 10^50 seconds."""


def _check_latent_attention(model: ModelConfig) -> None:
    """Multi-head latent attention's keys: ranks >= 0, set only with ``kv_lora_rank``, which
    needs its query/key head width given and every head its own keys."""
    names = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")
    for name in names:
        if getattr(model, name) < 0:
            raise ValueError(f"model.{name} must be >= 0, got {getattr(model, name)}")
    if not model.kv_lora_rank:
        for name in names[1:]:
            if getattr(model, name):
                raise ValueError(
                    f"model.{name}={getattr(model, name)} is a key of multi-head latent "
                    "attention: set model.kv_lora_rank too"
                )
        return
    if not model.head_dim:
        raise ValueError(
            f"model.kv_lora_rank={model.kv_lora_rank} needs model.head_dim: the non-rotary width "
            "of each query and key head (qk_nope_head_dim, --qk-head-dim)"
        )
    if model.num_kv_heads not in (0, model.num_heads):
        raise ValueError(
            f"model.num_kv_heads={model.num_kv_heads} with model.kv_lora_rank: multi-head latent "
            "attention projects keys and values for every head (num_kv_heads = num_heads)"
        )
    if model.qk_norm:
        raise ValueError(
            "model.qk_norm with model.kv_lora_rank: multi-head latent attention norms its "
            "latents, not its heads"
        )


MOE_LIMITS = {"num_experts": 4096, "moe_ffn_hidden_size": 1 << 22}
"""Upper bounds of the MoE dimensions (DeepSeek-V3 has 256 routed experts of width 2,048)."""


def _check_moe(model: ModelConfig) -> None:
    """MoE keys: counts in range, top-k within the experts, a capacity and imbalance >= 1."""
    for name, limit in MOE_LIMITS.items():
        value = getattr(model, name)
        if not 0 <= value <= limit:
            raise ValueError(f"model.{name} must be in 0..{limit:,}, got {value}")
    if model.moe_shared_expert_ffn_hidden_size < 0:
        raise ValueError(
            "model.moe_shared_expert_ffn_hidden_size must be >= 0, got "
            f"{model.moe_shared_expert_ffn_hidden_size}"
        )
    if model.moe_layer_freq < 1 or model.moe_first_dense_layers < 0:
        raise ValueError(
            f"model.moe_layer_freq must be >= 1 and model.moe_first_dense_layers >= 0, got "
            f"{model.moe_layer_freq} and {model.moe_first_dense_layers}"
        )
    if not model.num_experts:
        if model.moe_router_num_groups or model.moe_router_group_topk:
            raise ValueError(
                "model.moe_router_num_groups and moe_router_group_topk need model.num_experts"
            )
        return
    if not 1 <= model.moe_top_k <= model.num_experts:
        raise ValueError(
            f"model.moe_top_k={model.moe_top_k} must be in 1..num_experts={model.num_experts}"
        )
    if model.moe_first_dense_layers >= model.num_layers:
        raise ValueError(
            f"model.moe_first_dense_layers={model.moe_first_dense_layers} leaves no MoE layer of "
            f"num_layers={model.num_layers}"
        )
    if not 1.0 <= model.moe_imbalance <= model.num_experts:
        raise ValueError(
            f"model.moe_imbalance={model.moe_imbalance} must be in 1..num_experts "
            f"(the busiest expert's tokens over the mean)"
        )
    capacity = model.moe_capacity_factor
    if capacity is not None and not 0.0 < capacity <= model.num_experts:
        raise ValueError(f"model.moe_capacity_factor={capacity} must be in (0, num_experts]")
    groups, topk = model.moe_router_num_groups, model.moe_router_group_topk
    if groups or topk:
        if not (1 <= topk <= groups and model.num_experts % groups == 0):
            raise ValueError(
                f"model.moe_router_num_groups={groups} must divide num_experts="
                f"{model.num_experts} and moe_router_group_topk={topk} be in 1..{groups}"
            )
        if model.moe_top_k > topk * (model.num_experts // groups):
            raise ValueError(
                f"model.moe_top_k={model.moe_top_k} exceeds the experts of "
                f"moe_router_group_topk={topk} groups of {model.num_experts // groups}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """A dense decoder-only transformer (GPT / Llama family)."""

    name: str
    """Label used in reports."""
    num_layers: int
    """Transformer layers L."""
    hidden_size: int
    """Model width h."""
    num_heads: int
    """Attention (query) heads a."""
    ffn_hidden_size: int
    """MLP inner width f (per matrix; a gated MLP has two f-wide input matrices)."""
    vocab_size: int
    """Vocabulary V (unpadded)."""
    seq_len: int
    """Sequence length s in tokens."""
    num_kv_heads: int = 0
    """Key/value heads (GQA when < num_heads); 0 in the file means num_heads."""
    qk_norm: bool = False
    """RMSNorm of every query and key head over its d channels before rotary (Qwen3, Megatron's
    ``--qk-layernorm``): 2d parameters per layer and a norm pass over Q and K."""
    head_dim: int = 0
    """Width d of one attention head (Megatron's ``--kv-channels``, Hugging Face's ``head_dim``);
    0 in the file means hidden_size / num_heads. Qwen3 and Gemma set it apart from h / a: the
    query and output projections are then a*d wide, not h."""
    gated_mlp: bool = True
    """SwiGLU-style MLP with 3 matrices (True) or a GeLU MLP with 2 (False)."""
    tied_embeddings: bool = False
    """Whether the LM head reuses the input embedding matrix."""
    mlp_activation: str = ""
    """gelu | relu | swiglu | geglu; empty means swiglu if gated_mlp else gelu."""
    position_embedding: str = "rope"
    """rope (no parameters), learned (adds seq_len * hidden_size parameters) or none (no
    positional encoding: NoPE, a causal model that learns positions from its mask)."""
    norm: str = "rmsnorm"
    """rmsnorm (h parameters per norm) or layernorm (2h: weight and bias)."""
    linear_bias: bool = False
    """Whether the linear layers have biases (GPT-2/3 and Megatron GPT: yes; Llama: no)."""
    dropout: bool = False
    """Whether dropout is on (stores masks: Korthikanti et al. count them; Llama trains without)."""
    num_experts: int = 0
    """Routed experts per MoE layer (Megatron --num-experts); 0: a dense model."""
    moe_top_k: int = 2
    """Experts each token is routed to (--moe-router-topk)."""
    moe_ffn_hidden_size: int = 0
    """One routed expert's MLP width (--moe-ffn-hidden-size); 0 means ffn_hidden_size."""
    moe_shared_expert_ffn_hidden_size: int = 0
    """Total width of the shared experts every token goes through
    (--moe-shared-expert-intermediate-size); 0: none."""
    moe_layer_freq: int = 1
    """Every n-th layer (after the first dense ones) is an MoE layer (--moe-layer-freq)."""
    moe_first_dense_layers: int = 0
    """Leading dense layers (DeepSeek's first_k_dense_replace)."""
    moe_capacity_factor: float | None = None
    """Tokens an expert takes at most, relative to the mean (--moe-expert-capacity-factor);
    excess tokens are dropped. Unset: dropless."""
    moe_imbalance: float = 1.0
    """Tokens of the busiest expert relative to the mean (1.0: perfectly balanced routing); the
    rank holding it sets the pace of every all-to-all and expert GEMM."""
    moe_router_num_groups: int = 0
    """Group-limited routing (DeepSeek-V3; Megatron-Core --moe-router-num-groups, Hugging Face
    ``n_group``): the experts split into this many groups, of which each token's experts come
    from ``moe_router_group_topk``; 0: every expert open to every token."""
    moe_router_group_topk: int = 0
    """Groups a token's experts come from (--moe-router-group-topk, ``topk_group``)."""
    separate_projections: bool = False
    """The attention's query, key and value projections and a gated MLP's gate and up
    projections are separate linears (torchtitan's Llama ``wq``, ``wk``, ``wv``, ``w1``, ``w3``;
    Hugging Face's Llama) instead of one fused weight each (Megatron's ``linear_qkv`` and
    ``linear_fc1``, the plain loop ``commbench --step`` runs): each is a GEMM of its own, the
    narrow key and value ones memory-bound under TP, and their input gradients are summed
    (``schedules.kernels.separate_projection_kernels``)."""
    parallel_block: bool = False
    """Attention and MLP side by side on one normed input, their outputs added to the residual
    together (GPT-J, GPT-NeoX's ``use_parallel_residual``, PaLM, MegaScale's parallel
    transformer block): one norm per layer and, under TP, one reduction of the two branches'
    sum (``schedules.messages.tp_collectives_per_layer``)."""
    attention_window: int = 0
    """Sliding-window attention: each query attends to the ``attention_window`` latest tokens,
    itself included (Mistral's ``sliding_window``, FlashAttention's ``window_size``); 0: the
    whole causal context."""
    kv_lora_rank: int = 0
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2; Megatron's
    ``--multi-latent-attention --kv-lora-rank``, Hugging Face's ``kv_lora_rank``): keys and
    values come from one latent this wide (plus the shared rotary key, ``qk_rope_head_dim``),
    normed and projected up to every head (``schedules.mla``); 0: attention with K and V
    projected from the hidden state. With it ``head_dim`` is the width of each query and key
    head's non-rotary part (``qk_nope_head_dim``, Megatron's ``--qk-head-dim``) and must be set."""
    q_lora_rank: int = 0
    """Multi-head latent attention's query latent (``--q-lora-rank``, ``q_lora_rank``): the query
    projected down to this width, normed and projected up; 0: projected directly (DeepSeek-V2
    Lite)."""
    qk_rope_head_dim: int = 0
    """The rotary part of each query and key head under multi-head latent attention
    (``qk_rope_head_dim``, ``--qk-pos-emb-head-dim``): the queries' own, the key's one shared by
    every head."""
    v_head_dim: int = 0
    """Width of each value head under multi-head latent attention (``v_head_dim``,
    ``--v-head-dim``); 0: ``head_dim``."""
    mtp_num_layers: int = 0
    """Multi-token prediction depths (DeepSeek-V3; Megatron-Core's ``--mtp-num-layers``): each
    predicts one token further from the previous depth's hidden state and the input embedding
    of the token it looks ahead to, through its own norms, a 2h x h projection and one
    transformer layer of the last layer's kind, then the shared LM head and a loss of its own,
    on the model's last pipeline stage (``schedules.mtp``); the megatron stack only. 0: none."""

    def __post_init__(self) -> None:
        _check_positive(
            self,
            "model",
            ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size", "seq_len"),
        )
        for name, limit in MODEL_LIMITS.items():
            value = getattr(self, name)
            if value > limit:
                raise ValueError(
                    f"model.{name}={value:,} is larger than any model this simulates "
                    f"(at most {limit:,})"
                )
        if self.num_kv_heads < 0:
            raise ValueError(f"model.num_kv_heads must be >= 0, got {self.num_kv_heads}")
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.mlp_activation:  # the activation, when named, decides gating
            _check_choice("model.mlp_activation", self.mlp_activation, list(MLP_ACTIVATIONS))
            object.__setattr__(self, "gated_mlp", MLP_ACTIVATIONS[self.mlp_activation])
        _check_choice("model.position_embedding", self.position_embedding, POSITION_EMBEDDINGS)
        _check_choice("model.norm", self.norm, NORMS)
        if self.head_dim < 0:
            raise ValueError(f"model.head_dim must be >= 0, got {self.head_dim}")
        _check_latent_attention(self)
        if self.mtp_num_layers < 0:
            raise ValueError(f"model.mtp_num_layers must be >= 0, got {self.mtp_num_layers}")
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"model.hidden_size={self.hidden_size} is not divisible by "
                    f"model.num_heads={self.num_heads} (set model.head_dim for heads of another "
                    "width)"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_kv_heads > self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_kv_heads={self.num_kv_heads} must divide "
                f"model.num_heads={self.num_heads}"
            )
        _check_moe(self)
        if self.attention_window < 0:
            raise ValueError(
                f"model.attention_window must be >= 0 (0: the whole causal context), got "
                f"{self.attention_window}"
            )
        if self.parallel_block and self.num_experts:
            raise ValueError(
                f"model.parallel_block with num_experts={self.num_experts}: a parallel block "
                "beside mixture-of-experts layers is not modelled"
            )

    @property
    def activation(self) -> str:
        """The MLP activation: ``mlp_activation``, or swiglu if gated else gelu."""
        return self.mlp_activation or ("swiglu" if self.gated_mlp else "gelu")

    @property
    def norms_per_layer(self) -> int:
        """Norms of one layer: one before attention and one before the MLP, or one shared by
        both in a ``parallel_block``."""
        return 1 if self.parallel_block else 2

    @property
    def multi_latent(self) -> bool:
        """Whether attention is multi-head latent attention (``kv_lora_rank`` set)."""
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Width of one query (and key) head in the attention kernel: ``head_dim``, plus the
        rotary part under multi-head latent attention."""
        return self.head_dim + self.qk_rope_head_dim

    @property
    def value_head_dim(self) -> int:
        """Width of one value head: ``v_head_dim`` if set, else ``head_dim``."""
        return self.v_head_dim or self.head_dim

    @property
    def q_size(self) -> int:
        """Width of the queries the attention kernel reads, num_heads * qk_head_dim (h unless
        ``head_dim`` is set apart or the attention is latent)."""
        return self.num_heads * self.qk_head_dim

    @property
    def kv_size(self) -> int:
        """Width of the keys the attention kernel reads, num_kv_heads * qk_head_dim (every head
        under multi-head latent attention); the values are ``value_size`` wide."""
        return self.num_kv_heads * self.qk_head_dim

    @property
    def value_size(self) -> int:
        """Width of the values the attention kernel reads, num_kv_heads * value_head_dim."""
        return self.num_kv_heads * self.value_head_dim

    @property
    def attention_out_size(self) -> int:
        """Width of the attention kernel's output, the output projection's input: num_heads *
        value_head_dim (``q_size`` unless the value heads are narrower)."""
        return self.num_heads * self.value_head_dim


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """Where the plan runs, as written in the file (resolved by topologies.config.load_cluster)."""

    node: str | dict[str, Any] | None = field(default=None, hash=False)
    """A node preset name (e.g. dgx-h100) or a mapping describing a node."""
    file: str | None = None
    """A cluster YAML file instead of ``node`` (relative paths are relative to the plan file)."""
    num_nodes: int = 1
    """Number of nodes."""
    fabric: str | None = None
    """Inter-node fabric preset (e.g. ib-ndr); None for the node preset's default."""
    oversubscription: float = 1.0
    """Fat-tree oversubscription ratio (1.0 = non-blocking)."""
    nccl_version: str | None = None
    """The NCCL release the job runs (e.g. 2.26.2): its tuning tables pick each collective's
    algorithm and protocol; None for the network model's own release."""

    def __post_init__(self) -> None:
        if (self.node is None) == (self.file is None):
            raise ValueError(
                f"cluster needs exactly one of 'node' or 'file', got node={shorten(self.node)}, "
                f"file={shorten(self.file)}"
            )
        _check_positive(self, "cluster", ("num_nodes",))
        if self.oversubscription < 1.0:
            raise ValueError(
                f"cluster.oversubscription must be >= 1.0, got {self.oversubscription}"
            )
        if self.file is not None and self.nccl_version is not None:
            raise ValueError(
                f"cluster.nccl_version={shorten(self.nccl_version)} beside cluster.file: the "
                "cluster file names its own nccl_version"
            )

    def source(self) -> str | dict[str, Any]:
        """What to pass to ``topologies.config.load_cluster``: the file path or the mapping."""
        if self.file is not None:
            return self.file
        mapping: dict[str, Any] = {"node": self.node, "num_nodes": self.num_nodes}
        if self.fabric is not None:
            mapping["fabric"] = self.fabric
        if self.oversubscription != 1.0:
            mapping["oversubscription"] = self.oversubscription
        if self.nccl_version is not None:
            mapping["nccl_version"] = self.nccl_version
        return mapping


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    """How the model is split, and the framework knobs that change the schedule (real defaults)."""

    tp: int = 1
    """Tensor-parallel degree t."""
    pp: int = 1
    """Pipeline-parallel degree p."""
    cp: int = 1
    """Context-parallel degree (sequence split across ranks for attention)."""
    dp: int = 0
    """Data-parallel degree; 0 means derived in resolve_plan as world / (tp * cp * pp)."""
    vpp: int = 1
    """Virtual pipeline chunks per rank v (> 1 only with the interleaved schedule)."""
    schedule: str = "1f1b"
    """Pipeline schedule: 1f1b | interleaved | gpipe | zb-h1."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (norms/dropout sharded over TP; AG/RS instead of AR)."""
    recompute: str = "none"
    """Activation recomputation: none | selective (attention core) | full (whole layer)."""
    recompute_modules: tuple[str, ...] | None = None
    """With ``recompute: selective``, the parts of each layer Megatron-Core reruns in the
    backward instead of keeping their activations (``--recompute-modules``;
    ``RECOMPUTE_MODULES``): ``core_attn`` the attention core, ``mla_up_proj`` multi-head latent
    attention's up projections and rotary (their Q, K and V not kept), ``mlp`` a dense layer's
    MLP, ``moe_act`` the experts' activation, ``layernorm`` the norms that are modules of their
    own (latent attention's input norm, an MoE layer's pre-MLP norm; their outputs not kept),
    ``shared_experts`` the shared experts' MLP. None: Megatron's default,
    ``[core_attn]``; the megatron stack only (``schedules.recompute_modules``)."""
    recompute_num_layers: int | None = None
    """With ``recompute: full``, recompute only the first N layers of each pipeline chunk and
    keep the others' activations (Megatron's ``--recompute-method block
    --recompute-num-layers N``); None: every layer."""
    data_parallel: str = "ddp"
    """ddp | zero1 | zero2 | zero3 | fsdp | hsdp | distributed_optimizer; ``fsdp2`` is read as
    fsdp with ``fsdp_version`` 2."""
    ddp_bucket_mb: float = 25.0
    """torch DDP bucket_cap_mb (MiB), default 25 (_DEFAULT_BUCKET_CAP_MB)."""
    ddp_first_bucket_mb: float = 1.0
    """torch DDP first-bucket cap after the rebuild in MiB (_DEFAULT_FIRST_BUCKET_BYTES = 1)."""
    ddp_gradient_as_bucket_view: bool = False
    """torch DDP gradient_as_bucket_view (default False: buckets are a second copy of the grads)."""
    fsdp_backward_prefetch: str = "backward_pre"
    """FSDP1 backward_prefetch: backward_pre | backward_post | none (default BACKWARD_PRE)."""
    fsdp_forward_prefetch: bool = False
    """FSDP1 forward_prefetch (default False)."""
    fsdp_limit_all_gathers: bool = True
    """FSDP1 limit_all_gathers: at most 2 unsharded units in flight (default True)."""
    fsdp_reshard_after_forward: bool | None = None
    """Free parameters after forward (FULL_SHARD) or keep them (SHARD_GRAD_OP); unset means the
    framework default: True without PP, False with PP (torchtitan reuses them per micro-batch)."""
    fsdp_version: int | None = None
    """1: ``FullyShardedDataParallel`` (FSDP1); 2: ``fully_shard`` (FSDP2, torchtitan). Unset: 1
    without PP, 2 with PP (torch.distributed.pipelining composes with FSDP2 only)."""
    fsdp_reduce_dtype: str | None = None
    """Gradient reduce-scatter dtype: fp32 | bf16. Unset: the framework default, fp32 for FSDP2
    (torchtitan ``mixed_precision_reduce = "float32"``) and bf16 for FSDP1 (``MixedPrecision``
    without ``reduce_dtype`` reduces in ``param_dtype``)."""
    fsdp_pp_reduce: str = "after_send"
    """Under pipelining, when FSDP2 reduce-scatters a stage's gradients: ``after_send`` (torch
    since pytorch/pytorch#166449, November 2025: the schedule's ``REDUCE_GRAD`` after the stage's
    last backward and its send) or ``before_send`` (earlier torch, read at 2.6.0:
    ``backward_maybe_with_nosync`` runs every unit's ``post_backward`` inside the last backward,
    each making the compute stream wait for the previous unit's reduce-scatter, so the
    backward's send waits for all but the last)."""
    hsdp_shard_size: int = 0
    """HSDP shard-group size; 0 means the GPUs of one node (HYBRID_SHARD's intra-node group)."""
    zero_bucket_elems: int = 500_000_000
    """DeepSpeed reduce_bucket_size in elements (default 5e8)."""
    zero_overlap_comm: bool | None = None
    """DeepSpeed overlap_comm; None means its default (True for stage 3, False for 1 and 2)."""
    zero_prefetch_bucket_elems: int = 50_000_000
    """DeepSpeed stage-3 prefetch_bucket_size in elements (default 5e7)."""
    zero_max_live_parameters: int = 1_000_000_000
    """DeepSpeed stage3_max_live_parameters in elements (default 1e9): gathered parameters the
    prefetcher may keep resident at once."""
    zero_param_persistence_threshold: int = 100_000
    """DeepSpeed stage3_param_persistence_threshold in elements (default 1e5): parameters this
    small stay gathered for the whole step (norms, biases) instead of being fetched each use."""
    zero_fetch: str = "prefetch"
    """How ZeRO-3 fetches parameters: ``prefetch`` (current DeepSpeed, read at v0.14-v0.16: per
    module, coalesced, prefetched along the recorded trace) or ``sync_per_weight`` (v0.3.x, 2021:
    one all-gather per weight after a device synchronize, no effective prefetch)."""
    offload_optimizer: str = "none"
    """DeepSpeed ``offload_optimizer.device``: none | cpu | nvme (nvme: zero3, ZeRO-Infinity);
    the optimizer steps on the CPU (``schedules.offload``)."""
    offload_param: str = "none"
    """DeepSpeed ``offload_param.device`` (zero3): none | cpu | nvme; for fsdp / hsdp ``cpu`` is
    FSDP's CPU offload (``CPUOffloadPolicy``: parameters, gradients and optimizer on the CPU)."""
    offload_pin_memory: bool | None = None
    """Page-locked host buffers: DeepSpeed ``pin_memory`` (default false), FSDP
    ``CPUOffloadPolicy.pin_memory`` (default true); unset: the framework's default."""
    offload_pipeline_read: bool = False
    """DeepSpeed ``offload_optimizer.pipeline_read``: overlap NVMe reads with CPU Adam."""
    offload_pipeline_write: bool = False
    """DeepSpeed ``offload_optimizer.pipeline_write``: overlap NVMe writes with CPU Adam."""
    overlap_grad_reduce: bool = True
    """Megatron --overlap-grad-reduce (DP reduction overlapped with the last backward)."""
    overlap_param_gather: bool = False
    """Megatron --overlap-param-gather (distributed optimizer only)."""
    grad_reduce_in_fp32: bool = True
    """Megatron-Core's ``DistributedDataParallelConfig.grad_reduce_in_fp32`` (distributed
    optimizer only): the gradient buffer, and the reduce-scatter over data parallelism, in fp32.
    Megatron-LM sets it for bf16 unless ``--grad-reduce-in-bf16`` or ``--main-grads-dtype bf16``
    is given; Megatron-Bridge's mixed-precision configs set it (``bf16_mixed``) and its
    performance recipes clear it. False: bf16, 2 bytes per gradient (``schedules.optimizer``)."""
    use_precision_aware_optimizer: bool = False
    """Megatron --use-precision-aware-optimizer (distributed optimizer only): Transformer
    Engine's FusedAdam keeps the optimizer state in the dtypes below, and on bf16 weights trained
    in bf16 or with delayed-scaling FP8 also the master weights, as the 16 bits an fp32 master
    weight adds to its bf16 weight (``store_param_remainders``): 2 bytes where Megatron's own
    fp32 copy takes 4 (``schedules.optimizer``)."""
    main_params_dtype: str = "fp32"
    """Megatron --main-params-dtype: fp32 | fp16 master weights (needs
    ``use_precision_aware_optimizer``)."""
    exp_avg_dtype: str = "fp32"
    """Megatron --exp-avg-dtype: fp32 | fp16 | bf16 | fp8, Adam's first moment as stored (needs
    ``use_precision_aware_optimizer``)."""
    exp_avg_sq_dtype: str = "fp32"
    """Megatron --exp-avg-sq-dtype: fp32 | fp16 | bf16 | fp8, Adam's second moment as stored
    (needs ``use_precision_aware_optimizer``)."""
    tp_comm_overlap: bool = False
    """Megatron/TE --tp-comm-overlap (userbuffer AG/RS overlapped with GEMMs; needs SP)."""
    pipeline_layers: tuple[int, ...] | None = None
    """Transformer layers per pipeline rank (pp entries) or per virtual stage (pp*vpp, order
    ``chunk * pp + rank``); unset: an even split (torchtitan's explicit per-stage split)."""
    first_stage_layers: int | None = None
    """Layers on the first pipeline rank (Megatron --decoder-first-pipeline-num-layers); the
    ranks between split the rest evenly."""
    last_stage_layers: int | None = None
    """Layers on the last pipeline rank (Megatron --decoder-last-pipeline-num-layers)."""
    embedding_as_layer: bool = False
    """The input embedding counts as one layer of the even split (Megatron
    --account-for-embedding-in-pipeline-split): the first rank holds one layer fewer."""
    loss_as_layer: bool = False
    """The LM head and loss count as one layer of the even split (Megatron
    --account-for-loss-in-pipeline-split): the last rank holds one layer fewer."""
    ep: int = 1
    """Expert-parallel degree (--expert-model-parallel-size): the routed experts of a layer are
    split over ep GPUs, which exchange tokens by all-to-all."""
    etp: int = 0
    """Expert tensor-parallel degree (--expert-tensor-parallel-size); 0 means tp (Megatron's
    default)."""
    moe_token_dispatcher: str = "alltoall"
    """How tokens reach their experts (--moe-token-dispatcher-type): alltoall | allgather | flex
    (DeepEP: each token sent once per destination node, ``schedules.moe.dispatch_bytes``)."""
    moe_permute_fusion: bool = False
    """Megatron-Core --moe-permute-fusion: Transformer Engine's fused permutation and
    un-permutation instead of the gather, scatter and sort kernels (megatron stack only,
    ``schedules.moe_kernels.MEGATRON_PERMUTE_BYTES``)."""
    moe_router_fusion: bool = False
    """Megatron-Core --moe-router-fusion: Transformer Engine's fused top-k, score and aux-loss
    kernels in the router (megatron stack only,
    ``schedules.moe_kernels.MEGATRON_ROUTER_KERNELS``)."""
    overlap_moe_expert_parallel_comm: bool = False
    """Megatron-Core --overlap-moe-expert-parallel-comm: each steady forward runs layer by layer
    with another micro-batch's backward, their token dispatches and combines beside the other's
    compute (``schedules.pipeline_schedules.a2a_overlap``); one more warmup forward. Without
    pipelining or on the interleaved schedule, alltoall dispatcher, ep > 1, no full recompute
    (megatron stack only)."""
    delay_wgrad_compute: bool = False
    """Megatron-Core --delay-wgrad-compute (with ``overlap_moe_expert_parallel_comm`` only): in a
    combined pass the experts' weight gradients run after their input gradients have been
    handed to the dispatch's backward all-to-all, so that all-to-all runs beside them too."""
    pp_scatter_gather: bool = True
    """Megatron's scatter-gather pipeline p2p (--scatter-gather-tensors-in-pipeline, default on;
    not applied with SP): each TP rank sends 1/t of the activation, the receiver all-gathers it
    over TP. Megatron-core (2023+) dropped it: set False for those versions without SP."""
    cp_rotate_method: str | None = None
    """How torch's context parallel (stacks eager and compile) exchanges K and V: ``allgather``
    (one all-gather per pass) or ``alltoall`` (a ring shift per round); unset: torchtitan's
    default, ``allgather`` (``schedules.context_parallel``)."""

    def __post_init__(self) -> None:
        _check_positive(self, "parallel", ("tp", "pp", "cp", "vpp", "ep"))
        if self.etp < 0:
            raise ValueError(f"parallel.etp must be >= 0 (0 = tp), got {self.etp}")
        _check_choice("parallel.moe_token_dispatcher", self.moe_token_dispatcher, MOE_DISPATCHERS)
        if self.dp < 0:
            raise ValueError(f"parallel.dp must be >= 0 (0 = derive), got {self.dp}")
        _check_choice("parallel.schedule", self.schedule, SCHEDULES)
        _check_choice("parallel.recompute", self.recompute, RECOMPUTE_MODES)
        if self.recompute_modules is not None:
            if self.recompute != "selective":
                raise ValueError(
                    f"parallel.recompute_modules needs recompute selective (Megatron reads "
                    f"--recompute-modules under selective granularity only), got "
                    f"recompute={self.recompute!r}"
                )
            for module in self.recompute_modules:
                if module == "moe":
                    raise ValueError(
                        "parallel.recompute_modules: moe (rerunning the whole MoE layer, its "
                        "all-to-alls included) is not modelled"
                    )
                _check_choice("parallel.recompute_modules", module, RECOMPUTE_MODULES)
            if len(set(self.recompute_modules)) != len(self.recompute_modules):
                raise ValueError(
                    f"parallel.recompute_modules lists a module twice: "
                    f"{', '.join(self.recompute_modules)}"
                )
        if self.recompute_num_layers is not None and (
            self.recompute_num_layers < 0 or self.recompute != "full"
        ):
            raise ValueError(
                f"parallel.recompute_num_layers={self.recompute_num_layers} needs recompute "
                f"full and a count >= 0, got recompute={self.recompute!r}"
            )
        if self.data_parallel == FSDP2_ALIAS:
            if self.fsdp_version not in (None, 2):
                raise ValueError(
                    f"parallel.data_parallel=fsdp2 contradicts "
                    f"parallel.fsdp_version={self.fsdp_version}"
                )
            object.__setattr__(self, "data_parallel", "fsdp")
            object.__setattr__(self, "fsdp_version", 2)
        _check_choice(
            "parallel.data_parallel", self.data_parallel, (*DATA_PARALLEL_KINDS, FSDP2_ALIAS)
        )
        if self.fsdp_version is not None and self.fsdp_version not in FSDP_VERSIONS:
            raise ValueError(f"parallel.fsdp_version must be 1 or 2, got {self.fsdp_version}")
        _check_choice("parallel.zero_fetch", self.zero_fetch, ZERO_FETCH_MODES)
        if self.fsdp_reduce_dtype is not None:
            _check_choice("parallel.fsdp_reduce_dtype", self.fsdp_reduce_dtype, REDUCE_DTYPES)
        _check_choice("parallel.fsdp_pp_reduce", self.fsdp_pp_reduce, FSDP_PP_REDUCE)
        _check_choice(
            "parallel.fsdp_backward_prefetch", self.fsdp_backward_prefetch, FSDP_BACKWARD_PREFETCH
        )
        ddp_buckets = ("ddp_bucket_mb", "ddp_first_bucket_mb")
        _check_positive(self, "parallel", (*ddp_buckets, "zero_bucket_elems"))
        _check_positive(
            self, "parallel", ("zero_prefetch_bucket_elems", "zero_max_live_parameters")
        )
        if self.zero_param_persistence_threshold < 0:
            raise ValueError(
                "parallel.zero_param_persistence_threshold must be >= 0, got "
                f"{self.zero_param_persistence_threshold}"
            )
        if self.hsdp_shard_size < 0:
            raise ValueError(f"parallel.hsdp_shard_size must be >= 0, got {self.hsdp_shard_size}")
        for name in ("first_stage_layers", "last_stage_layers"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"parallel.{name} must be >= 0, got {value}")
        _check_choice("parallel.offload_optimizer", self.offload_optimizer, OFFLOAD_DEVICES)
        _check_choice("parallel.offload_param", self.offload_param, OFFLOAD_DEVICES)
        if self.cp_rotate_method is not None:
            _check_choice("parallel.cp_rotate_method", self.cp_rotate_method, CP_ROTATE_METHODS)
        self._check_optimizer_dtypes()

    def _check_optimizer_dtypes(self) -> None:
        _check_choice("parallel.main_params_dtype", self.main_params_dtype, MAIN_PARAMS_DTYPES)
        for key in ("exp_avg_dtype", "exp_avg_sq_dtype"):
            _check_choice(f"parallel.{key}", getattr(self, key), OPTIMIZER_STATE_DTYPES)
        if self.use_precision_aware_optimizer:
            return
        for key in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            if getattr(self, key) != "fp32":
                raise ValueError(
                    f"parallel.{key}={getattr(self, key)} needs "
                    "parallel.use_precision_aware_optimizer=true (Megatron keeps fp32 without it)"
                )

    @property
    def fsdp2(self) -> bool:
        """Whether torch FSDP / HSDP run as FSDP2 (``fully_shard``): ``fsdp_version``, or its
        default (FSDP2 under pipelining); other data-parallel kinds do not read it."""
        return self.pp > 1 if self.fsdp_version is None else self.fsdp_version == 2

    @property
    def reduce_dtype_bytes(self) -> int:
        """Bytes per element of FSDP's gradient reduce-scatter (``fsdp_reduce_dtype``)."""
        dtype = self.fsdp_reduce_dtype or ("fp32" if self.fsdp2 else "bf16")
        return 4 if dtype == "fp32" else 2

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel degree: ``etp``, or tp when unset."""
        return self.etp or self.tp

    @property
    def model_parallel_size(self) -> int:
        """GPUs holding one replica of the model: tp * cp * pp."""
        return self.tp * self.cp * self.pp


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """The batch and the numeric precision of one optimizer step."""

    micro_batch_size: int
    """Sequences per micro-batch b (per data-parallel rank)."""
    global_batch_size: int
    """Sequences per optimizer step B."""
    precision: str = "bf16"
    """bf16 | fp16 (mixed precision, Adam) | fp8 (GEMMs in FP8, the rest bf16)."""
    flash_attention: bool = True
    """Fused attention kernel (no s x s scores stored); False stores them (Korthikanti et al.)."""
    stack: str | None = None
    """Which implementation runs the layers: ``eager`` (PyTorch eager, Hugging Face / torchtitan
    modules), ``compile`` (the same under ``torch.compile``) or ``megatron`` (Megatron-LM /
    Megatron-Core with fused kernels and Transformer Engine). Unset: ``megatron`` for
    ``distributed_optimizer`` plans, ``eager`` otherwise."""
    attention_backend: str = "cudnn"
    """The fused-attention kernel: ``cudnn`` (cuDNN fused attention: Transformer Engine, torch SDPA
    from 2.11 on Hopper, torchtitan from v0.2; FlashAttention-3 runs as fast) or ``flash2``
    (FlashAttention-2: torch SDPA's flash backend, the default up to torch 2.10 on Hopper)."""
    float8_recipe: str | None = None
    """torchao's float8 recipe on the eager and compile stacks (``Float8Linear``):
    ``tensorwise``, ``rowwise`` or ``rowwise_with_gw_hp``; unset means ``tensorwise`` for FP8
    plans on those stacks (``schedules.float8``). Needs ``precision: fp8``."""
    float8_all_gather: bool = False
    """FSDP2 all-gathers the float8 linear weights in float8 (torchao's
    ``enable_fsdp_float8_all_gather`` with ``precompute_float8_dynamic_scale_for_fsdp``);
    tensorwise only."""
    te_fp8_recipe: str | None = None
    """Transformer Engine's FP8 recipe on the megatron stack: ``delayed`` (``DelayedScaling``) or
    ``current`` (``Float8CurrentScaling``); unset means ``delayed`` for FP8 megatron plans
    (``schedules.transformer_engine``). Needs ``precision: fp8``."""
    fp8_param_gather: bool = False
    """Megatron --fp8-param-gather (Megatron-Bridge's ``fp8_param_gather``, on in its current-
    scaling recipes): the layers' linear weights are Transformer Engine FP8 tensors, with no bf16
    copy; the distributed optimizer all-gathers them at 1 byte each, casts its fp32 shard to FP8
    after the step, and each weight is transposed once per step instead of cast on the first
    micro-batch (``schedules.transformer_engine``). Needs ``precision: fp8``, the megatron stack
    and the distributed optimizer."""
    mixed_precision: str | None = None
    """How a torch DDP (or one-GPU) step keeps its weights for 16-bit training: ``autocast``
    (fp32 weights and gradients; ``torch.autocast`` casts every weight to bf16 in each forward
    and each weight gradient back: nanoGPT, the Hugging Face Trainer, ``commbench --step``) or
    ``bf16_weights`` (bf16 weights and gradients; the optimizer keeps fp32 master weights, copies
    the gradients in and the updated weights back: mixed-precision Adam as the ZeRO paper counts
    it, DeepSpeed's and Megatron's way). Unset: ``bf16_weights``; ``commbench --step`` records
    ``autocast``, which its loop runs. Megatron, FSDP and ZeRO have their own mixed precision
    (``parallel.data_parallel``)."""
    loss_parallel: bool = True
    """With tensor parallelism on the PyTorch stacks, the loss runs on vocabulary-sharded logits
    under torch's ``loss_parallel`` (torchtitan's default), whose DTensor handlers hold 16 bytes
    per local logit (``schedules.activations.LOSS_PARALLEL_LOGITS_BYTES_PER_ELEMENT``); false
    (torchtitan's ``disable_loss_parallel``) gathers the whole vocabulary's logits on every rank
    first (``schedules.memory.vocab_sharded_loss``). The gather's time is not priced."""
    compile_loss: bool | None = None
    """Whether ``torch.compile`` also compiles the cross-entropy (Inductor fuses the fp32 upcast,
    the log-softmax and its backward into reductions over the bf16 logits): unset means yes on
    the ``compile`` stack (torchtitan's ``compile.components`` default, a model whose forward
    returns the loss); false for a loop that compiles the model only. ``compile`` stack only."""
    cross_entropy_fusion: str | None = None
    """Which cross-entropy Megatron-Core runs over the vocabulary-parallel logits
    (``schedules.kernels.MEGATRON_CROSS_ENTROPY``): ``none``, the unfused loss (Megatron-LM's
    default); ``native`` (``--cross-entropy-loss-fusion``), the same passes fused by
    ``torch.compile``; ``te`` (with ``--cross-entropy-fusion-impl te``), Transformer Engine's
    Triton kernels from 2.18 on; ``te_inplace``, those kernels from 2.2 to 2.17, which wrote the
    gradient over the bf16 logits. Unset: ``none``. ``megatron`` stack only (setting it, ``none``
    included, implies that stack)."""

    repeat_kv: bool = True
    """With fewer K/V heads than query heads on the ``eager`` stack, whether K and V are copied
    to every query head before attention (torchtitan's ``repeat_kv``, Hugging Face's eager
    attention, ``commbench --step``'s ``repeat_interleave``): a copy each forward, a sum each
    backward, and the repeated copies kept for the backward. False where the attention call
    takes the grouped heads itself (``scaled_dot_product_attention(..., enable_gqa=True)``, torch
    2.5 and later, on a fused kernel; a profiler trace records the call's K/V heads). Only the
    ``eager`` stack reads it: the others price no repeat."""

    cuda_graphs: bool = False
    """Whether the transformer layers run as captured CUDA graphs, one per layer and pass
    (Megatron's ``--enable-cuda-graph`` through Transformer Engine's ``make_graphed_callables``;
    ``torch.compile(mode="reduce-overhead")`` over torchtitan's per-block compile): a graph
    replays its kernels from one host launch, so a layer's pass costs the host one launch
    instead of one per kernel (``sim.compute.compute_model.ComputeModel.piece_times``). The
    embedding, the head, the loss and the optimizer launch as before; an MoE layer with a
    dropless dispatcher (no ``moe_capacity_factor``) syncs the host on its token counts and is
    not captured."""

    fused_norm: bool | None = None
    """Whether an eager step's RMSNorm is one kernel: unset means yes (PyTorch's
    ``_fused_rms_norm`` behind ``nn.RMSNorm`` since pytorch/pytorch#153666, mid-2025); false for
    an older torch or a hand-written norm (``x * rsqrt(x.pow(2).mean(-1))`` in fp32, as Hugging
    Face's ``LlamaRMSNorm``), which runs as several elementwise kernels
    (``schedules.kernels.UNFUSED_RMSNORM_BYTES``). The compiled and Megatron stacks fuse it
    anyway."""

    def __post_init__(self) -> None:
        _check_positive(self, "training", ("micro_batch_size", "global_batch_size"))
        _check_choice("training.precision", self.precision, PRECISIONS)
        if self.stack is not None:
            _check_choice("training.stack", self.stack, STACKS)
        _check_choice("training.attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        self._check_float8()
        if self.mixed_precision is not None:
            _check_choice("training.mixed_precision", self.mixed_precision, MIXED_PRECISIONS)
        if self.compile_loss is not None and self.stack != "compile":
            raise ValueError(
                f"training.compile_loss needs training.stack=compile, got stack={self.stack}"
            )
        if not self.repeat_kv and not self.flash_attention:
            raise ValueError(
                "training.repeat_kv=false needs training.flash_attention=true: torch's unfused "
                "(math) attention repeats grouped K and V itself"
            )
        if self.cross_entropy_fusion is not None:
            _check_choice(
                "training.cross_entropy_fusion", self.cross_entropy_fusion, CROSS_ENTROPY_FUSIONS
            )
            if self.stack not in (None, "megatron"):
                raise ValueError(
                    "training.cross_entropy_fusion needs training.stack=megatron, got "
                    f"stack={self.stack}"
                )

    def _check_float8(self) -> None:
        recipe = self.float8_recipe
        if recipe is not None:
            _check_choice("training.float8_recipe", recipe, FLOAT8_RECIPES)
        if self.te_fp8_recipe is not None:
            _check_choice("training.te_fp8_recipe", self.te_fp8_recipe, TE_FP8_RECIPES)
        keys = {
            "float8_recipe": recipe is not None,
            "float8_all_gather": self.float8_all_gather,
            "te_fp8_recipe": self.te_fp8_recipe is not None,
            "fp8_param_gather": self.fp8_param_gather,
        }
        key = next((key for key, is_set in keys.items() if is_set), None)
        if key is not None and self.precision != "fp8":
            raise ValueError(
                f"training.{key} needs training.precision=fp8, got precision={self.precision}"
            )
        if self.float8_all_gather and recipe not in (None, "tensorwise"):
            raise ValueError(
                f"training.float8_all_gather needs float8_recipe tensorwise (torchao casts the "
                f"weight shard with one scale per tensor), got float8_recipe={recipe}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """One training configuration to simulate."""

    model: ModelConfig
    """The transformer."""
    cluster: ClusterConfig
    """Where it runs."""
    parallel: ParallelConfig
    """How it is split."""
    training: TrainingConfig
    """Batch and precision."""
    name: str = ""
    """Optional label."""
    description: str = ""
    """Optional free text."""
    whatif: WhatIf = field(default_factory=WhatIf)
    """What the cluster does wrong in this step (``schedules.whatif``; empty: nothing)."""
    base_dir: str = field(default="", compare=False)
    """Directory of the plan file (for relative cluster files); not a YAML key."""


_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "cluster": ClusterConfig,
    "parallel": ParallelConfig,
    "training": TrainingConfig,
}
_TOP_LEVEL_SCALARS = ("name", "description")


def _convert(key: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against the field's type hint; ints are accepted where floats are, floats
    must be finite, and the error for a key with a fixed set of choices lists them."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in options:
        return None
    for option in options:
        origin = typing.get_origin(option) or option
        if origin is bool and isinstance(value, bool):
            return value
        if origin is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if origin is float and isinstance(value, int | float) and not isinstance(value, bool):
            number = float("inf")  # float(10**400) raises OverflowError
            with contextlib.suppress(OverflowError):
                number = float(value)
            if not abs(number) < float("inf"):  # NaN or an infinity
                raise ValueError(f"{key} must be a finite number, got {shorten(value)}")
            return number
        if origin is str and isinstance(value, str):
            return value
        if origin is dict and isinstance(value, Mapping):
            return dict(value)
        if origin is tuple and isinstance(value, list | tuple) and str in typing.get_args(option):
            bad = [v for v in value if not isinstance(v, str)]
            if bad:
                raise ValueError(f"{key} must list names, got {shorten(bad[0])}")
            return tuple(value)
        if origin is tuple and isinstance(value, list | tuple):
            bad = [v for v in value if not isinstance(v, int) or isinstance(v, bool) or v < 0]
            if bad:
                raise ValueError(f"{key} must list integers >= 0, got {shorten(bad[0])}")
            return tuple(value)
    if int in options and isinstance(value, float) and value.is_integer():
        return int(value)
    # Keys checked against a fixed set (``_check_choice``); built here, on the error path only.
    choices: dict[str, tuple[str, ...]] = {
        "model.mlp_activation": tuple(MLP_ACTIVATIONS),
        "model.position_embedding": POSITION_EMBEDDINGS,
        "model.norm": NORMS,
        "parallel.schedule": SCHEDULES,
        "parallel.recompute": RECOMPUTE_MODES,
        "parallel.data_parallel": (*DATA_PARALLEL_KINDS, FSDP2_ALIAS),
        "parallel.fsdp_backward_prefetch": FSDP_BACKWARD_PREFETCH,
        "parallel.fsdp_reduce_dtype": REDUCE_DTYPES,
        "parallel.fsdp_pp_reduce": FSDP_PP_REDUCE,
        "parallel.zero_fetch": ZERO_FETCH_MODES,
        "parallel.offload_optimizer": OFFLOAD_DEVICES,
        "parallel.offload_param": OFFLOAD_DEVICES,
        "parallel.moe_token_dispatcher": MOE_DISPATCHERS,
        "parallel.cp_rotate_method": CP_ROTATE_METHODS,
        "parallel.main_params_dtype": MAIN_PARAMS_DTYPES,
        "parallel.exp_avg_dtype": OPTIMIZER_STATE_DTYPES,
        "parallel.exp_avg_sq_dtype": OPTIMIZER_STATE_DTYPES,
        "training.precision": PRECISIONS,
        "training.stack": STACKS,
        "training.attention_backend": ATTENTION_BACKENDS,
        "training.float8_recipe": FLOAT8_RECIPES,
        "training.te_fp8_recipe": TE_FP8_RECIPES,
        "training.cross_entropy_fusion": CROSS_ENTROPY_FUSIONS,
        "training.mixed_precision": MIXED_PRECISIONS,
    }
    got = f"got {shorten(value)} ({type(value).__name__})"
    nullable = " or null" if type(None) in options else ""
    if key in choices:
        hint = did_you_mean(value, choices[key]) if isinstance(value, str) else ""
        raise ValueError(f"{key} must be one of {', '.join(choices[key])}{nullable}, {got}{hint}")
    names = " or ".join(
        "null"
        if o is type(None)
        else "a list"
        if typing.get_origin(o) is tuple
        else getattr(o, "__name__", str(o))
        for o in options
    )
    hint = ""
    if isinstance(value, str) and (int in options or float in options):
        with contextlib.suppress(ValueError):  # YAML reads 5e8 (no dot) and '4' as text
            number = float(value)
            if not math.isfinite(number):
                raise ValueError  # too large for a float: no number to suggest
            plain = (
                str(int(number))
                if number.is_integer() and abs(number) < 1e16
                else _yaml_float(number)
            )  # YAML 1.1 reads 1e308 as text, 1.0e+308 as a number
            hint = f"; write it as a plain number: {plain}"
    raise ValueError(f"{key} must be {names}, {got}{hint}")


def _yaml_float(number: float) -> str:
    """``number`` as YAML 1.1 reads a float: a dot in the mantissa (``1.0e-300``, not
    ``1e-300``, which it reads as text)."""
    text = repr(number)
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text


RETIRED_KEYS = {
    "parallel.zero_allgather_bucket_elems": (
        "DeepSpeed ignores allgather_bucket_size when torch has all_gather_into_tensor (torch >= "
        "1.13; deepspeed/runtime/utils.py all_gather_dp_groups): ZeRO-1/2 gather the updated "
        "parameters in one call per parameter group, as simulated; remove the key"
    ),
}
"""Keys that were accepted once and that the frameworks no longer honour: why, in one line."""


NESTED_GROUPS = ("ddp", "fsdp", "hsdp", "zero", "offload")
"""``parallel`` sub-sections: ``parallel: {fsdp: {version: 2}}`` is ``parallel.fsdp_version: 2``
(each framework's knobs read as one group; the flat spelling stays valid)."""


def _flatten_groups(section: str, raw: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """``raw`` with its nested framework groups spelled as flat ``<group>_<key>`` fields."""
    known = set(fields)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in NESTED_GROUPS or not isinstance(value, Mapping):
            out[key] = value
            continue
        valid = sorted(f.removeprefix(f"{key}_") for f in known if f.startswith(f"{key}_"))
        for sub, item in value.items():
            flat = f"{key}_{sub}"
            if flat not in known:
                raise ValueError(
                    f"unknown key {shorten(f'{section}.{key}.{sub}')} in plan"
                    f"{did_you_mean(str(sub), valid)}; valid keys of {section}.{key}: "
                    f"{', '.join(valid)}"
                )
            if flat in raw:
                raise ValueError(f"{section}.{key}.{sub} and {section}.{flat} are the same key")
            out[flat] = item
    return out


def flatten_parallel(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A ``parallel`` mapping with its framework groups (``fsdp: {version: 2}``) spelled flat
    (``fsdp_version: 2``), so mappings from several sources can be laid key by key."""
    return _flatten_groups("parallel", raw, (f.name for f in dataclasses.fields(ParallelConfig)))


def _build_section(cls: type, section: str, raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        raise ValueError(f"plan section '{section}' must be a mapping, got {shorten(raw)}")
    if section == "parallel":
        raw = _flatten_groups(section, raw, (f.name for f in dataclasses.fields(cls)))
    for key in raw:
        reason = RETIRED_KEYS.get(f"{section}.{key}")
        if reason:
            raise ValueError(f"{section}.{key} is not a plan key: {reason}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "base_dir"}
    unknown = sorted((set(raw) - set(fields)), key=str)
    if unknown:
        raise ValueError(
            f"unknown key {shorten(section + '.' + str(unknown[0]))} in plan"
            f"{did_you_mean(str(unknown[0]), fields)}; valid keys: {', '.join(fields)}"
        )
    required = [
        name
        for name, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in raw]
    if missing:
        raise ValueError(f"missing key '{section}.{missing[0]}' in plan (required: {required})")
    kwargs = {k: _convert(f"{section}.{k}", v, hints[k]) for k, v in raw.items()}
    return cls(**kwargs)


def _check_mlp_keys(model: Any) -> None:
    if not isinstance(model, Mapping) or "mlp_activation" not in model or "gated_mlp" not in model:
        return
    activation, gated = model["mlp_activation"], model["gated_mlp"]
    if not isinstance(activation, str) or not isinstance(gated, bool):
        return  # the type check of each key names the problem
    if MLP_ACTIVATIONS.get(activation, gated) != gated:
        raise ValueError(
            f"model.mlp_activation={shorten(activation)} contradicts model.gated_mlp={gated} "
            f"(gated: {', '.join(a for a, g in MLP_ACTIVATIONS.items() if g)})"
        )


def load_plan(source: str | Path | Mapping[str, Any]) -> Plan:
    """Read a plan from a YAML file path or a mapping; unknown or missing keys are ValueErrors."""
    base_dir = ""
    if isinstance(source, str | Path):
        path = Path(source)
        text = read_input(path, what="plan", max_bytes=MAX_CONFIG_BYTES)
        raw = load_yaml(text, name=str(path))
        base_dir = str(path.resolve().parent)
    else:
        raw = source
    if not isinstance(raw, Mapping):
        raise ValueError(f"a plan must be a mapping with sections {', '.join(_SECTIONS)}")
    allowed = (*_SECTIONS, *_TOP_LEVEL_SCALARS, "whatif")
    unknown = sorted(set(raw) - set(allowed), key=str)
    if unknown:
        raise ValueError(
            f"unknown key {shorten(unknown[0])} in plan{did_you_mean(str(unknown[0]), allowed)}; "
            f"valid keys: {', '.join(allowed)}"
        )
    missing = [s for s in _SECTIONS if s not in raw and s != "parallel"]
    if missing:
        raise ValueError(f"missing section '{missing[0]}' in plan")
    raw = {**raw, "model": resolve_model_preset(raw.get("model"))}
    _check_mlp_keys(raw.get("model"))
    sections = {s: _build_section(cls, s, raw.get(s, {})) for s, cls in _SECTIONS.items()}
    scalars = {k: _convert(k, raw[k], str) for k in _TOP_LEVEL_SCALARS if k in raw}
    whatif = parse_whatif(raw.get("whatif"))
    return Plan(**sections, **scalars, whatif=whatif, base_dir=base_dir)


def plan_key_names() -> tuple[str, ...]:
    """Every key a plan file can give, as ``section.key`` (and the top-level ``name``,
    ``description``): what ``--set`` accepts."""
    keys = [
        f"{section}.{f.name}"
        for section, cls in _SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.name != "base_dir"
    ]
    return (*keys, "model.preset", *_TOP_LEVEL_SCALARS)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as a mapping that ``load_plan`` reads back to an equal plan."""
    out: dict[str, Any] = {s: dataclasses.asdict(getattr(plan, s)) for s in _SECTIONS}
    model = plan.model
    if model.head_dim * model.num_heads == model.hidden_size and not model.multi_latent:
        # the default: stays with the heads (latent attention always names its head width)
        out["model"]["head_dim"] = 0
    out.update({k: getattr(plan, k) for k in _TOP_LEVEL_SCALARS if getattr(plan, k)})
    if plan.whatif:
        out["whatif"] = plan.whatif.to_dict()
    return out


def num_microbatches(plan: Plan) -> int:
    """Micro-batches per optimizer step per pipeline, m = B / (b * dp); needs a resolved plan."""
    dp = plan.parallel.dp
    if dp <= 0:
        raise ValueError("num_microbatches needs a resolved plan (parallel.dp > 0): resolve_plan")
    return plan.training.global_batch_size // (plan.training.micro_batch_size * dp)
