"""The ``parallel``, ``training`` and (when the shape is given) ``model`` sections of Megatron-LM
arguments: parallel degrees, virtual stages and the pipeline split, sequence parallelism,
recompute, the distributed optimizer and overlaps, the batch, precision and the model's shape,
with Megatron's defaults for absent flags. ``shell`` turns the file (a list of flags or a launch
script) into the flags read here.

Sources: Megatron-LM core_v0.15.0 ``megatron/training/arguments.py`` (defaults and
``validate_args``) and ``megatron/core/transformer/transformer_config.py``.

    imported = from_megatron_args(Path("pretrain_llama3_8b.sh"))
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from fileio.strict import MAX_CONFIG_BYTES, TYPO_CUTOFF, did_you_mean, read_input, shorten
from schedules.importers.common import _KIND_NAMES, NOT_MODELLED, Imported
from schedules.importers.shell import _megatron_words, _parse_flags
from schedules.plan import RECOMPUTE_MODULES

_MEGATRON_FLAGS: dict[str, type] = {
    "--tensor-model-parallel-size": int,
    "--pipeline-model-parallel-size": int,
    "--context-parallel-size": int,
    "--num-layers-per-virtual-pipeline-stage": int,
    "--num-virtual-stages-per-pipeline-rank": int,
    "--decoder-first-pipeline-num-layers": int,
    "--decoder-last-pipeline-num-layers": int,
    "--account-for-embedding-in-pipeline-split": bool,
    "--account-for-loss-in-pipeline-split": bool,
    "--sequence-parallel": bool,
    "--recompute-granularity": str,
    "--recompute-method": str,
    "--recompute-num-layers": int,
    "--recompute-activations": bool,
    "--recompute-modules": list,
    "--use-distributed-optimizer": bool,
    "--overlap-grad-reduce": bool,
    "--overlap-param-gather": bool,
    "--tp-comm-overlap": bool,
    "--micro-batch-size": int,
    "--global-batch-size": int,
    "--num-layers": int,
    "--hidden-size": int,
    "--num-attention-heads": int,
    "--group-query-attention": bool,
    "--num-query-groups": int,
    "--ffn-hidden-size": int,
    "--kv-channels": int,
    "--qk-layernorm": bool,
    "--multi-latent-attention": bool,
    "--q-lora-rank": int,
    "--kv-lora-rank": int,
    "--qk-head-dim": int,
    "--qk-pos-emb-head-dim": int,
    "--v-head-dim": int,
    "--mtp-num-layers": int,
    "--mtp-use-repeated-layer": bool,
    "--seq-length": int,
    "--max-position-embeddings": int,
    "--swiglu": bool,
    "--squared-relu": bool,
    "--quick-geglu": bool,
    "--normalization": str,
    "--position-embedding-type": str,
    "--use-rotary-position-embeddings": bool,
    "--no-position-embedding": bool,
    "--untie-embeddings-and-output-weights": bool,
    "--disable-bias-linear": bool,
    "--add-qkv-bias": bool,
    "--attention-dropout": float,
    "--hidden-dropout": float,
    "--bf16": bool,
    "--fp16": bool,
    "--fp8-format": str,
    "--fp8-recipe": str,
    "--vocab-size": int,
    "--attention-backend": str,
    "--enable-cuda-graph": bool,
    "--external-cuda-graph": bool,
    "--cuda-graph-impl": str,
    "--num-experts": int,
    "--moe-router-topk": int,
    "--moe-ffn-hidden-size": int,
    "--moe-shared-expert-intermediate-size": int,
    "--moe-layer-freq": str,
    "--moe-expert-capacity-factor": float,
    "--expert-model-parallel-size": int,
    "--expert-tensor-parallel-size": int,
    "--moe-token-dispatcher-type": str,
    "--moe-grouped-gemm": bool,
    "--moe-pad-expert-input-to-capacity": bool,
    "--moe-permute-fusion": bool,
    "--moe-router-num-groups": int,
    "--moe-router-group-topk": int,
    "--moe-enable-deepep": bool,
    "--moe-flex-dispatcher-backend": str,
    "--overlap-moe-expert-parallel-comm": bool,
    "--delay-wgrad-compute": bool,
    "--moe-router-fusion": bool,
    "--cross-entropy-loss-fusion": bool,
    "--cross-entropy-fusion-impl": str,
    "--accumulate-allreduce-grads-in-fp32": bool,
    "--grad-reduce-in-bf16": bool,
    "--use-precision-aware-optimizer": bool,
    "--main-grads-dtype": str,
    "--main-params-dtype": str,
    "--exp-avg-dtype": str,
    "--exp-avg-sq-dtype": str,
    "--fp8-param-gather": bool,
}
"""The flags read (arguments.py, core_v0.15.0) and their argparse types; bool: store_true."""
_MEGATRON_NOISE = frozenset({
    "--lr", "--min-lr", "--lr-decay-style", "--lr-decay-iters", "--lr-decay-samples",
    "--lr-warmup-iters", "--lr-warmup-fraction", "--lr-warmup-samples", "--train-iters",
    "--train-samples", "--weight-decay", "--clip-grad", "--adam-beta1", "--adam-beta2",
    "--adam-eps", "--init-method-std", "--seed", "--rotary-base", "--rotary-percent",
    "--norm-epsilon", "--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file",
    "--data-path", "--train-data-path", "--valid-data-path", "--test-data-path", "--split",
    "--data-cache-path", "--mock-data", "--num-workers", "--save", "--load", "--save-interval",
    "--no-load-optim", "--no-load-rng", "--ckpt-format", "--eval-interval", "--eval-iters",
    "--log-interval", "--log-throughput", "--log-params-norm", "--log-num-zeros-in-grad",
    "--tensorboard-dir", "--log-timers-to-tensorboard", "--wandb-project", "--wandb-exp-name",
    "--wandb-save-dir", "--exit-duration-in-mins", "--distributed-backend",
    "--distributed-timeout-minutes", "--use-mcore-models", "--loss-scale",
    "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis",
    "--moe-aux-loss-coeff", "--moe-z-loss-coeff", "--moe-router-load-balancing-type",
    "--moe-router-score-function", "--moe-router-pre-softmax", "--moe-router-topk-scaling-factor",
    "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "--moe-router-dtype",
    "--moe-router-num-groups", "--moe-router-group-topk", "--rotary-scaling-factor",
    "--mscale", "--mscale-all-dim", "--rope-type",
})  # fmt: skip
"""Flags that change nothing a step costs: learning rate and optimizer hyperparameters, the
number of steps, initialisation, rotary base, data, tokenizer files, checkpointing, logging and
the fp16 loss-scale dynamics. Counted in the warning, not listed."""
_ASKS = {
    "give model.vocab_size": "model.vocab_size",
    "depends on the world size: left out": "training.global_batch_size",
}
"""Lines that ask for a plan key (their ending -> the key): a plan giving it answers them."""
_MEGATRON_CHOICES = {
    "--recompute-granularity": ("full", "selective"),
    "--recompute-method": ("uniform", "block"),
    "--normalization": ("LayerNorm", "RMSNorm"),
    "--position-embedding-type": ("learned_absolute", "rope", "mrope", "relative", "none"),
    "--fp8-format": ("e4m3", "hybrid"),
    "--fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise"),
    "--attention-backend": ("flash", "fused", "unfused", "local", "auto"),
    "--moe-token-dispatcher-type": ("allgather", "alltoall", "alltoall_seq", "flex"),
    "--cross-entropy-fusion-impl": ("native", "te"),
    "--main-grads-dtype": ("fp32", "bf16"),
    "--main-params-dtype": ("fp32", "fp16"),
    "--exp-avg-dtype": ("fp32", "fp16", "bf16", "fp8"),
    "--exp-avg-sq-dtype": ("fp32", "fp16", "bf16", "fp8"),
}


class _Flags:
    """Parsed ``--flag value`` arguments: typed reads naming the file and flag, and the flags
    no read asked for."""

    def __init__(self, file: str, values: dict[str, list[str]]) -> None:
        self.file, self.values = file, values
        self.read: set[str] = set()
        self.ignored: list[str] = []

    def has(self, flag: str) -> bool:
        return flag in self.values

    def get(self, flag: str, default: Any = None) -> Any:
        kind = _MEGATRON_FLAGS[flag]
        self.read.add(flag)
        if flag not in self.values:
            return default
        values = self.values[flag]
        if kind is bool:
            if values:
                raise ValueError(f"{self.file}: {flag} takes no value, got {shorten(values[0])}")
            return True
        if kind is list:
            return values
        if len(values) != 1:
            raise ValueError(f"{self.file}: {flag} needs one value, got {shorten(values)}")
        text = values[0]
        if "$" in text:
            raise ValueError(
                f"{self.file}: {flag} {text} is a shell variable the file does not set"
            )
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(
                f"{self.file}: {flag} must be {_KIND_NAMES[kind]}, got {shorten(text)}"
            ) from None
        choices = _MEGATRON_CHOICES.get(flag)
        if choices and value not in choices:
            raise ValueError(
                f"{self.file}: {flag} must be one of {', '.join(choices)}, got {shorten(text)}"
            )
        return value

    def left(self) -> list[str]:
        """A line per flag no read asked for; ``_MEGATRON_NOISE`` goes to ``ignored``."""
        unread = [flag for flag in self.values if flag not in self.read]
        self.ignored = [flag for flag in unread if flag in _MEGATRON_NOISE]
        return [  # a typo of a flag the importer reads is named
            f"{self.file}: {flag}{did_you_mean(flag, _MEGATRON_FLAGS, cutoff=TYPO_CUTOFF)} "
            f"{NOT_MODELLED}"
            for flag in unread
            if flag not in self.ignored
        ]


def from_megatron_args(path: Path) -> Imported:
    """``parallel``, ``training`` and (when the shape is given) ``model`` sections of Megatron-LM
    arguments: a file of ``--flag value`` lines or a launch script (``torchrun ...
    pretrain_gpt.py --...`` with continued lines, variables and bash arrays; only the arguments
    after the ``.py`` script are read). Megatron's defaults apply to absent flags: LayerNorm,
    learned positions, GeLU, biases, tied embeddings, dropout 0.1, no overlapped grad reduce.
    ``model.name`` is the file's stem; the vocabulary comes from ``--vocab-size`` only."""
    file = Path(path).name
    words, notes = _megatron_words(
        read_input(path, what="Megatron arguments", max_bytes=MAX_CONFIG_BYTES), file
    )
    values, parse_notes = _parse_flags(words, file)
    flags = _Flags(file, values)
    notes += parse_notes
    model = _megatron_model(flags, Path(path).stem, notes)
    parallel = _megatron_parallel(flags, notes)
    training = _megatron_training(flags, model is not None, notes)
    sections = {"model": model, "parallel": parallel, "training": training}
    warnings = (*notes, *flags.left())
    asks = {line: key for line in warnings for tail, key in _ASKS.items() if line.endswith(tail)}
    return Imported(
        sections={k: v for k, v in sections.items() if v}, file=file, warnings=warnings,
        ignored=tuple(flags.ignored), asks=asks,
    )  # fmt: skip


