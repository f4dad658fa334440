"""The ``parallel`` and ``training`` sections of a DeepSpeed ``ds_config.json``: the ZeRO stage
and its bucket knobs, activation checkpointing, the batch (completed as DeepSpeed does when the
world size is known) and bf16 / fp16; the Hugging Face Trainer's ``"auto"`` values are left to
the user with a line each.

Sources: DeepSpeed 0.19.6 (``runtime/config.py`` batch rules, ``runtime/zero/config.py``,
``runtime/precision_config.py``, ``runtime/activation_checkpointing/config.py``,
``runtime/utils.py``); transformers main ``integrations/deepspeed.py`` for "auto".

    imported = from_deepspeed_config(Path("ds_config.json"), world_size=64)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fileio.strict import load_json, shorten
from schedules.importers.common import _AUTO, Imported, _Fields, _read
from schedules.offload import NVME_OPTIMIZER_BUFFERS, ZERO_SUB_GROUP_ELEMS

_ZERO_KNOBS = (
    # DeepSpeed key, its alias (populate_by_name), plan key, type, stage-3 only, HF's "auto"
    ("reduce_bucket_size", None, "zero_bucket_elems", int, False, "hidden_size^2"),
    ("overlap_comm", None, "zero_overlap_comm", bool, False, None),
    ("stage3_prefetch_bucket_size", "prefetch_bucket_size", "zero_prefetch_bucket_elems", int,
     True, "0.9 hidden_size^2"),
    ("stage3_max_live_parameters", "max_live_parameters", "zero_max_live_parameters", int,
     True, None),
    ("stage3_param_persistence_threshold", "param_persistence_threshold",
     "zero_param_persistence_threshold", int, True, "10 hidden_size"),
)  # fmt: skip
_DS_NOISE = frozenset({
    "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
    "memory_breakdown", "dump_state", "tensorboard", "wandb", "csv_monitor", "comet",
    "comms_logger", "flops_profiler", "monitor_config", "checkpoint", "prescale_gradients",
    "gradient_predivide_factor", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "fp16.loss_scale", "fp16.loss_scale_window", "fp16.initial_scale_power", "fp16.hysteresis",
    "fp16.min_loss_scale", "fp16.consecutive_hysteresis", "fp16.auto_cast",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.contiguous_gradients", "zero_optimization.round_robin_gradients",
    "zero_optimization.load_from_fp32_weights", "zero_optimization.elastic_checkpoint",
    "zero_optimization.ignore_unused_parameters",
    "zero_optimization.use_multi_rank_bucket_allreduce",
})  # fmt: skip
"""Keys that change nothing a step costs: the learning-rate schedule, clipping (a norm the
step computes anyway), logging and monitors, checkpointing, the fp16 loss-scale dynamics and
ZeRO's save and bookkeeping switches. Counted in the warning, not listed."""
_ADAM_TYPES = frozenset({"adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam"})
"""``optimizer.type`` values that are Adam, which the plan prices."""
_OFFLOAD_DEFAULTS = {
    "offload_optimizer": (("buffer_count", NVME_OPTIMIZER_BUFFERS),),
    "offload_param": (("buffer_count", 5), ("buffer_size", 100_000_000),
                      ("max_in_cpu", 1_000_000_000)),
}  # fmt: skip
"""Offload knobs the plan prices at DeepSpeed's defaults (runtime/zero/offload_config.py;
``schedules.offload``)."""
_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _auto_note(fields: _Fields, key: str, plan_key: str, fill: str | None = None) -> str:
    """A line for an HF Trainer "auto" (integrations/deepspeed.py fills them in at run time)."""
    filled = f" (the Hugging Face Trainer sets {fill})" if fill else ""
    return fields.ask(fields.note(key, f"is 'auto'{filled}: left out, set {plan_key}"), plan_key)


