"""Plan files: strict loading, defaults, and every validation error with its values."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from schedules.plan import (
    ClusterConfig,
    ModelConfig,
    load_plan,
    num_microbatches,
    plan_to_dict,
)
from schedules.resolve import resolve_plan

LLAMA_70B_PLAN = """
model:
  name: llama3-70b
  num_layers: 80
  hidden_size: 8192
  num_heads: 64
  num_kv_heads: 8
  ffn_hidden_size: 28672
  vocab_size: 128256
  seq_len: 8192
  gated_mlp: true
  tied_embeddings: false
cluster:
  node: dgx-h100
  num_nodes: 32
  fabric: ib-ndr
parallel:
  tp: 4
  pp: 4
  cp: 1
  vpp: 1
  schedule: 1f1b
  sequence_parallel: true
  recompute: selective
  data_parallel: fsdp
training:
  micro_batch_size: 1
  global_batch_size: 512
  precision: bf16
"""


def raw_plan() -> dict[str, Any]:
    """The example plan as a mutable mapping."""
    return copy.deepcopy(yaml.safe_load(LLAMA_70B_PLAN))


def test_load_plan_from_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(LLAMA_70B_PLAN)
    plan = load_plan(path)
    assert plan.model.num_kv_heads == 8
    assert plan.model.head_dim == 128 and plan.model.kv_size == 1024
    assert plan.parallel.tp == 4 and plan.parallel.dp == 0
    assert plan.cluster.source() == {"node": "dgx-h100", "num_nodes": 32, "fabric": "ib-ndr"}
    assert plan.base_dir == str(tmp_path.resolve())
    assert plan.parallel.ddp_bucket_mb == 25.0 and plan.parallel.fsdp_limit_all_gathers


def test_defaults_of_optional_keys() -> None:
    raw = raw_plan()
    del raw["model"]["num_kv_heads"], raw["parallel"]
    plan = load_plan(raw)
    assert plan.model.num_kv_heads == 64
    assert plan.parallel.cp == 1 and plan.parallel.schedule == "1f1b"
    assert plan.parallel.recompute == "none" and plan.parallel.data_parallel == "ddp"
    assert plan.training.flash_attention


def test_mlp_activation_sets_gated() -> None:
    raw = raw_plan()
    del raw["model"]["gated_mlp"]
    raw["model"]["mlp_activation"] = "gelu"
    assert load_plan(raw).model.gated_mlp is False
    raw["model"]["gated_mlp"] = True
    with pytest.raises(
        ValueError, match=re.escape("mlp_activation='gelu' contradicts model.gated_mlp")
    ):
        load_plan(raw)


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("model", "hiden_size", 1, "unknown key 'model.hiden_size'"),
        ("parallel", "tpp", 2, "unknown key 'parallel.tpp'"),
        ("training", "lr", 1e-4, "unknown key 'training.lr'"),
        ("parallel", "tp", "4", "parallel.tp must be int, got '4'"),
        ("parallel", "sequence_parallel", 1, "parallel.sequence_parallel must be bool"),
        ("parallel", "schedule", "1f1b2", "parallel.schedule='1f1b2' is not one of"),
        ("parallel", "recompute", "some", "parallel.recompute='some' is not one of"),
        ("parallel", "data_parallel", "zero4", "parallel.data_parallel='zero4' is not one of"),
        ("training", "precision", "fp4", "training.precision='fp4' is not one of"),
        ("model", "num_layers", 0, "model.num_layers must be > 0, got 0"),
        ("model", "num_kv_heads", 7, "model.num_kv_heads=7 must divide model.num_heads=64"),
        ("cluster", "oversubscription", 0.5, "cluster.oversubscription must be >= 1.0"),
    ],
)
def test_strict_loading_names_the_key(section: str, key: str, value: Any, message: str) -> None:
    raw = raw_plan()
    raw[section][key] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        load_plan(raw)


def test_unknown_top_level_key_and_missing_section() -> None:
    raw = raw_plan()
    raw["optimizer"] = {"name": "adam"}
    with pytest.raises(ValueError, match="unknown key 'optimizer' in plan"):
        load_plan(raw)
    raw = raw_plan()
    del raw["training"]
    with pytest.raises(ValueError, match="missing section 'training'"):
        load_plan(raw)
    raw = raw_plan()
    del raw["model"]["seq_len"]
    with pytest.raises(ValueError, match=re.escape("missing key 'model.seq_len'")):
        load_plan(raw)


def test_cluster_needs_exactly_one_of_node_or_file() -> None:
    with pytest.raises(ValueError, match="exactly one of 'node' or 'file'"):
        ClusterConfig(node="dgx-h100", file="c.yaml")
    with pytest.raises(ValueError, match="exactly one of 'node' or 'file'"):
        ClusterConfig()
    assert ClusterConfig(file="c.yaml").source() == "c.yaml"


def test_resolve_derives_dp_and_microbatches() -> None:
    plan = resolve_plan(load_plan(raw_plan()), world_size=256)
    assert plan.parallel.dp == 16
    assert num_microbatches(plan) == 512 // (1 * 16)


def test_num_microbatches_needs_resolved_plan() -> None:
    with pytest.raises(ValueError, match="resolved plan"):
        num_microbatches(load_plan(raw_plan()))


def test_plan_to_dict_round_trip() -> None:
    plan = load_plan(raw_plan())
    assert load_plan(plan_to_dict(plan)) == plan


def _resolve_error(changes: dict[str, dict[str, Any]], world_size: int) -> str:
    raw = raw_plan()
    for section, values in changes.items():
        raw[section].update(values)
    with pytest.raises(ValueError) as info:
        resolve_plan(load_plan(raw), world_size=world_size)
    return str(info.value)


@pytest.mark.parametrize(
    ("changes", "world_size", "fragments"),
    [
        ({}, 250, ["world size 250", "tp*cp*pp = 16", "tp=4, cp=1, pp=4"]),
        ({"parallel": {"dp": 8}}, 256, ["world size 256 != tp*cp*pp*dp = 128", "dp=8"]),
        ({"parallel": {"tp": 3}}, 48, ["model.num_heads=64 is not divisible by tp=3"]),
        (
            {"parallel": {"tp": 16, "sequence_parallel": False}},
            64,
            ["model.num_kv_heads=8 is not divisible by tp=16"],
        ),
        ({"parallel": {"pp": 3}}, 12, ["model.num_layers=80 is not divisible by pp*vpp=3"]),
        (
            {"training": {"global_batch_size": 100}},
            256,
            ["global_batch_size=100", "micro_batch_size*dp = 1*16 = 16"],
        ),
        ({"parallel": {"cp": 3}}, 48, ["model.seq_len=8192 is not divisible by 2*cp=6"]),
        ({"parallel": {"vpp": 2}}, 256, ["vpp=2 > 1 needs schedule 'interleaved'"]),
        (
            {"parallel": {"schedule": "interleaved"}},
            256,
            ["needs pp > 1 and vpp > 1", "pp=4, vpp=1"],
        ),
        (
            {
                "parallel": {"schedule": "interleaved", "vpp": 2},
                "training": {"global_batch_size": 96},
            },
            256,
            ["multiple of pp", "micro-batches=6, pp=4, vpp=2"],
        ),
        (
            {"parallel": {"fsdp_backward_prefetch": "backward_post", "data_parallel": "ddp"}},
            256,
            ["fsdp_backward_prefetch='backward_post' applies only", "data_parallel='ddp'"],
        ),
        (
            {"parallel": {"zero_bucket_elems": 1000}},
            256,
            ["zero_bucket_elems=1000 applies only to data_parallel zero1 | zero2 | zero3"],
        ),
        (
            {"parallel": {"overlap_param_gather": True}},
            256,
            ["overlap_param_gather=True applies only to data_parallel distributed_optimizer"],
        ),
        (
            {"parallel": {"tp_comm_overlap": True, "sequence_parallel": False}},
            256,
            ["tp_comm_overlap needs sequence_parallel", "sequence_parallel=False, tp=4"],
        ),
        (
            {"parallel": {"tp": 1, "sequence_parallel": True}},
            64,
            ["sequence_parallel needs tp > 1"],
        ),
        (
            {"parallel": {"data_parallel": "hsdp", "hsdp_shard_size": 5}},
            256,
            ["hsdp_shard_size=5 must divide dp=16"],
        ),
    ],
)
def test_every_validation_error_prints_its_values(
    changes: dict[str, dict[str, Any]], world_size: int, fragments: list[str]
) -> None:
    message = _resolve_error(changes, world_size)
    for fragment in fragments:
        assert fragment in message, message


def test_sequence_parallel_needs_tokens_divisible_by_tp() -> None:
    message = _resolve_error({"model": {"seq_len": 8190}, "parallel": {"cp": 1}}, 256)
    assert "seq_len/cp = 8190/1 must be divisible by tp=4" in message


def test_interleaved_valid_plan_resolves() -> None:
    raw = raw_plan()
    raw["parallel"].update({"schedule": "interleaved", "vpp": 5})
    plan = resolve_plan(load_plan(raw), world_size=256)
    assert num_microbatches(plan) % plan.parallel.pp == 0


def test_model_config_direct_construction() -> None:
    model = ModelConfig(
        name="tiny",
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        ffn_hidden_size=256,
        vocab_size=1000,
        seq_len=128,
    )
    assert model.num_kv_heads == 4 and model.gated_mlp and model.activation == "swiglu"
    assert dataclasses.replace(model, gated_mlp=False).activation == "gelu"
    with pytest.raises(
        ValueError, match=re.escape("hidden_size=64 is not divisible by model.num_heads=5")
    ):
        ModelConfig(
            name="bad",
            num_layers=2,
            hidden_size=64,
            num_heads=5,
            ffn_hidden_size=256,
            vocab_size=1000,
            seq_len=128,
        )


def test_number_written_as_text_gets_a_hint() -> None:
    raw = yaml.safe_load(LLAMA_70B_PLAN.replace("data_parallel: fsdp", "data_parallel: zero3"))
    raw["parallel"]["zero_bucket_elems"] = yaml.safe_load("5e8")  # YAML 1.1 reads this as text
    with pytest.raises(ValueError, match="write it as a plain number: 500000000"):
        load_plan(raw)


def test_framework_knobs_can_be_written_as_groups() -> None:
    base = {
        "model": {"preset": "llama3-8b"},
        "cluster": {"node": "dgx-h100"},
        "training": {"micro_batch_size": 1, "global_batch_size": 8},
    }
    nested = load_plan(
        {
            **base,
            "parallel": {
                "data_parallel": "fsdp",
                "fsdp": {"version": 2, "reduce_dtype": "bf16"},
                "offload": {"param": "cpu", "pin_memory": False},
            },
        }
    )
    flat = load_plan(
        {
            **base,
            "parallel": {
                "data_parallel": "fsdp",
                "fsdp_version": 2,
                "fsdp_reduce_dtype": "bf16",
                "offload_param": "cpu",
                "offload_pin_memory": False,
            },
        }
    )
    assert nested == flat
    with pytest.raises(ValueError, match=r"'parallel\.zero\.bucket' .*keys of parallel\.zero"):
        load_plan({**base, "parallel": {"zero": {"bucket": 1}}})
    with pytest.raises(ValueError, match=r"parallel\.ddp\.bucket_mb and parallel\.ddp_bucket_mb"):
        load_plan({**base, "parallel": {"ddp": {"bucket_mb": 5}, "ddp_bucket_mb": 5}})