def _megatron_parallel(flags: _Flags, notes: list[str]) -> dict[str, Any]:
    """Degrees, virtual stages, the split, SP, recompute and the data-parallel kind."""
    parallel: dict[str, Any] = {}
    for key, flag in (("tp", "--tensor-model-parallel-size"),
                      ("pp", "--pipeline-model-parallel-size"),
                      ("cp", "--context-parallel-size")):  # fmt: skip
        if flags.has(flag):
            parallel[key] = flags.get(flag)
            if parallel[key] < 1:
                raise ValueError(f"{flags.file}: {flag} must be >= 1, got {parallel[key]}")
    tp, pp = parallel.get("tp", 1), parallel.get("pp", 1)
    vpp = _megatron_vpp(flags, pp)
    if vpp > 1:
        parallel.update(vpp=vpp, schedule="interleaved")
    edges = (
        ("--decoder-first-pipeline-num-layers", "first_stage_layers"),
        ("--decoder-last-pipeline-num-layers", "last_stage_layers"),
        ("--account-for-embedding-in-pipeline-split", "embedding_as_layer"),
        ("--account-for-loss-in-pipeline-split", "loss_as_layer"),
    )
    parallel.update({key: flags.get(flag) for flag, key in edges if flags.has(flag)})
    if flags.get("--sequence-parallel") and tp == 1:
        notes.append(
            f"{flags.file}: --sequence-parallel with tp 1: Megatron turns it off (ignored)"
        )
    elif flags.get("--sequence-parallel"):
        parallel["sequence_parallel"] = True
    recompute, recompute_layers = _megatron_recompute(flags, pp * vpp, notes)
    if recompute:
        parallel["recompute"] = recompute
    if recompute_layers is not None:
        parallel["recompute_num_layers"] = recompute_layers
    if recompute == "selective":
        modules = _megatron_recompute_modules(flags, notes)
        if modules is not None:
            parallel["recompute_modules"] = modules
    if flags.get("--use-distributed-optimizer"):
        parallel["data_parallel"] = "distributed_optimizer"
    else:
        parallel["data_parallel"] = "ddp"
        notes.append(
            f"{flags.file}: no --use-distributed-optimizer: Megatron's DDP (one all-reduce of "
            "the gradient buffer in buckets) is priced as data_parallel ddp"
        )
    parallel["overlap_grad_reduce"] = bool(flags.get("--overlap-grad-reduce"))
    parallel.update(_megatron_optimizer_states(flags, parallel["data_parallel"], notes))
    for flag, key in (("--overlap-param-gather", "overlap_param_gather"),
                      ("--tp-comm-overlap", "tp_comm_overlap")):  # fmt: skip
        if flags.get(flag):
            parallel[key] = True
    if pp > 1 and tp > 1 and not parallel.get("sequence_parallel"):
        parallel["pp_scatter_gather"] = False  # Megatron-Core has no scatter-gather p2p path
    parallel.update(_megatron_moe_parallel(flags, notes))
    return parallel