def from_deepspeed_config(path: Path, *, world_size: int | None = None) -> Imported:
    """``parallel`` and ``training`` sections of a DeepSpeed config.

    ``world_size`` is the data-parallel size DeepSpeed sees (the number of GPUs when ZeRO runs
    alone); with it a global batch given as micro-batch x accumulation steps can be completed,
    as DeepSpeed does (``train_batch_size = micro * gradient_accumulation_steps * world_size``).
    """
    fields = _read(path, "DeepSpeed config", _load_json, noise=_DS_NOISE)
    if world_size is not None and (type(world_size) is not int or world_size <= 0):
        raise ValueError(f"{fields.file}: world_size must be a positive integer, got {world_size}")
    notes: list[str] = []
    parallel = _ds_zero(fields, notes)
    if fields.has("activation_checkpointing"):
        section = fields.sub("activation_checkpointing")
        notes.append(
            f"{fields.file}: activation_checkpointing configures deepspeed.checkpointing, which "
            "the model code decides to call: assumed recompute full (every layer)"
        )
        notes.extend(section.left())
        parallel["recompute"] = "full"
    training = _ds_batch(fields, world_size, notes)
    precision = _ds_precision(fields, notes)
    if precision:
        training["precision"] = precision
    _ds_optimizer(fields, notes)
    sections = {"parallel": parallel, "training": training}
    return fields.imported({k: v for k, v in sections.items() if v}, notes)


def _load_json(text: str, name: str) -> Any:
    return load_json(text, name=name)


def _ds_optimizer(fields: _Fields, notes: list[str]) -> None:
    """The plan prices Adam (two fp32 moments); another optimizer is named in a line."""
    if not fields.has("optimizer"):
        return
    section = fields.sub("optimizer")
    kind = section.get("type", str, "")
    if kind.lower().replace("_", "") in _ADAM_TYPES:
        fields.ignored.append("optimizer")  # its learning rate and betas cost nothing
        return
    notes.append(
        section.note("type", f"{shorten(kind)} is not modelled: priced as Adam (two fp32 "
                     "moments per parameter)")
    )  # fmt: skip


def _ds_zero(fields: _Fields, notes: list[str]) -> dict[str, Any]:
    """data_parallel from zero_optimization.stage and the ZeRO knobs of that stage."""
    if isinstance(fields.raw("zero_optimization"), bool):  # the deprecated form: true is stage 1
        return {"data_parallel": "zero1" if fields.raw("zero_optimization") else "ddp"}
    zero = fields.sub("zero_optimization")
    if zero.raw("stage") == _AUTO:
        notes.append(_auto_note(zero, "stage", "parallel.data_parallel"))
        return {}
    stage = zero.get("stage", int, 0)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"{fields.file}: zero_optimization.stage must be 0-3, got {stage}")
    parallel: dict[str, Any] = {"data_parallel": ("ddp", "zero1", "zero2", "zero3")[stage]}
    if stage == 0:
        notes.append(
            f"{fields.file}: zero_optimization.stage 0: DeepSpeed's own data parallelism "
            "(gradients all-reduced after backward) is priced as data_parallel ddp"
        )
    for key, alias, plan_key, kind, stage3_only, fill in _ZERO_KNOBS:
        given = [k for k in (key, alias) if k and zero.has(k)]
        if len(given) > 1:
            raise ValueError(f"{fields.file}: zero_optimization gives both {key} and {alias}")
        if not given:
            continue
        if zero.raw(given[0]) == _AUTO:
            notes.append(_auto_note(zero, given[0], f"parallel.{plan_key}", fill))
        elif stage == 0 or (stage3_only and stage != 3):
            needs = "3" if stage3_only else "1-3"
            notes.append(zero.note(given[0], f"is read only at stage {needs} (ignored)"))
        else:
            parallel[plan_key] = _ds_value(zero, given[0], kind)
    if zero.has("allgather_bucket_size"):
        notes.append(
            zero.note(
                "allgather_bucket_size",
                "is ignored by DeepSpeed when torch has all_gather_into_tensor (torch >= 1.13; "
                "runtime/utils.py all_gather_dp_groups)",
            )
        )
    parallel.update(_ds_offload(zero, stage, notes))
    if zero.has("sub_group_size"):
        _ds_default(zero, "sub_group_size", ZERO_SUB_GROUP_ELEMS, notes)
    notes.extend(zero.left())
    return parallel


