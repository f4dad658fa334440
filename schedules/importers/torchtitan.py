"""The ``model``, ``parallel`` and ``training`` sections of a torchtitan TOML config (v0.1-v0.2):
Llama 3 and Qwen3 flavors as presets, the parallel degrees (the expert-parallel ones of an MoE
model too) and data-parallel kind (DDP, FSDP2, HSDP), the pipeline schedule and torchtitan's
layer split, async TP, activation checkpointing, the batch, precision and compilation, with
torchtitan's defaults for absent keys.

Sources: torchtitan v0.2.2, the last release configured by TOML
(``torchtitan/config/job_config.py``, ``models/llama3/__init__.py`` and
``infra/parallelize.py``, ``distributed/pipeline_parallel.py``,
``distributed/activation_checkpoint.py``; v0.1.0's ``config_manager.py`` names are read too).

    imported = from_torchtitan_toml(Path("llama3_8b.toml"))
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fileio.strict import shorten
from schedules.importers.common import Imported, _Fields, _read
from schedules.model_presets import MODEL_PRESETS
from schedules.plan import CP_ROTATE_METHODS, FLOAT8_RECIPES

_TITAN_FLAVORS = {"8B": "llama3-8b", "70B": "llama3-70b", "405B": "llama3-405b"}
"""torchtitan's llama3 flavors (models/llama3/__init__.py) and the presets of the same shape."""
_TITAN_QWEN3_FLAVORS = {
    "8B": "qwen3-8b",
    "32B": "qwen3-32b",
    "30B-A3B": "qwen3-30b-a3b",
    "235B-A22B": "qwen3-235b-a22b",
}
"""torchtitan's qwen3 flavors (v0.2.2 ``models/qwen3/__init__.py``: heads of 128, QK norm; the
MoE ones with 128 experts, top-8) and the presets of the same shape."""
_TITAN_SCHEDULES = {"1F1B": "1f1b", "Interleaved1F1B": "interleaved", "GPipe": "gpipe"}
"""torch.distributed.pipelining schedules the plan has; 1F1B and GPipe are single-stage."""
_TITAN_OLD_PARALLEL_KEYS = frozenset({
    "data_parallel_degree", "data_parallel_replicate_degree", "data_parallel_shard_degree",
    "tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
    "enable_async_tensor_parallel", "pipeline_parallel_schedule",
    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
    "context_parallel_rotate_method", "fsdp_reshard_after_forward",
    "pipeline_parallel_split_points", "pipeline_parallel_microbatches",
})  # fmt: skip
"""Keys of ``[parallelism]`` that torchtitan before v0.1 kept under ``[training]`` (the degrees,
FSDP's knobs) or ``[experimental]`` (pipeline and context parallel, async TP)."""
_TITAN_NOISE = frozenset({
    "job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "validation",
    "comm", "memory_estimation", "fault_tolerance", "ft",
    "model.hf_assets_path", "model.tokenizer_path", "model.norm_type", "training.max_norm",
    "training.steps", "training.dataset", "training.dataset_path", "training.warmup_steps",
    "training.seed", "training.deterministic", "training.gc_freq", "training.lr",
    "experimental.custom_model_path", "experimental.custom_import",
})  # fmt: skip
"""Keys that change nothing a step costs: output folders, profiling, metrics, the optimizer's
hyperparameters (AdamW is what the plan prices), the schedule of the learning rate,
checkpointing, validation, timeouts, the number of steps and the data. Counted, not listed."""
_TITAN_DDP_BUCKET_MB = 100.0
"""torchtitan's apply_ddp: ``replicate(model, device_mesh=dp_mesh, bucket_cap_mb=100)``."""