def _megatron_optimizer_states(flags: _Flags, kind: str, notes: list[str]) -> dict[str, Any]:
    """The distributed optimizer's dtypes (``schedules.optimizer_states``) as ``validate_args``
    sets them: the gradient buffer is bf16 when bf16 training gives ``--grad-reduce-in-bf16``
    or ``--main-grads-dtype bf16``, and fp16 for fp16 training without
    ``--accumulate-allreduce-grads-in-fp32`` (only bf16 turns it on by itself); the
    precision-aware optimizer's state dtypes as given, with the distributed optimizer only
    (``optimizer/__init__.py``: "only supported with distributed optimizer")."""
    parallel: dict[str, Any] = {}
    main_grads = flags.get("--main-grads-dtype") or "fp32"
    accumulate = flags.get("--accumulate-allreduce-grads-in-fp32")
    if accumulate and main_grads != "fp32":
        raise ValueError(
            f"{flags.file}: --main-grads-dtype {main_grads} with "
            "--accumulate-allreduce-grads-in-fp32 (Megatron refuses the pair)"
        )
    aware = bool(flags.get("--use-precision-aware-optimizer"))
    if aware and kind != "distributed_optimizer":
        raise ValueError(
            f"{flags.file}: --use-precision-aware-optimizer without --use-distributed-optimizer "
            "(Megatron refuses it)"
        )
    dtypes = {
        key: flags.get(flag) or "fp32"
        for flag, key in (("--main-params-dtype", "main_params_dtype"),
                          ("--exp-avg-dtype", "exp_avg_dtype"),
                          ("--exp-avg-sq-dtype", "exp_avg_sq_dtype"))
    }  # fmt: skip
    if not aware and (main_grads != "fp32" or set(dtypes.values()) != {"fp32"}):
        raise ValueError(
            f"{flags.file}: --main-grads-dtype, --main-params-dtype, --exp-avg-dtype and "
            "--exp-avg-sq-dtype other than fp32 need --use-precision-aware-optimizer"
        )
    fp32_grads = True  # fp32 training (no --bf16 or --fp16): the buffer is the weights' fp32
    if flags.get("--bf16"):
        fp32_grads = not (flags.get("--grad-reduce-in-bf16") or main_grads == "bf16")
    elif flags.get("--fp16"):
        fp32_grads = bool(accumulate)
    if kind != "distributed_optimizer":
        if flags.get("--grad-reduce-in-bf16") or accumulate:
            notes.append(
                f"{flags.file}: the gradient dtype flags describe Megatron's DDP buffer, priced "
                "as data_parallel ddp's bf16 gradients"
            )
        return parallel
    if not fp32_grads:
        parallel["grad_reduce_in_fp32"] = False
    if aware:
        parallel["use_precision_aware_optimizer"] = True
        parallel.update({key: value for key, value in dtypes.items() if value != "fp32"})
    return parallel


