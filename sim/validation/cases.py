"""Published training runs as commsim plans: which ones can be replayed, and their step time.

The runs in ``refdata/validation/cases.json`` (shipped with the project) are described in each
paper's own words ("full (uniform, every transformer layer)", "FP8 (Transformer Engine) + BF16",
"Megatron-Core distributed optimizer (ZeRO-1-like)", "not stated"). This module reads every field
it needs robustly and turns a run into a plain plan mapping (the plan-file format: ``model``,
``cluster``, ``parallel``, ``training``) that goes through ``schedules.plan.load_plan``, or says
which knob is missing so that the run cannot be simulated faithfully. The measured step time comes
from ``sim.validation.measured`` (the source's own FLOP formula where it reported throughput).

    mapping = map_case(load_cases(DEFAULT_CASES_PATH)[0]); mapping.plan["parallel"]["tp"]
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fileio.strict import load_json, read_input, shorten
from refdata import CASES_PATH
from schedules.plan import CROSS_ENTROPY_FUSIONS, MOE_DISPATCHERS
from sim.validation.measured import (
    Measurement,
    as_integer,
    measured_memory_gib,
    measured_step_time,
)

DEFAULT_CASES_PATH = CASES_PATH
"""Where ``commsim validate`` looks for the cases when none is given (the shipped file)."""

SOURCES: dict[str, str] = {
    "narayanan21": "Narayanan et al. SC21 (Megatron-LM), A100",
    "korthikanti22": "Korthikanti et al. 2022 (activation recomputation), A100",
    "megatron_readme": "Megatron-LM README (H100 weak/strong scaling)",
    "nemo2407": "NeMo 24.07 performance tables (H100, FP8)",
    "fsdp_vldb23": "Zhao et al. VLDB23 (PyTorch FSDP), A100",
    "bloom176B": "BLOOM 176B (Jean Zay, A100)",
    "mtnlg530B": "Smith et al. 2022 (MT-NLG 530B), A100",
    "opt175B": "Zhang et al. 2022 (OPT-175B), A100",
    "mcoremoe": "Megatron-Core MoE (README and MoE model zoo), H100",
    "torchtitan": "torchtitan benchmarks (FSDP2, TP, torch.compile, Float8), H100 and H200",
    "mbridge": (
        "Megatron-Bridge performance summary (NeMo 25.09, 26.04.01 and 26.06 containers), H100"
    ),
}
"""Short source key (the case-id prefix) -> the publication it comes from."""

_PRE_FLASH_ATTENTION = ("narayanan21", "korthikanti22", "bloom176B", "mtnlg530B", "opt175B")
"""Sources whose runs predate FlashAttention (2022): Megatron's fused softmax kept s x s scores."""
MOE_MODEL_KEYS = (
    "num_experts",
    "moe_top_k",
    "moe_ffn_hidden_size",
    "moe_shared_expert_ffn_hidden_size",
    "moe_layer_freq",
    "moe_first_dense_layers",
    "moe_capacity_factor",
    "moe_router_num_groups",
    "moe_router_group_topk",
)
"""Model keys of an MoE run, spelled as in a plan."""
LATENT_MODEL_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")
"""Multi-head latent attention's model keys, spelled as in a plan."""
OPTIMIZER_STATE_KEYS = (
    "grad_reduce_in_fp32", "use_precision_aware_optimizer", "main_params_dtype", "exp_avg_dtype",
    "exp_avg_sq_dtype",
)  # fmt: skip
"""``parallel`` keys of a case carried to the plan as they are (``schedules.optimizer_states``:
Megatron's gradient buffer dtype and precision-aware optimizer)."""
MOE_PARALLEL_KEYS = ("ep", "etp", "moe_token_dispatcher", "moe_permute_fusion", "moe_router_fusion")
"""Expert-parallel keys of an MoE run, spelled as in a plan."""
_MODEL_KEYS = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size", "seq_len")
_NODE_FOR_GPU: dict[str, tuple[str | dict[str, str], str]] = {
    "a100-sxm-80gb": ("dgx-a100", "ib-hdr"),
    "h100-sxm": ("dgx-h100", "ib-ndr"),
    "h200": ("hgx-h200", "ib-ndr"),
    "b200": ("dgx-b200", "ib-ndr"),
    "gb200": ("gb200-nvl72", "ib-ndr"),
    # Meta's Grand Teton: an HGX H100 baseboard with 96 GB parts, RoCE back-end network.
    "h100-96gb-500w": ({"base": "dgx-h100", "gpu": "h100-96gb-500w"}, "roce-400g"),
}
"""Node preset (or node mapping) and fabric preset of each GPU type a case can name."""
_PYTORCH_NATIVE = ("torchtitan", "fsdp2", "fully_shard", "torch.compile")
"""Wording that marks a run on PyTorch-native modules (eager or compiled), not Megatron's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseMapping:
    """One published run: the plan that replays it, or the knobs that are missing."""

    case_id: str
    """The case's ``id`` in cases.json."""
    source: str
    """Short source key (a key of ``SOURCES``)."""
    gpu: str | None
    """GPU key of ``topologies.hardware.GPUS`` (``None`` when not recognised)."""
    num_gpus: int | None
    """World size of the run (``None`` when the source gives a range)."""
    plan: dict[str, Any] | None
    """The plan mapping (plan-file format); ``None`` when a knob is missing."""
    missing: tuple[str, ...]
    """Knobs (or facts) the source does not state, each with what it says instead."""
    assumptions: tuple[str, ...]
    """Choices made where the source is ambiguous, e.g. fp16 for "16-bit mixed precision"."""
    measured: Measurement | None
    """The measured step time, or ``None`` when the source gives none usable."""
    table: str = ""
    """Where in the source the run is reported, shortened (e.g. "Table 1", "Section 6.3")."""
    measured_memory_gib: float | None = None
    """Peak memory per GPU the source reports (GiB), or ``None``."""

    @property
    def simulable(self) -> bool:
        """Whether the run can be simulated faithfully and compared."""
        return self.plan is not None and self.measured is not None and not self.missing