def from_torchtitan_toml(path: Path, *, world_size: int | None = None) -> Imported:
    """``model``, ``parallel`` and ``training`` sections of a torchtitan TOML config (v0.1-v0.2,
    the releases configured by TOML; older files with the degrees under ``[training]`` and
    ``[experimental]`` are read too). Absent keys take torchtitan's defaults, as a run would:
    ``seq_len`` 2048, ``local_batch_size`` 8, FSDP2 over the leftover ranks, per-layer
    activation checkpointing of every second layer. Llama 3 flavors become presets.

    ``world_size`` (the cluster's GPUs) works out ``data_parallel_shard_degree = -1`` as
    torchtitan's ``ParallelDims`` does: the ranks left over by the other degrees."""
    import tomllib  # here, not at the top: Python 3.11+, and the project supports 3.10

    fields = _read(path, "torchtitan config", lambda text, name: tomllib.loads(text), _TITAN_NOISE)
    if world_size is not None and (type(world_size) is not int or world_size <= 0):
        raise ValueError(f"{fields.file}: world_size must be a positive integer, got {world_size}")
    notes: list[str] = []
    model_t, training_t = fields.sub("model"), fields.sub("training")
    parallel_t = _titan_parallelism_table(fields, training_t, notes)
    preset = _titan_preset(model_t, notes)
    model: dict[str, Any] = {"preset": preset} if preset else {}
    model["seq_len"] = training_t.get("seq_len", int, 2048)
    model["separate_projections"] = True  # torchtitan's Llama: wq, wk, wv, w1, w3
    num_layers = MODEL_PRESETS[preset][0]["num_layers"] if preset else None
    compile_t = fields.sub("compile")
    compiled = _titan_compiled(compile_t, training_t)
    parallel, dp = _titan_parallel(parallel_t, training_t, num_layers, compiled, notes, world_size)
    parallel.update(_titan_experts(parallel_t, preset, notes))
    recompute = _titan_recompute(fields.sub("activation_checkpoint"), notes)
    if recompute:
        parallel["recompute"] = recompute
    training = _titan_training(training_t, parallel_t, model_t, parallel["pp"], dp, notes)
    training["stack"] = "compile" if compiled else "eager"
    if parallel_t.get("disable_loss_parallel", bool, False) and parallel.get("tp", 1) > 1:
        training["loss_parallel"] = False
    if compiled and "loss" not in compile_t.get("components", list, ["model", "loss"]):
        training["compile_loss"] = False  # [compile] components without "loss"
    if training.get("precision") == "fp8":
        sharded = parallel_t.get("data_parallel_shard_degree", int, -1) != 1
        training.update(_titan_float8(fields, model_t, sharded, notes))
    for table in (model_t, training_t, parallel_t, compile_t):
        notes.extend(table.left())
    sections = {"model": model, "parallel": parallel, "training": training}
    return fields.imported(sections, notes)


def _titan_parallelism_table(fields: _Fields, training: _Fields, notes: list[str]) -> _Fields:
    """``[parallelism]``, or before torchtitan v0.1 the same keys under ``[training]`` (the
    degrees, FSDP's knobs) and ``[experimental]`` (pipeline, context parallel, async TP); a
    file giving both places is refused, as torchtitan refuses keys it does not know."""
    experimental = fields.sub("experimental") if fields.has("experimental") else None
    old = {
        table: [k for k in table.data if k in _TITAN_OLD_PARALLEL_KEYS]
        for table in (training, experimental) if table is not None
    }  # fmt: skip
    moved = {f"{table.prefix}{key}": table.data[key] for table, keys in old.items() for key in keys}
    if not moved:
        return fields.sub("parallelism")
    if fields.has("parallelism"):
        first = next(iter(moved))
        raise ValueError(
            f"{fields.file}: {first} is where torchtitan before v0.1 kept it, and the file has "
            "a [parallelism] table too: move it under [parallelism]"
        )
    for table, keys in old.items():
        table.read.update(keys)
    data = {key.split(".", 1)[1]: value for key, value in moved.items()}
    if "data_parallel_degree" in data:  # the first name of the FSDP degree (mid 2024)
        data["data_parallel_shard_degree"] = data.pop("data_parallel_degree")
    notes.append(
        f"{fields.file}: {', '.join(moved)}: read as [parallelism] (torchtitan before v0.1 kept "
        "the degrees there)"
    )
    if experimental is not None:
        notes.extend(experimental.left())
    return _Fields(fields.file, data, "parallelism.", noise=fields.noise, ignored=fields.ignored)