def _megatron_vpp(flags: _Flags, pp: int) -> int:
    """Virtual stages per rank, as ``validate_args`` derives them."""
    stages = flags.get("--num-virtual-stages-per-pipeline-rank")
    per_stage = flags.get("--num-layers-per-virtual-pipeline-stage")
    if stages is not None and per_stage is not None:
        raise ValueError(
            f"{flags.file}: give one of --num-virtual-stages-per-pipeline-rank and "
            "--num-layers-per-virtual-pipeline-stage (Megatron refuses both)"
        )
    for flag, value in (("--num-virtual-stages-per-pipeline-rank", stages),
                        ("--num-layers-per-virtual-pipeline-stage", per_stage)):  # fmt: skip
        if value is not None and value < 1:
            raise ValueError(f"{flags.file}: {flag} must be >= 1, got {value}")
    if per_stage is None:
        return stages or 1
    layers = flags.get("--num-layers")
    if layers is None:
        raise ValueError(
            f"{flags.file}: --num-layers-per-virtual-pipeline-stage needs --num-layers"
        )
    layers += sum(
        bool(flags.get(f"--account-for-{part}-in-pipeline-split")) for part in ("embedding", "loss")
    )
    if layers % pp or (layers // pp) % per_stage:
        raise ValueError(
            f"{flags.file}: --num-layers-per-virtual-pipeline-stage {per_stage} does not divide "
            f"the {layers}/{pp} layers of a pipeline stage"
        )
    return layers // pp // per_stage


def _megatron_recompute(
    flags: _Flags, num_chunks: int, notes: list[str]
) -> tuple[str | None, int | None]:
    granularity = flags.get("--recompute-granularity")
    if flags.get("--recompute-activations"):  # the old flag: selective
        granularity = granularity or "selective"
    method, count = flags.get("--recompute-method"), flags.get("--recompute-num-layers")
    modules = flags.get("--recompute-modules")
    if granularity is None:
        if method or count:
            notes.append(f"{flags.file}: --recompute-method without a granularity (ignored)")
        return None, None
    if granularity == "selective":
        return "selective", None
    if modules:
        notes.append(f"{flags.file}: --recompute-modules under full granularity (ignored)")
    if method is None or count is None:
        raise ValueError(
            f"{flags.file}: --recompute-granularity full needs --recompute-method and "
            "--recompute-num-layers (Megatron-Core refuses it without them)"
        )
    layers = (flags.get("--num-layers") or 0) + sum(  # the layers of a typical stage
        bool(flags.get(f"--account-for-{part}-in-pipeline-split")) for part in ("embedding", "loss")
    )
    per_chunk = layers // num_chunks
    if method == "uniform" and count > 1:
        notes.append(
            f"{flags.file}: --recompute-method uniform --recompute-num-layers {count} keeps "
            f"one input per {count} layers: priced as full recompute of each layer"
        )
    elif method == "block" and count < per_chunk:
        return "full", count  # the first `count` layers of each chunk; the others keep theirs
    return "full", None


MEGATRON_FP8_RECIPES = {"delayed": "delayed", "tensorwise": "current"}
"""``--fp8-recipe`` (Megatron-LM's default ``delayed``) -> ``training.te_fp8_recipe``:
Transformer Engine's ``DelayedScaling`` and ``Float8CurrentScaling``."""


def _megatron_fp8_recipe(flags: _Flags, notes: list[str]) -> dict[str, Any]:
    """``--fp8-recipe`` as ``training.te_fp8_recipe``; the block-scaled recipes (``mxfp8``,
    ``blockwise``) are priced as current scaling, with a note."""
    recipe = flags.get("--fp8-recipe")
    if recipe is None:
        return {}
    if recipe not in MEGATRON_FP8_RECIPES:
        notes.append(
            f"{flags.file}: --fp8-recipe {recipe} (block scaling) is not modelled: priced as "
            "current scaling (tensorwise)"
        )
        return {"te_fp8_recipe": "current"}
    return {"te_fp8_recipe": MEGATRON_FP8_RECIPES[recipe]}


def _megatron_recompute_modules(flags: _Flags, notes: list[str]) -> list[str] | None:
    """``--recompute-modules`` as ``parallel.recompute_modules`` (None: unset, Megatron's
    default ``core_attn``; an empty list reruns nothing, as Megatron reads it); ``moe`` (the whole
    MoE layer) is not modelled and left out, with a note."""
    modules = flags.get("--recompute-modules")
    if modules is None:
        return None
    unknown = [m for m in modules if m not in (*RECOMPUTE_MODULES, "moe")]
    if unknown:
        raise ValueError(
            f"{flags.file}: --recompute-modules {shorten(unknown[0])} is not one of "
            f"{', '.join((*RECOMPUTE_MODULES, 'moe'))}"
        )
    if "moe" in modules:
        notes.append(
            f"{flags.file}: --recompute-modules moe (the whole MoE layer rerun) is not modelled "
            "(left out)"
        )
    return list(dict.fromkeys(m for m in modules if m != "moe"))  # [] reruns nothing


def _megatron_model(flags: _Flags, name: str, notes: list[str]) -> dict[str, Any] | None:
    """The model of the arguments, or None when no shape flag is given."""
    shape = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length")
    if not any(flags.has(flag) for flag in shape):
        return None
    missing = [flag for flag in shape if not flags.has(flag)]
    if missing:
        raise ValueError(f"{flags.file}: {missing[0]} missing (a model needs {', '.join(shape)})")
    layers, hidden, heads, seq_len = (flags.get(flag) for flag in shape)
    for flag, value in zip(shape, (layers, hidden, heads, seq_len), strict=True):
        if value < 1:
            raise ValueError(f"{flags.file}: {flag} must be >= 1, got {value}")
    kv_heads = heads
    if flags.get("--group-query-attention"):
        kv_heads = flags.get("--num-query-groups", 1)
        if kv_heads < 1:
            raise ValueError(f"{flags.file}: --num-query-groups must be >= 1, got {kv_heads}")
    elif flags.get("--num-query-groups") is not None:
        notes.append(f"{flags.file}: --num-query-groups without --group-query-attention (ignored)")
    kv_channels = flags.get("--kv-channels")
    if kv_channels is not None and kv_channels < 1:
        raise ValueError(f"{flags.file}: --kv-channels must be >= 1, got {kv_channels}")
    latent = _megatron_latent_attention(flags, notes)
    if latent:
        kv_heads, kv_channels = heads, None
    activation = _megatron_activation(flags, notes)
    default_ffn = int(4 * hidden * 2 / 3 / 64) * 64 if activation == "swiglu" else 4 * hidden
    model = {
        "name": name,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "ffn_hidden_size": flags.get("--ffn-hidden-size", default_ffn),
        "vocab_size": _megatron_vocab(flags, notes),
        "seq_len": seq_len,
        **({"head_dim": kv_channels} if kv_channels and kv_channels * heads != hidden else {}),
        **({"qk_norm": True} if flags.get("--qk-layernorm") and not latent else {}),
        **latent,
        "mlp_activation": activation,
        "norm": {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}[
            flags.get("--normalization", "LayerNorm")
        ],
        "position_embedding": _megatron_positions(flags, seq_len, notes),
        "tied_embeddings": not flags.get("--untie-embeddings-and-output-weights"),
        "linear_bias": not flags.get("--disable-bias-linear"),
        "dropout": max(flags.get(f"--{k}-dropout", 0.1) for k in ("attention", "hidden")) > 0,
    }
    model.update(_megatron_moe_model(flags, layers, notes))
    depths = flags.get("--mtp-num-layers")
    if depths is not None:
        if depths < 0:
            raise ValueError(f"{flags.file}: --mtp-num-layers must be >= 0, got {depths}")
        model["mtp_num_layers"] = depths
        if flags.get("--mtp-use-repeated-layer") and depths > 1:
            notes.append(
                f"{flags.file}: --mtp-use-repeated-layer is not modelled: each of the {depths} "
                "depths is counted with a layer of its own"
            )
    if flags.get("--add-qkv-bias") and not model["linear_bias"]:
        notes.append(
            f"{flags.file}: --add-qkv-bias puts biases on QKV only; linear_bias is "
            "all-or-none: left off"
        )
    return {k: v for k, v in model.items() if v is not None}


MEGATRON_LATENT_DEFAULTS = {
    "--kv-lora-rank": 32,
    "--qk-head-dim": 128,
    "--qk-pos-emb-head-dim": 64,
    "--v-head-dim": 128,
}
"""Megatron-LM's defaults of the latent-attention flags (``arguments.py``; ``--q-lora-rank``
defaults to None: the query projected directly)."""


def _megatron_latent_attention(flags: _Flags, notes: list[str]) -> dict[str, Any]:
    """``--multi-latent-attention`` and its widths as the model's latent-attention keys (none
    without the flag: its width flags are then noted as ignored). Megatron's
    ``--qk-layernorm`` is the latent norms there, which the model always has."""
    keys = {
        "--kv-lora-rank": "kv_lora_rank",
        "--qk-head-dim": "head_dim",
        "--qk-pos-emb-head-dim": "qk_rope_head_dim",
        "--v-head-dim": "v_head_dim",
    }
    if not flags.get("--multi-latent-attention"):
        for flag in (*keys, "--q-lora-rank"):
            if flags.has(flag):
                notes.append(f"{flags.file}: {flag} without --multi-latent-attention (ignored)")
                flags.get(flag)
        return {}
    latent: dict[str, Any] = {}
    for flag, key in keys.items():
        value = flags.get(flag, MEGATRON_LATENT_DEFAULTS[flag])
        if value < (1 if key != "qk_rope_head_dim" else 0):
            raise ValueError(f"{flags.file}: {flag} must be >= 1, got {value}")
        latent[key] = value
    q_lora = flags.get("--q-lora-rank")
    if q_lora is not None and q_lora < 1:
        raise ValueError(f"{flags.file}: --q-lora-rank must be >= 1, got {q_lora}")
    latent["q_lora_rank"] = q_lora or 0
    if not flags.get("--qk-layernorm"):
        notes.append(
            f"{flags.file}: --multi-latent-attention without --qk-layernorm: the latent norms are "
            "priced anyway (every released latent-attention model has them)"
        )
    for flag in ("--kv-channels", "--num-query-groups"):
        if flags.has(flag):
            flags.get(flag)
            notes.append(f"{flags.file}: {flag} with --multi-latent-attention (ignored)")
    return latent


def _megatron_moe_model(flags: _Flags, layers: int, notes: list[str]) -> dict[str, Any]:
    """The MoE keys of the model (none without ``--num-experts``): experts, top-k, widths, the
    capacity factor and which layers are MoE (``--moe-layer-freq``: every n-th layer, or
    Megatron's pattern ``([0]*k+[1]*m)`` of k leading dense layers)."""
    experts = flags.get("--num-experts")
    if not experts:
        return {}
    moe: dict[str, Any] = {"num_experts": experts, "moe_top_k": flags.get("--moe-router-topk", 2)}
    for flag, key in (("--moe-ffn-hidden-size", "moe_ffn_hidden_size"),
                      ("--moe-shared-expert-intermediate-size",
                       "moe_shared_expert_ffn_hidden_size"),
                      ("--moe-expert-capacity-factor", "moe_capacity_factor"),
                      ("--moe-router-num-groups", "moe_router_num_groups"),
                      ("--moe-router-group-topk", "moe_router_group_topk")):  # fmt: skip
        if flags.get(flag) is not None:
            moe[key] = flags.get(flag)
    freq = flags.get("--moe-layer-freq")
    if freq is not None:
        moe.update(_moe_layer_pattern(flags.file, freq, layers))
    pad = flags.get("--moe-pad-expert-input-to-capacity")
    if pad and moe.get("moe_capacity_factor") is None:
        raise ValueError(
            f"{flags.file}: --moe-pad-expert-input-to-capacity needs "
            "--moe-expert-capacity-factor (Megatron refuses it without one)"
        )
    if moe.get("moe_capacity_factor") is not None and not pad:
        notes.append(
            f"{flags.file}: --moe-expert-capacity-factor without "
            "--moe-pad-expert-input-to-capacity: priced as padded to capacity (static shapes, "
            "no host synchronisation)"
        )
    if not flags.get("--moe-grouped-gemm"):
        notes.append(
            f"{flags.file}: no --moe-grouped-gemm: Megatron runs the local experts one after "
            "another (SequentialMLP); priced as a grouped GEMM"
        )
    return moe


def _moe_layer_pattern(file: str, text: str, layers: int) -> dict[str, int]:
    """``--moe-layer-freq``: an integer n (every n-th layer is MoE) or Megatron's Python list
    expression of 0 (dense) and 1 (MoE) per layer (``([0]+[1]*23)``, ``([1]*1+[0]*1)*12``), as
    the plan's ``moe_first_dense_layers`` k and ``moe_layer_freq`` n: k dense layers, then every
    n-th one MoE. A list of another shape is refused."""
    number = text.strip()
    if number.isascii() and number.isdigit() and len(number) <= 9:
        if int(number) < 1:
            raise ValueError(f"{file}: --moe-layer-freq must be >= 1, got {number}")
        return {} if int(number) == 1 else {"moe_layer_freq": int(number)}
    pattern = _layer_list(text, limit=max(layers, 1))
    bad = f"{file}: --moe-layer-freq {shorten(text)}"
    if pattern is None or len(pattern) != layers or set(pattern) - {0, 1} or 1 not in pattern:
        raise ValueError(
            f"{bad} must be an integer >= 1 or a list of 0s and 1s, one per layer of the "
            f"--num-layers {layers} (as ([0]*k+[1]*m)), with at least one MoE layer"
        )
    dense = pattern.index(1)
    rest = pattern[dense:]
    ones = [i for i, v in enumerate(rest) if v]
    freq = ones[1] - ones[0] if len(ones) > 1 else len(rest)
    if rest != [int(i % freq == 0) for i in range(len(rest))]:
        raise ValueError(f"{bad}: only k dense layers followed by every n-th layer MoE is modelled")
    found = {"moe_first_dense_layers": dense, "moe_layer_freq": freq}
    return {k: v for k, v in found.items() if v != (0 if k == "moe_first_dense_layers" else 1)}


MAX_LAYER_LIST_CHARS = 4096
"""Longest ``--moe-layer-freq`` list expression read (Megatron's own are a few dozen characters)."""


def _layer_list(text: str, *, limit: int) -> list[int] | None:
    """The value of a list expression of integer lists, ``+`` and ``*`` by small integers (what
    Megatron's ``moe_freq_type`` evaluates), or None for anything else, for a list (or a part)
    longer than ``limit`` and for an expression too long or too deeply nested to read."""
    if len(text) > MAX_LAYER_LIST_CHARS:
        return None

    def value(node: ast.AST) -> list[int] | int | None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            items = [value(e) for e in node.elts]
            ints = [i for i in items if type(i) is int]
            return ints if len(ints) == len(items) and len(ints) <= limit else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right if len(left) + len(right) <= limit else None
            if isinstance(node.op, ast.Mult):
                if isinstance(right, list):
                    left, right = right, left
                if isinstance(left, list) and type(right) is int and right >= 0:
                    return left * right if len(left) * right <= limit else None
        return None

    try:
        result = value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, RecursionError, MemoryError):
        return None
    return result if isinstance(result, list) else None