def _ds_offload(zero: _Fields, stage: int, notes: list[str]) -> dict[str, Any]:
    """The plan's offload keys from ``offload_optimizer`` / ``offload_param`` (device,
    pin_memory, the NVMe pipelining) and their deprecated booleans (``cpu_offload``,
    ``cpu_offload_param``, ``cpu_offload_use_pin_memory``; runtime/zero/config.py)."""
    out: dict[str, Any] = {}
    pins: dict[str, bool] = {}
    for key, legacy, stages in (("offload_optimizer", "cpu_offload", (1, 2, 3)),
                                ("offload_param", "cpu_offload_param", (3,))):  # fmt: skip
        device, swaps = _ds_offload_device(zero, key, legacy, pins, notes)
        if device == "none":
            continue
        if stage not in stages:
            given = key if zero.has(key) else legacy
            at = "stage 3" if stages == (3,) else "stages 1-3"
            notes.append(zero.note(given, f"is read only at {at} (ignored)"))
            pins.pop(key, None)
            continue
        out.update({key: device, **swaps})
    if zero.has("cpu_offload_use_pin_memory"):
        pins.setdefault("offload_optimizer", zero.get("cpu_offload_use_pin_memory", bool))
    if len(set(pins.values())) > 1:
        notes.append(
            f"{zero.file}: offload_optimizer.pin_memory and offload_param.pin_memory differ: "
            "the plan has one parallel.offload_pin_memory, priced as offload_optimizer's"
        )
    if out and pins:
        out["offload_pin_memory"] = pins.get("offload_optimizer", pins.get("offload_param"))
    return out


def _ds_offload_device(
    zero: _Fields, key: str, legacy: str, pins: dict[str, bool], notes: list[str]
) -> tuple[str, dict[str, bool]]:
    """Where ``key`` puts its state (``none`` when absent or null) and the NVMe pipelining
    keys it turns on, reading its knobs: the pinning into ``pins``, buffer counts and sizes the
    plan prices at DeepSpeed's defaults."""
    if zero.has(legacy):
        legacy_on = zero.get(legacy, bool)
        if zero.has(key) and zero.raw(key) is not None:
            raise ValueError(f"{zero.file}: zero_optimization gives both {key} and {legacy}")
        return ("cpu" if legacy_on else "none"), {}
    if zero.raw(key) is None:
        return "none", {}
    section = zero.sub(key)
    device = section.choice("device", ("none", "cpu", "nvme"), "none")
    if section.has("pin_memory"):
        pins[key] = section.get("pin_memory", bool)
    section.raw("nvme_path")  # where the swap files go: nothing a step costs
    swaps: dict[str, bool] = {}
    for knob, default in _OFFLOAD_DEFAULTS[key]:
        if section.has(knob):
            _ds_default(section, knob, default, notes)
    if key == "offload_optimizer":
        section.get("fast_init", bool, False)  # initialisation only
        ratio = section.get("ratio", float, 1.0)
        if ratio != 1.0 and device != "none":
            notes.append(
                section.note("ratio", f"{ratio:g} (partial offload, ZeRO++) is not modelled: "
                             "priced as the whole optimizer offloaded")
            )  # fmt: skip
        for flag in ("pipeline_read", "pipeline_write"):
            if not section.get(flag, bool, False):
                continue
            if device == "nvme":
                swaps[f"offload_{flag}"] = True
            else:  # DeepSpeed pipelines only the NVMe swaps
                notes.append(section.note(flag, "needs device nvme (ignored)"))
    notes.extend(section.left())
    return device, swaps


def _ds_default(fields: _Fields, key: str, default: float, notes: list[str]) -> None:
    """A knob the plan prices at DeepSpeed's default: a line when the file sets another."""
    value = fields.get(key, (int, float))
    if value != default:
        notes.append(
            fields.note(key, f"{value:g} is priced as DeepSpeed's default {default:g} "
                        "(not a plan key)")
        )  # fmt: skip


def _ds_value(fields: _Fields, key: str, kind: type) -> Any:
    value = fields.get(key, kind)
    if kind is int and value < 0:
        raise ValueError(f"{fields.file}: {fields.prefix}{key} must be >= 0, got {value}")
    return value