def load_cases(path: str | Path) -> list[dict[str, Any]]:
    """The list of cases in a cases.json file (FileNotFoundError / ValueError on bad input:
    not UTF-8 JSON, not a list of cases with ids, no case, an id given twice)."""
    try:
        data = load_json(read_input(path, what="cases file"), name=str(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed input: {path}: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(c, dict) and "id" in c for c in data):
        raise ValueError(f"{path}: expected a JSON list of cases, each with an 'id'")
    if not data:
        raise ValueError(f"{path}: no cases (an empty list)")
    seen: dict[str, int] = {}
    for index, case in enumerate(data):
        case_id = str(case["id"])
        if case_id in seen:
            raise ValueError(
                f"{path}: case id {shorten(case_id)} given twice (cases {seen[case_id] + 1} "
                f"and {index + 1})"
            )
        seen[case_id] = index
    return data


def source_table(case: dict[str, Any]) -> str:
    """The table (or section) of the source that reports the run, e.g. "Table 2"; "" if none."""
    text = str((case.get("source") or {}).get("table") or "")
    match = re.search(r"Table \d+|Section [\d.]*\d|Appendix [A-Z]", text)
    return match.group(0) if match else ""


def source_key(case_id: str) -> str:
    """The short source key of a case id (its prefix up to the first underscore, or a known key)."""
    for key in SOURCES:
        if case_id.startswith(key):
            return key
    return case_id.split("_", 1)[0]


# --- robust field parsing ---


def parse_gpu(text: Any) -> str | None:
    """GPU key of the catalogue from the source's wording ("A100-SXM4-80GB", "H100 (SXM, 80GB)")."""
    t = str(text or "").lower().replace(" ", "")
    if "a100" in t and "80" in t and "pcie" not in t:
        return "a100-sxm-80gb"
    if "h100" in t and ("hbm2e" in t or "96gb" in t or "500w" in t):
        return "h100-96gb-500w"
    if "h100" in t and "pcie" not in t:
        return "h100-sxm"
    if "h200" in t:
        return "h200"
    if "gb200" in t:  # the superchip's B200 at 1,200 W, in NVL72 racks
        return "gb200"
    if "b200" in t:  # a DGX / HGX B200
        return "b200"
    return None


def parse_precision(text: Any) -> tuple[str | None, str | None]:
    """(precision, assumption) from e.g. "fp16 mixed precision (--fp16 ...)", "FP8 (...) + BF16"."""
    t = str(text or "").lower()
    if "fp8" in t:
        return "fp8", None
    if "bf16" in t:
        return "bf16", None
    if "fp16" in t:
        return "fp16", None
    if "16-bit" in t:
        return "fp16", "precision '16-bit mixed precision' taken as fp16 (same A100 peak as bf16)"
    return None, None


def parse_float8(text: Any) -> dict[str, Any]:
    """torchao's float8 recipe and float8 all-gather from the precision wording, e.g. "FP8
    (torchao Float8Linear, rowwise dynamic scaling) + BF16", "... enable_fsdp_float8_all_gather":
    the plan keys, none where the wording names neither."""
    t = str(text or "").lower().replace("-", "_")
    keys: dict[str, Any] = {}
    if re.search(r"rowwise[_ ]with[_ ]gw[_ ]hp|gw_hp", t):
        keys["float8_recipe"] = "rowwise_with_gw_hp"
    elif re.search(r"\brow[_ ]?wise\b", t):
        keys["float8_recipe"] = "rowwise"
    elif re.search(r"\btensor[_ ]?wise\b", t):
        keys["float8_recipe"] = "tensorwise"
    if "enable_fsdp_float8_all_gather" in t or "float8 all_gather" in t:
        keys["float8_all_gather"] = True
    return keys


def parse_te_fp8(text: Any) -> dict[str, Any]:
    """Transformer Engine's FP8 recipe from the precision wording, e.g. "FP8 current scaling
    (Transformer Engine, fp8_cs) + BF16": the plan key, none where the wording names neither."""
    t = str(text or "").lower().replace("-", "_")
    if re.search(r"current[_ ]scaling|\bfp8_?cs\b", t):
        return {"te_fp8_recipe": "current"}
    if re.search(r"delayed[_ ]scaling", t):
        return {"te_fp8_recipe": "delayed"}
    return {}


def parse_cross_entropy_fusion(parallel: dict[str, Any], missing: list[str]) -> dict[str, Any]:
    """Megatron-Core's cross-entropy implementation where the case names it
    (``cross_entropy_fusion``: one of ``CROSS_ENTROPY_FUSIONS``, read in the run's configuration,
    the reading in ``cross_entropy_fusion_source``): the plan key, else none (Megatron-LM's
    default, the unfused loss). Another value is a missing knob."""
    value = parallel.get("cross_entropy_fusion")
    if value is None:
        return {}
    if value not in CROSS_ENTROPY_FUSIONS:
        missing.append(f"cross_entropy_fusion ({shorten(value)})")
        return {}
    return {"cross_entropy_fusion": value}


def parse_recompute(text: Any) -> tuple[str | None, str | None]:
    """(mode, problem): mode in none|selective|full, or a problem naming the unsupported wording."""
    t = str(text or "").strip().lower()
    if t in ("", "not stated") or t.startswith("not stated"):
        return None, f"recompute ({text or 'absent'})"
    if "microbatch-level" in t:
        return None, f"recompute mode '{text}' (no knob for micro-batch-level recomputation)"
    if t.startswith(("none", "no ")) or t == "no":
        return "none", None
    if re.search(r"\bper[- ]op\b|'op'|\bop sac\b|\bop-level\b", t):
        return "op", None
    if t.startswith("selective"):
        return "selective", None
    if t.startswith("full") or "(full)" in t:
        return "full", None
    return None, f"recompute '{text}' (not one of none|selective|full)"


def parse_data_parallel(parallel: dict[str, Any]) -> tuple[str | None, dict[str, Any], str | None]:
    """(data_parallel kind, framework knobs, problem) from zero_stage / dp_impl / fsdp wording."""
    if parallel.get("fsdp"):
        text = str(parallel["fsdp"]).lower()
        version = 2 if "fsdp2" in text or "fully_shard" in text else None
        return "fsdp", ({"fsdp_version": version} if version else {}), None
    stage = parallel.get("zero_stage", 0)
    knobs: dict[str, Any] = {}
    if parallel.get("dp_grad_allreduce_overlap") is False:
        knobs["overlap_grad_reduce"] = False
    text = str(stage).lower()
    if "distributed optimizer" in text:
        return "distributed_optimizer", knobs, None
    match = re.match(r"\s*([0-3])\b", text)
    if match is None:
        return None, knobs, f"zero_stage ({stage})"
    level = int(match.group(1))
    if level == 3 and parallel.get("zero3_fetch"):
        knobs["zero_fetch"] = parallel["zero3_fetch"]  # the DeepSpeed release the run used
    if level > 0:
        return f"zero{level}", knobs, None
    if "megatron local ddp" in str(parallel.get("dp_impl", "")).lower():
        # Megatron's 2021 local DDP all-reduced the fp32 main grads once after the backward pass.
        knobs["overlap_grad_reduce"] = False
    return "ddp", knobs, None


def parse_vpp(parallel: dict[str, Any]) -> tuple[int | None, str | None]:
    """(virtual pipeline chunks per rank, problem); irrelevant (1) without pipeline parallelism."""
    pp = as_integer(parallel.get("pp")) or 1
    value = parallel.get("virtual_pipeline_stages", 1)
    vpp = as_integer(value)
    if vpp is not None:
        return vpp, None
    if pp == 1:
        return 1, None
    return None, f"virtual_pipeline_stages ({value})"


def parse_schedule(parallel: dict[str, Any], vpp: int) -> str:
    """Pipeline schedule: interleaved when there are virtual stages, else (PipeDream-flush) 1F1B."""
    text = str(parallel.get("pipeline_schedule", "")).lower()
    if vpp > 1 or "interleaved" in text:
        return "interleaved"
    if "gpipe" in text:
        return "gpipe"
    return "1f1b"


def parse_stack(case: dict[str, Any]) -> str:
    """The kernel stack: the case's ``stack``; else ``compile`` or ``eager`` for runs on
    PyTorch-native modules (torchtitan, FSDP2, ``torch.compile``), ``megatron`` for the rest
    (Megatron-LM, NeMo, DeepSpeed-Megatron: fused kernels)."""
    if case.get("stack"):
        return str(case["stack"])
    parallel = case.get("parallel") or {}
    text = f"{case.get('source') or ''} {parallel} {case.get('notes') or ''}".lower()
    if not any(word in text for word in _PYTORCH_NATIVE):
        return "megatron"
    compiled = parallel.get("compile")
    if isinstance(compiled, bool):
        return "compile" if compiled else "eager"
    return "compile" if "torch.compile" in str(parallel).lower() else "eager"


TORCHTITAN_UNCOMPILED_LOSS = ("2024-12-18", "2025-04-02")
"""Dates of the torchtitan commits between which ``training.compile`` compiled the model but not
the loss: e8977b0 (2024-12-18, "turning off compile on loss function": "compiling loss function
causes CUDA errors") and bbb1b61 (2025-04-02, ``build_cross_entropy_loss`` compiles it again)."""


def version_date(case: dict[str, Any], package: str) -> str | None:
    """The date the source's ``versions`` gives ``package`` (``torch 1963fc8 (2024-12-23)``:
    ``2024-12-23``), or None."""
    source = case.get("source") or {}
    versions = str(source.get("versions", "")) if isinstance(source, dict) else ""
    found = re.search(rf"\b{package} [0-9a-z.+]+ \((\d{{4}}-\d{{2}}-\d{{2}})\)", versions)
    return found.group(1) if found else None


def parse_compile_loss(case: dict[str, Any]) -> bool | None:
    """``False`` for a compiled torchtitan run at a commit that left the loss uncompiled (the
    date in the source's ``versions``, ``TORCHTITAN_UNCOMPILED_LOSS``), else None (the stack's
    default)."""
    date = version_date(case, "torchtitan")
    start, end = TORCHTITAN_UNCOMPILED_LOSS
    return False if date is not None and start <= date < end else None


FUSED_RMS_NORM_SINCE = "2025-07-09"
"""No torch before this date ran ``nn.RMSNorm`` as one CUDA kernel: pytorch/pytorch#153666 (the
fused RMSNorm) was still to land on 2025-07-09 (pytorch/pytorch#157345, "nn.rmsnorm is super
slower than nn.layernorm", torch 2.6) and was in the nightlies by mid-August 2025."""


def parse_fused_norm(case: dict[str, Any]) -> bool | None:
    """``False`` for a run whose source dates its torch before ``FUSED_RMS_NORM_SINCE``, else
    None (the plan default: fused)."""
    date = version_date(case, "torch")
    return False if date is not None and date < FUSED_RMS_NORM_SINCE else None


SEPARATE_PROJECTION_SOURCES = ("torchtitan",)
"""Sources whose model code has separate q, k, v and gate / up linears
(``model.separate_projections``): torchtitan's Llama (``models/llama/model.py`` at 9dec370 and
``models/llama3/model.py`` at 820504e: ``wq``, ``wk``, ``wv``, ``w1``, ``w3``)."""


PP_REDUCE_GRAD_SINCE = "2025-10-28"
"""pytorch/pytorch#166449 ("[pp] Add reduce_grad Action", opened 2025-10-28) moved FSDP2's
gradient reduction under pipelining to a ``REDUCE_GRAD`` action after the last backward's send;
a run whose source dates its torch before it reduced inside the last backward, before the send
(``parallel.fsdp_pp_reduce: before_send``, read at torch 2.6.0)."""


def parse_fsdp_pp_reduce(case: dict[str, Any]) -> str | None:
    """``before_send`` for a run whose source dates its torch before ``PP_REDUCE_GRAD_SINCE``,
    else None (the plan default, ``after_send``)."""
    date = version_date(case, "torch")
    return "before_send" if date is not None and date < PP_REDUCE_GRAD_SINCE else None


_CUDA_GRAPHS = re.compile(r"\bcuda[- ]?graph")
_NO_CUDA_GRAPHS = re.compile(
    r"\b(no|without|disabled?|off)\W+(\w+\W+)?cuda[- ]?graph|\bcuda[- ]?graphs?\W+(off|disabled)\b"
)


def parse_cuda_graphs(case: dict[str, Any]) -> bool:
    """Whether the run captured its layers in CUDA graphs: a ``cuda_graphs`` key in the case
    or its parallel section, else the words "CUDA graph(s)" there, not negated."""
    parallel = case.get("parallel") or {}
    for section in (case, parallel):
        flag = section.get("cuda_graphs")
        if flag is not None:
            return _FLAGS.get(str(flag).strip().lower(), False)
    text = f"{parallel} {case.get('notes') or ''}".lower()
    return bool(_CUDA_GRAPHS.search(text)) and not _NO_CUDA_GRAPHS.search(text)


def parse_attention_backend(text: Any) -> str:
    """``flash2`` where the case says FlashAttention-2 ran, else ``cudnn`` (the plan default)."""
    t = str(text or "").lower().replace(" ", "").replace("-", "")
    return "flash2" if any(w in t for w in ("flash2", "flashattention2", "fa2")) else "cudnn"


_ARCHITECTURES: dict[str, dict[str, Any]] = {
    # Megatron GPT (Narayanan, Korthikanti) and NeMo's GPT-3: GeLU MLP, LayerNorm, biases,
    # dropout 0.1, learned positions, output layer tied to the word embeddings.
    "gpt": {
        "mlp_activation": "gelu",
        "norm": "layernorm",
        "linear_bias": True,
        "dropout": True,
        "position_embedding": "learned",
        "tied_embeddings": True,
    },
    "llama": {
        "mlp_activation": "swiglu",
        "norm": "rmsnorm",
        "linear_bias": False,
        "dropout": False,
        "position_embedding": "rope",
        "tied_embeddings": False,
    },
    # Nemotron: squared-ReLU (ungated) MLP, LayerNorm, no biases, RoPE, untied embeddings.
    "nemotron": {
        "mlp_activation": "relu",
        "norm": "layernorm",
        "linear_bias": False,
        "dropout": False,
        "position_embedding": "rope",
        "tied_embeddings": False,
    },
}
"""Model-section keys of each architecture family, from the sources' model descriptions."""


def parse_architecture(model: dict[str, Any]) -> dict[str, Any]:
    """Architecture keys of the plan's model section, from the family named in the case."""
    arch = f"{model.get('arch') or ''} {model.get('name') or ''}".lower()
    family = "gpt"
    if "swiglu" in arch or "llama" in arch:
        family = "llama"
    elif "nemotron" in arch:
        family = "nemotron"
    keys = dict(_ARCHITECTURES[family])
    if "untied" in arch:
        keys["tied_embeddings"] = False
    return keys


PARALLEL_BLOCK_KEYS = (
    "parallel_block",
    "parallel_attention",
    "parallel_attn",
    "parallel_residual",
    "use_parallel_residual",
)
"""Model keys that say whether attention and the MLP run side by side (the plan's, then the
names of PaLM-style configs, Falcon's and GPT-NeoX's)."""
WINDOW_KEYS = ("attention_window", "sliding_window", "window_size")
"""Model keys giving a sliding attention window (the plan's, Hugging Face's, Megatron's
``--window-size``, whose list form (left, right) gives the left side)."""
_PARALLEL_BLOCK_WORDS = re.compile(
    r"parallel (transformer )?block|parallel attention|parallel residual|\bptb\b"
)
_WINDOW_WORDS = re.compile(r"sliding[- ]window|\bswa\b")
_FLAGS = {"true": True, "1": True, "yes": True, "on": True,
          "false": False, "0": False, "no": False, "off": False}  # fmt: skip


def parse_block_shape(model: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The plan's ``parallel_block`` and ``attention_window`` from a case's model section (its
    keys, else words of its architecture), and an assumption where a sliding window is named
    without its width."""
    text = f"{model.get('arch') or ''} {model.get('name') or ''}".lower()
    keys: dict[str, Any] = {}
    given_flag = next((model[k] for k in PARALLEL_BLOCK_KEYS if k in model), None)
    flag = _FLAGS.get(str(given_flag).strip().lower()) if given_flag is not None else None
    if flag or (flag is None and _PARALLEL_BLOCK_WORDS.search(text)):
        keys["parallel_block"] = True
    given = next((model[k] for k in WINDOW_KEYS if k in model), None)
    if isinstance(given, list | tuple):
        given = given[0] if given else None
    window = as_integer(given)
    if window:
        keys["attention_window"] = window
        return keys, []
    if given is None and _WINDOW_WORDS.search(text):
        return keys, ["sliding-window attention named without its width: full causal attention"]
    return keys, []


# --- case -> plan ---


def _model_section(model: dict[str, Any], missing: list[str]) -> dict[str, Any]:
    section: dict[str, Any] = {"name": str(model.get("name", "model"))}
    for key in _MODEL_KEYS:
        value = as_integer(model.get(key))
        if value is None:
            missing.append(f"model.{key} ({model.get(key)})")
        section[key] = value
    section["num_kv_heads"] = as_integer(model.get("num_kv_heads")) or section["num_heads"]
    for key in ("head_dim", "qk_norm", *LATENT_MODEL_KEYS):  # head widths; Qwen3's QK norm
        if key in model:
            section[key] = model[key]
    if "mtp_num_layers" in model and model["mtp_num_layers"] not in (0, None):
        depths = as_integer(model["mtp_num_layers"])
        if depths is None:
            missing.append(f"model.mtp_num_layers ({shorten(model['mtp_num_layers'])})")
        else:
            section["mtp_num_layers"] = depths
    section.update(parse_architecture(model))
    for key in MOE_MODEL_KEYS:  # mixture-of-experts runs carry the plan's own keys
        if key in model:
            section[key] = model[key]
    return section


def _cluster_section(
    hardware: dict[str, Any], gpu: str | None, num_gpus: int | None, missing: list[str]
) -> tuple[dict[str, Any], list[str]]:
    assumptions: list[str] = []
    if gpu not in _NODE_FOR_GPU:
        missing.append(f"GPU type ({hardware.get('gpu')})")
        return {}, assumptions
    node, fabric = _NODE_FOR_GPU[gpu]
    inter = str(hardware.get("inter_node") or "not stated")
    per_node = as_integer(hardware.get("gpus_per_node")) or 8
    if per_node != 8:
        missing.append(f"gpus_per_node ({hardware.get('gpus_per_node')}; presets have 8)")
    if "omni-path" in inter.lower() or ("roce" in inter.lower() and "roce" not in fabric):
        missing.append(f"fabric ({inter}; presets: {fabric} for {node})")
    elif "not stated" in inter.lower():
        assumptions.append(f"inter-node fabric not stated: {fabric} assumed ({node} reference)")
    if num_gpus is not None and num_gpus % per_node:
        missing.append(f"num_gpus ({num_gpus}) is not a whole number of {per_node}-GPU nodes")
    num_nodes = max(1, (num_gpus or per_node) // per_node)
    return {"node": node, "num_nodes": num_nodes, "fabric": fabric}, assumptions


def _parallel_section(
    parallel: dict[str, Any], num_gpus: int | None, missing: list[str]
) -> dict[str, Any]:
    section: dict[str, Any] = {}
    for key in ("tp", "pp", "cp"):
        value = as_integer(parallel.get(key, 1))
        if value is None:
            missing.append(f"{key} ({parallel.get(key)})")
        section[key] = value or 1  # only read when ``missing`` is empty
    vpp, problem = parse_vpp(parallel)
    if problem:
        missing.append(problem)
    section["vpp"] = vpp or 1
    dp = as_integer(parallel.get("dp"))
    model_parallel = section["tp"] * section["pp"] * section["cp"]
    if dp is not None and num_gpus is not None and dp * model_parallel != num_gpus:
        missing.append(f"consistent degrees (tp*pp*cp*dp = {dp * model_parallel} != {num_gpus})")
    if dp is not None:
        section["dp"] = dp
    section["schedule"] = parse_schedule(parallel, section["vpp"])
    sp = parallel.get("sequence_parallel", False)
    if not isinstance(sp, bool):
        missing.append(f"sequence_parallel ({sp})")
    section["sequence_parallel"] = sp is True
    mode, problem = parse_recompute(parallel.get("recompute"))
    if problem:
        missing.append(problem)
    section["recompute"] = mode or "none"
    modules = parallel.get("recompute_modules")
    if modules is not None:  # Megatron-Core's --recompute-modules (selective granularity)
        if mode != "selective" or not isinstance(modules, list):
            missing.append(f"recompute_modules ({shorten(modules)}; a list, with selective)")
        else:
            section["recompute_modules"] = modules
    kind, knobs, problem = parse_data_parallel(parallel)
    if problem:
        missing.append(problem)
    section["data_parallel"] = kind or "ddp"
    if isinstance(parallel.get("tp_comm_overlap"), bool):
        knobs["tp_comm_overlap"] = parallel["tp_comm_overlap"]
    if "cp_rotate_method" in parallel:  # torch's context_parallel K/V exchange
        method = parallel["cp_rotate_method"]
        if method in ("allgather", "alltoall"):
            knobs["cp_rotate_method"] = method
        else:
            missing.append(f"cp_rotate_method ({method}; allgather or alltoall)")
    section.update(knobs)
    section.update(_layout_section(parallel, missing))
    section.update({k: parallel[k] for k in MOE_PARALLEL_KEYS if k in parallel})
    dispatcher = parallel.get("moe_token_dispatcher", "alltoall")
    if isinstance(dispatcher, str) and dispatcher.startswith("flex (DeepEP)"):
        section["moe_token_dispatcher"] = "flex"  # Megatron's flex dispatcher with DeepEP
    elif dispatcher not in MOE_DISPATCHERS:  # HybridEP, ...
        missing.append(f"moe_token_dispatcher ({shorten(dispatcher)}: not modelled)")
    for key in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute"):  # combined 1F1B
        value = parallel.get(key)
        if isinstance(value, bool):
            section[key] = value
        elif value is not None:
            missing.append(f"{key} ({shorten(value)}; a bool)")
    # Megatron's distributed optimizer: gradient buffer and Adam's state dtypes, as the plan's
    section.update({k: parallel[k] for k in OPTIMIZER_STATE_KEYS if k in parallel})
    return section


def _layout_section(parallel: dict[str, Any], missing: list[str]) -> dict[str, Any]:
    """An uneven pipeline split where the source gives one: ``pipeline_layers`` (layers per
    virtual stage) and Megatron's ``embedding_as_layer`` / ``loss_as_layer``."""
    section: dict[str, Any] = {}
    if "pipeline_layers" in parallel:
        layers = parallel["pipeline_layers"]
        counts = (  # a virtual stage may hold no layer (the loss alone, Megatron's layouts)
            [0 if n == 0 and not isinstance(n, bool) else as_integer(n) for n in layers]
            if isinstance(layers, list)
            else [None]
        )
        if not counts or None in counts:
            missing.append(f"pipeline_layers ({shorten(layers)})")
        else:
            section["pipeline_layers"] = counts
    for key in ("embedding_as_layer", "loss_as_layer"):
        if key in parallel:
            if isinstance(parallel[key], bool):
                section[key] = parallel[key]
            else:
                missing.append(f"{key} ({shorten(parallel[key])})")
    return section


def _training_section(parallel: dict[str, Any], missing: list[str]) -> tuple[dict[str, Any], str]:
    section: dict[str, Any] = {}
    for key in ("micro_batch_size", "global_batch_size"):
        value = as_integer(parallel.get(key))
        if value is None:
            missing.append(f"{key} ({parallel.get(key)})")
        section[key] = value
    precision, assumption = parse_precision(parallel.get("precision"))
    if precision is None:
        missing.append(f"precision ({parallel.get('precision')})")
    section["precision"] = precision or "bf16"
    return section, assumption or ""


def map_case(case: dict[str, Any]) -> CaseMapping:
    """The plan that replays a published run, or the knobs it lacks (see module docstring)."""
    model, hardware = case.get("model") or {}, case.get("hardware") or {}
    parallel = case.get("parallel") or {}
    missing: list[str] = []
    if case.get("granularity"):
        missing.append(f"a whole training step (the source times: {case['granularity']})")
    gpu = parse_gpu(hardware.get("gpu"))
    num_gpus = as_integer(hardware.get("num_gpus"))
    if num_gpus is None:
        missing.append(f"num_gpus ({hardware.get('num_gpus')})")
    model_section = _model_section(model, missing)
    block, block_assumptions = parse_block_shape(model)
    model_section.update(block)
    cluster, assumptions = _cluster_section(hardware, gpu, num_gpus, missing)
    assumptions += block_assumptions
    parallel_section = _parallel_section(parallel, num_gpus, missing)
    training, assumption = _training_section(parallel, missing)
    if assumption:
        assumptions.append(assumption)
    if "assumed" in str(parallel.get("recompute", "")):
        assumptions.append(f"recompute: {parallel['recompute']}")
    training["flash_attention"] = source_key(str(case["id"])) not in _PRE_FLASH_ATTENTION
    training["stack"] = parse_stack(case)
    if training["stack"] == "compile" and parse_compile_loss(case) is False:
        training["compile_loss"] = False
    if training["stack"] == "eager" and parse_fused_norm(case) is False:
        training["fused_norm"] = False
    if training["stack"] == "megatron":
        training.update(parse_cross_entropy_fusion(parallel, missing))
    if training["precision"] == "fp8":
        parse = parse_te_fp8 if training["stack"] == "megatron" else parse_float8
        training.update(parse(parallel.get("precision")))
        if parallel.get("fp8_param_gather") is True:  # Megatron's FP8 weights
            training["fp8_param_gather"] = True
    if source_key(str(case["id"])) in SEPARATE_PROJECTION_SOURCES:
        model_section["separate_projections"] = True
    pipelined_fsdp = parallel_section["pp"] > 1 and parallel_section["data_parallel"] == "fsdp"
    if pipelined_fsdp and parse_fsdp_pp_reduce(case):
        parallel_section["fsdp_pp_reduce"] = "before_send"
    training["attention_backend"] = parse_attention_backend(parallel.get("attention_backend"))
    if parse_cuda_graphs(case):
        training["cuda_graphs"] = True
    measured = measured_step_time(case)
    if measured is None:
        missing.append("a measured step time (or throughput with a known FLOP formula)")
    plan = None
    if not missing:
        plan = {"model": model_section, "cluster": cluster, "parallel": parallel_section}
        plan["training"] = training
    return CaseMapping(
        case_id=str(case["id"]),
        source=source_key(str(case["id"])),
        gpu=gpu,
        num_gpus=num_gpus,
        plan=plan,
        missing=tuple(missing),
        assumptions=tuple(assumptions),
        measured=measured,
        table=source_table(case),
        measured_memory_gib=measured_memory_gib(case),
    )