def _megatron_moe_parallel(flags: _Flags, notes: list[str]) -> dict[str, Any]:
    """Expert parallelism, the dispatcher (Megatron's default: allgather) and Megatron-Core's
    MoE fusions; without ``--num-experts`` an expert-parallel degree above 1 is refused (as
    Megatron does) and the other MoE flags are ignored."""
    parallel: dict[str, Any] = {}
    moe_flags = ("--expert-model-parallel-size", "--expert-tensor-parallel-size",
                 "--moe-token-dispatcher-type", "--moe-permute-fusion",
                 "--moe-router-fusion", "--overlap-moe-expert-parallel-comm",
                 "--delay-wgrad-compute", "--moe-enable-deepep",
                 "--moe-flex-dispatcher-backend")  # fmt: skip
    if not flags.get("--num-experts"):
        if (flags.get("--expert-model-parallel-size") or 1) > 1:
            raise ValueError(
                f"{flags.file}: --expert-model-parallel-size "
                f"{flags.get('--expert-model-parallel-size')} needs --num-experts"
            )
        notes += [f"{flags.file}: {f} without --num-experts (ignored)" for f in moe_flags
                  if flags.has(f) and f != "--expert-model-parallel-size"]  # fmt: skip
        return parallel
    for key, flag in (("ep", "--expert-model-parallel-size"),
                      ("etp", "--expert-tensor-parallel-size")):  # fmt: skip
        value = flags.get(flag)
        if value is not None:
            if value < 1:
                raise ValueError(f"{flags.file}: {flag} must be >= 1, got {value}")
            parallel[key] = value
    dispatcher = flags.get("--moe-token-dispatcher-type")
    backend = flags.get("--moe-flex-dispatcher-backend")
    if dispatcher == "flex" and backend not in (None, "deepep"):  # DeepEP is the default
        notes.append(f"{flags.file}: the flex dispatcher's {backend} backend is priced as DeepEP")
    if dispatcher == "alltoall_seq":
        notes.append(
            f"{flags.file}: --moe-token-dispatcher-type {dispatcher} is priced as alltoall"
        )
        dispatcher = "alltoall"
    parallel["moe_token_dispatcher"] = dispatcher or "allgather"
    for flag, key in (("--moe-permute-fusion", "moe_permute_fusion"),
                      ("--moe-router-fusion", "moe_router_fusion"),
                      ("--overlap-moe-expert-parallel-comm",
                       "overlap_moe_expert_parallel_comm"),
                      ("--delay-wgrad-compute", "delay_wgrad_compute")):  # fmt: skip
        if flags.get(flag):
            parallel[key] = True
    return parallel


