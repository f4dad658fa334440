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

from fileio.strict import load_json
from schedules.importers.common import _AUTO, Imported, _Fields, _read

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
_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _auto_note(fields: _Fields, key: str, plan_key: str, fill: str | None = None) -> str:
    """A line for an HF Trainer "auto" (integrations/deepspeed.py fills them in at run time)."""
    filled = f" (the Hugging Face Trainer sets {fill})" if fill else ""
    return fields.note(key, f"is 'auto'{filled}: left out, set {plan_key}")


def from_deepspeed_config(path: Path, *, world_size: int | None = None) -> Imported:
    """``parallel`` and ``training`` sections of a DeepSpeed config.

    ``world_size`` is the data-parallel size DeepSpeed sees (the number of GPUs when ZeRO runs
    alone); with it a global batch given as micro-batch x accumulation steps can be completed,
    as DeepSpeed does (``train_batch_size = micro * gradient_accumulation_steps * world_size``).
    """
    fields = _read(path, "DeepSpeed config", lambda text, name: load_json(text, name=name))
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
    sections = {"parallel": parallel, "training": training}
    return Imported(
        sections={k: v for k, v in sections.items() if v}, warnings=(*notes, *fields.left())
    )


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
    for key in ("offload_optimizer", "offload_param"):
        if zero.has(key):
            notes.append(zero.note(key, "(CPU/NVMe offload) is not modelled (ignored)"))
    notes.extend(zero.left())
    return parallel


def _ds_value(fields: _Fields, key: str, kind: type) -> Any:
    value = fields.get(key, kind)
    if kind is int and value < 0:
        raise ValueError(f"{fields.file}: {fields.prefix}{key} must be >= 0, got {value}")
    return value


def _ds_batch(fields: _Fields, world_size: int | None, notes: list[str]) -> dict[str, Any]:
    """micro_batch_size and global_batch_size by DeepSpeed's rules (runtime/config.py
    ``_set_batch_related_parameters``: absent accumulation steps are 1)."""
    values: dict[str, Any] = {}  # an int, None (absent) or "auto"
    for key in _BATCH_KEYS:
        values[key] = fields.raw(key)
        if values[key] == _AUTO:
            what = "micro_batch_size" if key == _BATCH_KEYS[1] else "global_batch_size"
            notes.append(_auto_note(fields, key, f"training.{what}", "it from its arguments"))
        elif values[key] is not None and fields.get(key, int) <= 0:
            raise ValueError(f"{fields.file}: {key} must be > 0, got {values[key]}")
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
