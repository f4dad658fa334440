"""Megatron-Core's flex dispatcher with DeepEP (``moe_token_dispatcher: flex``): each token goes
once to each destination server; the servers a token's experts sit on, by hand; group-limited
routing's keys, checks and importers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schedules.importers import from_megatron_args
from schedules.importers.hf import model_from_hf_config
from schedules.moe import destination_nodes, dispatch_bytes, ep_nodes, routed_tokens
from schedules.plan import ModelConfig, load_plan
from schedules.resolve import resolve_plan

MOE = {
    "name": "moe", "num_layers": 4, "hidden_size": 1024, "num_heads": 16,
    "ffn_hidden_size": 4096, "vocab_size": 32000, "seq_len": 4096, "num_experts": 64,
    "moe_top_k": 8, "moe_ffn_hidden_size": 512,
}  # fmt: skip


def _plan(model: dict[str, Any], dispatcher: str, ep: int, nodes: int, **over: Any) -> Any:
    plan = load_plan(
        {
            "model": model,
            "cluster": {"node": "dgx-h100", "num_nodes": nodes},
            "parallel": {
                "ep": ep,
                "moe_token_dispatcher": dispatcher,
                "data_parallel": "distributed_optimizer",
                **over,
            },
            "training": {
                "micro_batch_size": 1,
                "global_batch_size": 8 * nodes,
                "stack": "megatron",
            },
        }
    )
    return resolve_plan(plan, 8 * nodes)


def test_destination_servers_by_hand() -> None:
    model = ModelConfig(**{**MOE, "moe_router_num_groups": 8, "moe_router_group_topk": 4})
    assert destination_nodes(model, 8) == 4.0  # a group per server: its 4 groups
    # two groups per server: 4 of 8 groups miss a server with probability C(6,4)/C(8,4)
    assert destination_nodes(model, 4) == pytest.approx(4 * (1 - 15 / 70))
    # a group over two servers: each chosen group's 2 experts over its 2 servers
    assert destination_nodes(model, 16) == pytest.approx(4 * 2 * (1 - (1 / 2) ** 2))
    free = ModelConfig(**MOE)
    assert destination_nodes(free, 4) == pytest.approx(4 * (1 - 0.75**8))


def test_the_message_carries_one_copy_per_destination_server() -> None:
    grouped = {**MOE, "moe_router_num_groups": 8, "moe_router_group_topk": 2}
    alltoall = _plan(grouped, "alltoall", 32, 4)
    flex = _plan(grouped, "flex", 32, 4)
    assert ep_nodes(flex.parallel, 8) == 4
    copies = destination_nodes(flex.model, 4)  # 2 of 8 groups, two per server
    assert copies == pytest.approx(4 * (1 - (6 * 5 / 2) / (8 * 7 / 2)))
    ratio = dispatch_bytes(flex, gpus_per_node=8) / dispatch_bytes(alltoall)
    assert ratio == pytest.approx(copies / 8)
    # within one server DeepEP sends a token once to each GPU its experts sit on
    one_server = _plan(grouped, "flex", 8, 1)
    ratio = dispatch_bytes(one_server, gpus_per_node=8) / dispatch_bytes(
        _plan(grouped, "alltoall", 8, 1)
    )
    assert ratio == pytest.approx(8 * (1 - (7 / 8) ** 8) / 8)
    assert routed_tokens(flex) == 4096
    with pytest.raises(ValueError, match="GPUs per server"):
        dispatch_bytes(flex)


@pytest.mark.parametrize(
    ("model", "over", "message"),
    [
        (MOE, {"training": {"stack": "eager"}}, "stack megatron"),
        ({**MOE, "moe_router_num_groups": 6, "moe_router_group_topk": 2}, {}, "divide"),
        ({**MOE, "moe_router_num_groups": 16, "moe_router_group_topk": 1}, {}, "exceeds"),
        ({**MOE, "moe_capacity_factor": 1.0}, {}, "capacity factor"),
    ],
)
def test_refusals(model: dict[str, Any], over: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan = load_plan(
            {
                "model": model,
                "cluster": {"node": "dgx-h100", "num_nodes": 2},
                "parallel": {"ep": 8, "moe_token_dispatcher": "flex"},
                "training": {"micro_batch_size": 1, "global_batch_size": 16, "stack": "megatron",
                             **over.get("training", {})},
            }
        )  # fmt: skip
        resolve_plan(plan, 16)


def test_group_keys_need_experts() -> None:
    dense = {k: v for k, v in MOE.items() if not k.startswith(("num_experts", "moe_"))}
    with pytest.raises(ValueError, match=r"need model\.num_experts"):
        ModelConfig(**dense, moe_router_num_groups=8, moe_router_group_topk=4)


def test_importers_read_the_routing_groups_and_the_dispatcher(tmp_path: Path) -> None:
    args = tmp_path / "args.txt"
    args.write_text(
        "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 4096 "
        "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 8 "
        "--num-experts 64 --moe-router-topk 8 --expert-model-parallel-size 8 "
        "--moe-router-num-groups 8 --moe-router-group-topk 4 "
        "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep\n"
    )
    sections = from_megatron_args(args).sections
    assert sections["parallel"]["moe_token_dispatcher"] == "flex"
    assert (
        sections["model"]["moe_router_num_groups"],
        sections["model"]["moe_router_group_topk"],
    ) == (8, 4)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 4,
        "num_attention_heads": 16, "vocab_size": 32000, "max_position_embeddings": 4096,
        "n_routed_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
        "n_group": 8, "topk_group": 4,
    }))  # fmt: skip
    hf = model_from_hf_config(config).sections["model"]
    assert (hf["moe_router_num_groups"], hf["moe_router_group_topk"]) == (8, 4)