def _megatron_activation(flags: _Flags, notes: list[str]) -> str:
    if flags.get("--swiglu"):
        return "swiglu"
    for flag, priced in (("--squared-relu", "relu"), ("--quick-geglu", "geglu")):
        if flags.get(flag):
            notes.append(f"{flags.file}: {flag} is not modelled: priced as {priced}")
            return priced
    return "gelu"


def _megatron_positions(flags: _Flags, seq_len: int, notes: list[str]) -> str:
    kind = flags.get("--position-embedding-type", "learned_absolute")
    if flags.get("--use-rotary-position-embeddings"):
        kind = "rope"
    if flags.get("--no-position-embedding") and kind == "learned_absolute":
        kind = "none"  # add_position_embedding off: no table, no positions
    positions = flags.get("--max-position-embeddings")
    if kind == "learned_absolute" and positions not in (None, seq_len):
        notes.append(
            f"{flags.file}: the learned position table has --max-position-embeddings "
            f"{positions} rows; the plan counts seq_len x hidden_size"
        )
    if kind in ("mrope", "relative"):
        notes.append(f"{flags.file}: --position-embedding-type {kind}: priced as rope")
    return {"learned_absolute": "learned", "none": "none"}.get(kind, "rope")


def _megatron_vocab(flags: _Flags, notes: list[str]) -> int | None:
    vocab = flags.get("--vocab-size")
    if vocab is None:
        tokenizer = flags.values.get("--tokenizer-model") or flags.values.get("--tokenizer-type")
        source = f" ({shorten(' '.join(tokenizer))})" if tokenizer else ""
        notes.append(
            f"{flags.file}: no --vocab-size: the vocabulary comes from the tokenizer{source}: "
            "give model.vocab_size"
        )
    return vocab