def _titan_preset(model: _Fields, notes: list[str]) -> str | None:
    name, flavor = model.get("name", str, "llama3"), model.get("flavor", str, "debugmodel")
    if name == "qwen3":
        if flavor not in _TITAN_QWEN3_FLAVORS:
            why = f"{shorten(flavor)} has no preset: give model's shape"
            notes.append(model.note("flavor", why))
            return None
        return _TITAN_QWEN3_FLAVORS[flavor]
    if name != "llama3":
        notes.append(model.note("name", f"{shorten(name)} has no preset: give model's shape"))
        return None
    size, _, variant = flavor.partition("_")
    if size not in _TITAN_FLAVORS:
        notes.append(model.note("flavor", f"{shorten(flavor)} has no preset: give model's shape"))
        return None
    if variant:  # 8B_flex, 8B_varlen: block-causal masks over packed documents
        notes.append(model.note("flavor", f"{flavor}: {variant} attention priced as full causal"))
    return _TITAN_FLAVORS[size]


def _titan_compiled(compile_t: _Fields, training: _Fields) -> bool:
    """Whether the model is compiled: [compile] enable and "model" in components (v0.2), or
    training.compile (v0.1)."""
    enabled = compile_t.get("enable", bool, False) or training.get("compile", bool, False)
    components = compile_t.get("components", list, ["model", "loss"])
    return enabled and "model" in components


def _titan_parallel(
    par: _Fields, training: _Fields, num_layers: int | None, compiled: bool, notes: list[str],
    world_size: int | None = None,
) -> tuple[dict[str, Any], int | None]:  # fmt: skip
    """Degrees, the data-parallel kind (torchtitan's ParallelDims) and the pipeline split; the
    data-parallel degree when the file or the world size fixes it."""
    replicate = par.get("data_parallel_replicate_degree", int, 1)
    shard = par.get("data_parallel_shard_degree", int, -1)
    degrees = {
        key: par.get(f"{name}_parallel_degree", int, 1)
        for key, name in (("tp", "tensor"), ("pp", "pipeline"), ("cp", "context"))
    }
    for key, value in (("data_parallel_replicate_degree", replicate), *degrees.items()):
        if value < 1:
            raise ValueError(f"{par.file}: parallelism {key} must be >= 1, got {value}")
    if shard < 1 and shard != -1:
        raise ValueError(f"{par.file}: parallelism.data_parallel_shard_degree must be -1 or >= 1")
    parallel: dict[str, Any] = dict(degrees)
    dp = replicate * shard if shard > 0 else None
    if dp:
        parallel["dp"] = dp
    elif world_size is not None:  # -1: left to the plan's resolve; the batch needs it now
        shard = _titan_leftover(par.file, world_size, replicate * math.prod(degrees.values()))
        dp = replicate * shard
    if degrees["tp"] > 1:  # torchtitan's TP plan shards norms over the sequence (SequenceParallel)
        parallel["sequence_parallel"] = True
    parallel.update(_titan_data_parallel(par, training, replicate, shard, degrees["cp"], notes))
    if degrees["pp"] > 1:
        parallel.update(_titan_pipeline(par, degrees["pp"], num_layers, notes))
    for key in par.data if degrees["pp"] == 1 else ():
        if key.startswith("pipeline_parallel_") and key != "pipeline_parallel_degree":
            notes.append(par.note(key, "needs pipeline_parallel_degree > 1 (ignored)"))
    if par.get("enable_async_tensor_parallel", bool, False):
        if compiled and degrees["tp"] > 1:
            parallel["tp_comm_overlap"] = True
        why = (
            "priced as tp_comm_overlap"
            if compiled and degrees["tp"] > 1
            else "needs compile and tp > 1 (ignored)"
        )
        notes.append(par.note("enable_async_tensor_parallel", f"(async TP): {why}"))
    if degrees["cp"] > 1:  # torch's context_parallel, its rotater as set_rotate_method sets it
        parallel["cp_rotate_method"] = par.choice(
            "context_parallel_rotate_method", CP_ROTATE_METHODS, "allgather"
        )
    return parallel, dp