def _ds_batch(fields: _Fields, world_size: int | None, notes: list[str]) -> dict[str, Any]:
    """micro_batch_size and global_batch_size by DeepSpeed's rules (runtime/config.py
    ``_set_batch_related_parameters``: absent accumulation steps are 1)."""
    values: dict[str, Any] = {}  # an int, None (absent) or "auto"
    autos: list[str] = []
    for key in _BATCH_KEYS:
        values[key] = fields.raw(key)
        if values[key] == _AUTO:
            what = "micro_batch_size" if key == _BATCH_KEYS[1] else "global_batch_size"
            autos.append(_auto_note(fields, key, f"training.{what}", "it from its arguments"))
        elif values[key] is not None and fields.get(key, int) <= 0:
            raise ValueError(f"{fields.file}: {key} must be > 0, got {values[key]}")
    notes.extend(autos[:-1] if values[_BATCH_KEYS[2]] == _AUTO else autos)
    train, micro, accum = (
        fields.get(k, int) if values[k] not in (None, _AUTO) else values[k] for k in _BATCH_KEYS
    )
    training: dict[str, Any] = {}
    if type(micro) is int:
        training["micro_batch_size"] = micro
    if type(train) is int:
        training["global_batch_size"] = train
    known_train = train if type(train) is int else None
    known_micro = micro if type(micro) is int else None
    if world_size is not None and accum != _AUTO:
        _ds_complete(fields.file, training, known_train, known_micro, accum, world_size)
    if accum == _AUTO and not {"micro_batch_size", "global_batch_size"} <= set(training):
        notes.append(autos[-1])  # the batch the Trainer's accumulation steps would complete
    if known_train is None and known_micro is None:
        if _AUTO not in (train, micro):
            notes.append(f"{fields.file}: no train_batch_size or train_micro_batch_size_per_gpu")
        return training
    why = "gradient_accumulation_steps is 'auto'" if accum == _AUTO else "pass world_size"
    if "global_batch_size" not in training and train != _AUTO:
        notes.append(
            f"{fields.file}: training.global_batch_size = micro batch x accumulation steps x "
            f"data-parallel size: left out ({why})"
        )
    if "micro_batch_size" not in training and micro != _AUTO:
        notes.append(
            f"{fields.file}: training.micro_batch_size = train_batch_size / (accumulation steps x"
            f" data-parallel size): left out ({why})"
        )
    return training


def _ds_complete(
    file: str, training: dict[str, Any], train: int | None, micro: int | None,
    accum: int | None, world_size: int,
) -> None:  # fmt: skip
    """Fill the missing one of micro / global batch as DeepSpeed does; its assertion
    ``train_batch_size == micro * accumulation * world_size`` is a ValueError here."""
    steps = accum or 1
    if train is not None and micro is not None:
        if train % (micro * world_size) or (
            accum is not None and train != micro * accum * world_size
        ):
            raise ValueError(
                f"{file}: train_batch_size={train} != train_micro_batch_size_per_gpu x "
                f"gradient_accumulation_steps x world_size = {micro} x {accum} x {world_size}"
            )
    elif train is not None:
        if train % (world_size * steps):
            raise ValueError(
                f"{file}: train_batch_size={train} is not divisible by world_size x "
                f"gradient_accumulation_steps = {world_size} x {steps}"
            )
        training["micro_batch_size"] = train // (world_size * steps)
    elif micro is not None:
        training["global_batch_size"] = micro * steps * world_size


def _ds_precision(fields: _Fields, notes: list[str]) -> str | None:
    """bf16 (or its old name bfloat16) or fp16 from their ``enabled``; neither is fp32."""
    enabled: dict[str, Any] = {}
    for key in ("bf16", "bfloat16", "fp16"):  # bfloat16: DeepSpeed's old name
        if not fields.has(key):
            continue
        section = fields.sub(key)
        if section.raw("enabled") == _AUTO:
            notes.append(
                _auto_note(section, "enabled", "training.precision", f"it from --{key[:4]}")
            )
            enabled[key] = _AUTO
        else:
            enabled[key] = section.get("enabled", bool, False)
        notes.extend(section.left())
    bf16 = enabled.get("bf16") is True or enabled.get("bfloat16") is True
    if bf16 and enabled.get("fp16") is True:
        raise ValueError(f"{fields.file}: bf16.enabled and fp16.enabled are both true")
    if bf16 or enabled.get("fp16") is True:
        return "bf16" if bf16 else "fp16"
    if _AUTO not in enabled.values():
        notes.append(
            f"{fields.file}: neither bf16 nor fp16 is enabled: DeepSpeed trains in fp32, which "
            "is not modelled (training.precision left out)"
        )
    return None