def _megatron_training(flags: _Flags, has_model: bool, notes: list[str]) -> dict[str, Any]:
    """Batch, precision (fp8 > bf16 > fp16), attention kernel and ``stack: megatron``."""
    training: dict[str, Any] = {}
    micro, global_batch = flags.get("--micro-batch-size"), flags.get("--global-batch-size")
    if micro is not None:
        training["micro_batch_size"] = micro
    if global_batch is not None:
        training["global_batch_size"] = global_batch
    elif micro is not None:
        notes.append(
            f"{flags.file}: no --global-batch-size: Megatron uses micro-batch-size x the "
            "data-parallel size, which depends on the world size: left out"
        )
    if flags.get("--bf16") and flags.get("--fp16"):
        raise ValueError(f"{flags.file}: --bf16 and --fp16 together (Megatron refuses both)")
    if flags.get("--fp8-format"):
        training["precision"] = "fp8"
        training.update(_megatron_fp8_recipe(flags, notes))
        if flags.get("--fp8-param-gather"):
            training["fp8_param_gather"] = True
    elif flags.get("--bf16") or flags.get("--fp16"):
        if flags.get("--fp8-param-gather"):
            notes.append(f"{flags.file}: --fp8-param-gather without --fp8-format: no FP8 weights")
        training["precision"] = "bf16" if flags.get("--bf16") else "fp16"
    elif has_model or micro is not None:
        notes.append(f"{flags.file}: no --bf16 or --fp16: fp32 training is not modelled")
    if flags.get("--attention-backend") in ("unfused", "local"):
        training["flash_attention"] = False
    graphs = flags.get("--cuda-graph-impl")
    if (
        flags.get("--enable-cuda-graph")
        or flags.get("--external-cuda-graph")
        or (graphs not in (None, "none"))
    ):
        training["cuda_graphs"] = True  # the layers captured, one graph per layer and pass
    impl = flags.get("--cross-entropy-fusion-impl", "native")
    if flags.get("--cross-entropy-loss-fusion"):
        # Megatron-LM accepts the pair up to core_v0.18, before Transformer Engine 2.18
        training["cross_entropy_fusion"] = "te_inplace" if impl == "te" else impl
        if impl == "te":
            notes.append(
                f"{flags.file}: --cross-entropy-fusion-impl te priced as Transformer Engine "
                "before 2.18 (the gradient written over the bf16 logits): Megatron-LM takes the "
                "pair up to core_v0.18 and refuses it from core_v0.19; set "
                "training.cross_entropy_fusion: te for Transformer Engine 2.18 or later"
            )
    training["stack"] = "megatron"
    return training