def _titan_experts(par: _Fields, preset: str | None, notes: list[str]) -> dict[str, Any]:
    """``expert_parallel_degree`` and ``expert_tensor_parallel_degree`` (torchtitan: 1 or tp;
    both "no effect for non-MoE models"): ``ep`` and ``etp`` on an MoE preset or a model given by
    shape, ignored with a note on a dense preset."""
    ep = par.get("expert_parallel_degree", int, 1)
    etp = par.get("expert_tensor_parallel_degree", int, 1)
    for key, value in (("expert_parallel_degree", ep), ("expert_tensor_parallel_degree", etp)):
        if value < 1:
            raise ValueError(f"{par.file}: parallelism.{key} must be >= 1, got {value}")
    if ep == 1:
        return {}
    if preset is not None and not MODEL_PRESETS[preset][0].get("num_experts"):
        notes.append(par.note("expert_parallel_degree", f"on the dense {preset} (ignored)"))
        return {}
    return {"ep": ep, "etp": etp}


def _titan_leftover(file: str, world_size: int, others: int) -> int:
    """``data_parallel_shard_degree = -1``: the ranks left by the other degrees (ParallelDims
    ``dp_shard = world_size // (dp_replicate * cp * tp * pp)``, which must divide evenly)."""
    if world_size % others:
        raise ValueError(
            f"{file}: data_parallel_shard_degree -1 on {world_size} GPUs: the other degrees "
            f"(replicate x tp x pp x cp = {others}) do not divide the world size"
        )
    return world_size // others


def _titan_data_parallel(
    par: _Fields, training: _Fields, replicate: int, shard: int, cp: int, notes: list[str]
) -> dict[str, Any]:
    """FSDP2 when sharded (shard degree -1 or > 1, or CP), HSDP with replication, else DDP."""
    if shard == 1 and cp == 1:
        for table, key in ((par, "fsdp_reshard_after_forward"),
                           (training, "mixed_precision_reduce"),
                           (training, "enable_cpu_offload")):  # fmt: skip
            if table.has(key):
                notes.append(table.note(key, "applies only with FSDP (ignored)"))
        if replicate > 1:
            return {"data_parallel": "ddp", "ddp_bucket_mb": _TITAN_DDP_BUCKET_MB}
        return {"data_parallel": "ddp"}
    out: dict[str, Any] = {"data_parallel": "fsdp2"}
    if replicate > 1:
        out = {"data_parallel": "hsdp", "fsdp_version": 2}
        if shard > 0:
            out["hsdp_shard_size"] = shard
        else:
            notes.append(
                par.note(
                    "data_parallel_shard_degree",
                    "-1 with replication: the shard group is the leftover ranks: set "
                    "parallel.hsdp_shard_size",
                )
            )
    reshard = par.choice("fsdp_reshard_after_forward", ("default", "always", "never"), "default")
    if reshard != "default":  # "default" is the plan's default too: not under PP, kept under PP
        out["fsdp_reshard_after_forward"] = reshard == "always"
    reduce = training.choice("mixed_precision_reduce", ("float32", "bfloat16"), "float32")
    out["fsdp_reduce_dtype"] = "fp32" if reduce == "float32" else "bf16"
    if training.get("enable_cpu_offload", bool, False):  # apply_fsdp: CPUOffloadPolicy()
        out["offload_param"] = "cpu"
    return out


def _titan_pipeline(
    par: _Fields, pp: int, num_layers: int | None, notes: list[str]
) -> dict[str, Any]:
    """Schedule, virtual stages and torchtitan's layer split (pipeline_parallel.py)."""
    schedule = par.get("pipeline_parallel_schedule", str, "1F1B")
    if schedule not in _TITAN_SCHEDULES or par.get("pipeline_parallel_schedule_csv", str, ""):
        notes.append(par.note("pipeline_parallel_schedule", f"{schedule} is not modelled"))
        return {}
    single = schedule != "Interleaved1F1B"
    parts = par.get("module_fqns_per_model_part", (list, type(None)), None)
    if parts is not None:
        if not all(isinstance(part, list) for part in parts):
            raise ValueError(f"{par.file}: parallelism.module_fqns_per_model_part must list lists")
        counts = [sum(str(m).startswith("layers.") for m in part) for part in parts]
    else:
        split = _titan_default_split(par, pp, num_layers, single)
        if split is None:
            notes.append(par.note("pipeline_parallel_degree", "split needs the model: set vpp"))
            return {"schedule": _TITAN_SCHEDULES[schedule]}
        counts = split
    vpp = len(counts) // pp
    if len(counts) % pp or (single and vpp != 1) or (not single and vpp < 2):
        raise ValueError(
            f"{par.file}: {len(counts)} pipeline stages over {pp} ranks do not fit schedule "
            f"{schedule} ({'one stage' if single else 'two or more stages'} per rank)"
        )
    out: dict[str, Any] = {"schedule": _TITAN_SCHEDULES[schedule], "pipeline_layers": counts}
    return {**out, "vpp": vpp} if vpp > 1 else out


def _titan_default_split(
    par: _Fields, pp: int, num_layers: int | None, single: bool
) -> list[int] | None:
    """torchtitan's generate_llm_fqn_per_model_part: the embedding and the output count as
    ``first/last_stage_less_layers`` layers, extra layers go to the first stages."""
    first = par.get("pipeline_parallel_first_stage_less_layers", int, 1)
    last = par.get("pipeline_parallel_last_stage_less_layers", int, 1)
    per_stage = par.get("pipeline_parallel_layers_per_stage", (int, type(None)), None)
    if num_layers is None:
        return None
    effective = num_layers + first + last
    stages = math.ceil(effective / per_stage) if per_stage else pp * (1 if single else 2)
    base, extra = divmod(effective, stages)
    if base == 0 or first > base or last > base:
        raise ValueError(
            f"{par.file}: {stages} pipeline stages cannot hold {num_layers} layers with "
            f"first/last_stage_less_layers {first}/{last}"
        )
    counts, left = [], num_layers
    for stage in range(stages):
        size = base + (stage < extra) - (first if stage == 0 else 0)
        size -= last if stage == stages - 1 and stage else 0
        counts.append(max(0, min(size, left)))
        left -= counts[-1]
    return counts


def _titan_recompute(ac: _Fields, notes: list[str]) -> str | None:
    """recompute from [activation_checkpoint] (torchtitan's default: selective, option "2")."""
    mode = ac.choice("mode", ("selective", "full", "none", "memory_budget"), "selective")
    if mode == "memory_budget":
        notes.append(ac.note("mode", "memory_budget (chosen by the compiler) is not modelled"))
    option = str(ac.get("selective_ac_option", (str, int), "2")) if mode == "selective" else ""
    if option != "op" and option and not option.isdigit():
        raise ValueError(f"{ac.file}: activation_checkpoint.selective_ac_option must be 'op' or "
                         f"a layer interval, got {shorten(option)}")  # fmt: skip
    elif option != "op" and option and int(option) > 1:
        notes.append(ac.note("selective_ac_option", f"{option}: priced as full on every layer"))
    notes.extend(ac.left())
    if mode == "selective":
        return "op" if option == "op" else "full"
    return None if mode == "memory_budget" else mode


def _titan_training(
    training: _Fields, par: _Fields, model: _Fields, pp: int, dp: int | None, notes: list[str]
) -> dict[str, Any]:
    """The micro-batch is local_batch_size, or the pipeline micro-batch under PP; the global
    batch is given or local x dp (torchtitan's default)."""
    if training.has("batch_size") and training.has("local_batch_size"):
        raise ValueError(f"{training.file}: training gives batch_size and local_batch_size")
    old = training.has("batch_size")  # the name before torchtitan v0.1
    local = training.get("batch_size" if old else "local_batch_size", int, 8)
    micro = local
    if pp > 1:
        micro = par.get("pipeline_parallel_microbatch_size", int, 1)
        if micro <= 0 or local % micro:
            raise ValueError(f"{par.file}: local_batch_size {local} is not divisible by "
                             f"pipeline_parallel_microbatch_size {micro}")  # fmt: skip
    out: dict[str, Any] = {"micro_batch_size": micro}
    global_batch = training.get("global_batch_size", int, -1)
    if pp > 1 and global_batch > 0 and (dp is None or global_batch > local * dp):
        above = f"> local_batch_size x dp = {local * dp}" if dp else "above local_batch_size x dp"
        notes.append(
            training.note(
                "global_batch_size",
                f"{above}: torchtitan runs several pipeline rounds per step, the plan one round "
                "of all the micro-batches (a smaller bubble)",
            )
        )
    if global_batch > 0 or dp:
        out["global_batch_size"] = global_batch if global_batch > 0 else local * (dp or 0)
    else:
        line = training.note(
            "global_batch_size",
            "unset: torchtitan uses local_batch_size x the data-parallel degree, which "
            "data_parallel_shard_degree -1 leaves to the world size: left out",
        )
        notes.append(training.ask(line, "training.global_batch_size"))
    precision = _titan_precision(training, model, notes)
    if precision:
        out["precision"] = precision
    return out


def _titan_precision(training: _Fields, model: _Fields, notes: list[str]) -> str | None:
    converters = model.get("converters", (list, str), [])
    if isinstance(converters, str):  # the command line's comma-separated form
        converters = converters.split(",")
    float8 = any("float8" in str(c) for c in converters)
    for other in (str(c) for c in converters if "float8" not in str(c)):
        notes.append(model.note("converters", f"{shorten(other)} is not modelled (ignored)"))
    if training.choice("dtype", ("float32", "bfloat16"), "float32") == "bfloat16":
        notes.append(training.note("dtype", "bfloat16 (no fp32 master weights) is not modelled"))
    param = training.choice("mixed_precision_param", ("bfloat16", "float32"), "bfloat16")
    if float8:
        return "fp8"
    if param == "float32":
        notes.append(training.note("mixed_precision_param", "float32 is not modelled"))
        return None
    return "bf16"


def _titan_float8(
    fields: _Fields, model: _Fields, sharded: bool, notes: list[str]
) -> dict[str, Any]:
    """torchao's recipe and float8 all-gather from ``[float8]`` (v0.1, converter ``float8``) or
    ``[quantize.linear.float8]`` (v0.2, ``quantize.linear.float8``): ``recipe_name`` unset is
    torchao's default, tensorwise, the only one torchtitan gathers in float8, with
    ``enable_fsdp_float8_all_gather`` and only when FSDP shards (``sharded``: torchtitan's
    ``dp_shard_enabled``)."""
    converters = model.get("converters", (list, str), [])
    names = converters.split(",") if isinstance(converters, str) else [str(c) for c in converters]
    if any(name.strip().startswith("quantize.") for name in names):
        quantize = fields.sub("quantize")
        linear = quantize.sub("linear")
        table = linear.sub("float8")
        tables = [quantize, linear, table]
    else:
        table = fields.sub("float8")
        tables = [table]
    recipe = table.get("recipe_name", (str, type(None)), None)
    gather = table.get("enable_fsdp_float8_all_gather", bool, False)
    precompute = table.get("precompute_float8_dynamic_scale_for_fsdp", bool, False)
    if recipe is not None and recipe not in FLOAT8_RECIPES:
        raise ValueError(
            f"{table.file}: {table.prefix}recipe_name must be one of {', '.join(FLOAT8_RECIPES)}, "
            f"got {shorten(recipe)}"
        )
    if recipe is not None and gather:
        raise ValueError(
            f"{table.file}: {table.prefix}enable_fsdp_float8_all_gather with recipe_name "
            f"{recipe}: torchtitan refuses the pair (float8 all-gather is tensorwise's)"
        )
    out: dict[str, Any] = {"float8_recipe": recipe or "tensorwise"}
    gather = gather and sharded
    if gather:
        out["float8_all_gather"] = True
        if not precompute:
            notes.append(
                table.note(
                    "precompute_float8_dynamic_scale_for_fsdp",
                    "false: each unit's all-gather waits for an amax all-reduce per weight, "
                    "not modelled (priced as precomputed)",
                )
            )
    filters = [str(f) for f in table.get("filter_fqns", list, []) if str(f) != "output"]
    if filters:
        notes.append(
            table.note("filter_fqns", f"{shorten(filters)}: every layer linear priced in float8")
        )
    how = f"recipe {out['float8_recipe']}" + (" with float8 all-gather" if gather else "")
    notes.append(model.note("converters", f"float8 (torchao Float8Linear): {how}"))
    for part in tables:
        notes.extend(part.left())
    return out
