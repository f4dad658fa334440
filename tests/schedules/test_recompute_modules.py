"""Megatron-Core's selective recompute by module (``parallel.recompute_modules``): what each
module stops keeping and runs again, by hand, the checks, and the Megatron importer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schedules.activations import ACTIVATION_BYTES, attention_core_bytes
from schedules.flops import gemm_flops, hardware_flops_per_step, model_flops_per_step
from schedules.importers import from_megatron_args
from schedules.kernels import ELEMENTWISE_BYTES, attention_core_kernels, layer_kernels
from schedules.memory import activation_bytes
from schedules.moe import expert_tokens
from schedules.moe_kernels import moe_layer_kernels
from schedules.plan import load_plan
from schedules.recompute_modules import module_saved_delta, selective_modules
from schedules.resolve import resolve_plan

LATENT_MOE = {
    "name": "latent-moe", "num_layers": 4, "hidden_size": 64, "num_heads": 4, "head_dim": 16,
    "kv_lora_rank": 8, "q_lora_rank": 24, "qk_rope_head_dim": 4, "v_head_dim": 12,
    "ffn_hidden_size": 128, "vocab_size": 1000, "seq_len": 32, "num_experts": 4,
    "moe_top_k": 2, "moe_ffn_hidden_size": 32, "moe_shared_expert_ffn_hidden_size": 32,
    "moe_first_dense_layers": 1,
}  # fmt: skip
"""One dense layer, then three MoE layers with a shared expert, under latent attention."""


def plan_of(modules: list[str] | None, model: dict[str, Any] | None = None, **over: Any) -> Any:
    listed = {} if modules is None else {"recompute_modules": modules}
    parallel = {"recompute": "selective", "tp": 2, "ep": 2, "etp": 1, **listed, **over}
    parallel.setdefault("sequence_parallel", True)
    plan = load_plan(
        {
            "model": model or LATENT_MOE,
            "cluster": {"node": "dgx-h100"},
            "parallel": parallel,
            "training": {"micro_batch_size": 2, "global_batch_size": 16, "stack": "megatron"},
        }
    )
    return resolve_plan(plan, 8)


def test_the_default_is_the_attention_core() -> None:
    plan = plan_of(None)
    assert selective_modules(plan.parallel) == {"core_attn"}
    assert module_saved_delta(plan, moe_layer=False) == 0.0
    core_forward, _ = attention_core_kernels(plan)
    assert layer_kernels(plan).recompute == core_forward


def test_each_module_keeps_less_by_hand() -> None:
    tokens, t = 2 * 32, 2  # sequence parallel over TP 2
    # without core_attn the core's row statistics are kept (fp32 per head and query)
    core = attention_core_bytes(plan_of([]).model, 2, cp=1, flash_attention=True) / t
    assert module_saved_delta(plan_of([]), moe_layer=False) == core
    # Q 80, K 80 and V 48 wide, split over TP 2, and the latent norms' outputs (24 + 8, on the
    # sequence shard), 2 bytes each: the checkpoint keeps only the latents it starts from
    up = ACTIVATION_BYTES * tokens * (80 + 80 + 48 + 24 + 8) / t
    assert module_saved_delta(plan_of(["core_attn", "mla_up_proj"]), moe_layer=True) == -up
    # the input norm before latent attention, and the pre-MLP norm of an MoE layer: the
    # sequence shard's outputs
    norm = ACTIVATION_BYTES * tokens * 64 / t
    assert module_saved_delta(plan_of(["core_attn", "layernorm"]), moe_layer=False) == -norm
    assert module_saved_delta(plan_of(["core_attn", "layernorm"]), moe_layer=True) == -2 * norm
    # a dense layer's MLP: its fused norm's output (sharded) and the gated 3f hidden over TP
    mlp = ACTIVATION_BYTES * tokens * (3 * 128 / t + 64 / t)
    assert module_saved_delta(plan_of(["core_attn", "mlp"]), moe_layer=False) == -mlp
    assert module_saved_delta(plan_of(["core_attn", "mlp"]), moe_layer=True) == 0.0
    # the experts' activation outputs: each GPU routes its 32 tokens to 2 experts, 64 rows
    # on average over EP 2 and the busiest GPU's chance excess above them
    # (``schedules.moe.expert_tokens``), of the 32-wide expert (etp 1)
    act = plan_of(["core_attn", "moe_act"])
    rows = expert_tokens(act)
    assert 64 < rows < 64 * 1.1
    assert module_saved_delta(act, moe_layer=True) == -ACTIVATION_BYTES * rows * 32
    # the shared expert's 3 x 32 over TP, on the gathered 64 tokens
    shared = ACTIVATION_BYTES * tokens * 3 * 32 / t
    assert module_saved_delta(plan_of(["core_attn", "shared_experts"]), moe_layer=True) == -shared


def test_memory_falls_with_the_modules() -> None:
    base = activation_bytes(plan_of(None), 0)
    fewer = activation_bytes(plan_of(["core_attn", "mla_up_proj", "layernorm", "moe_act"]), 0)
    assert fewer < base


def test_recompute_kernels_of_each_module() -> None:
    plan = plan_of(["mla_up_proj", "mlp"])
    dense = layer_kernels(plan).recompute
    names = [k.name for k in dense]
    assert "attention" not in names  # core_attn not listed
    up = [k for k in dense if k.name == "mla_up_proj_recompute" and k.kind == "gemm"]
    # q_up 24 -> 80 / 2 and kv_up 8 -> 112 / 2 on 64 tokens
    assert sorted(k.flops for k in up) == sorted([gemm_flops(64, 40, 24), gemm_flops(64, 56, 8)])
    assert {"fc1", "fc2", "mlp_recompute"} <= set(names)
    moe = moe_layer_kernels(plan_of(["moe_act", "shared_experts"])).recompute
    moe_names = [k.name for k in moe]
    assert {"shared_fc1", "shared_fc2", "shared_experts_recompute", "moe_act_recompute"} <= set(
        moe_names
    )
    act = next(k for k in moe if k.name == "moe_act_recompute")
    gated = ELEMENTWISE_BYTES["megatron"]["gated"]
    assert act.bytes == gated * expert_tokens(plan_of(["moe_act"])) * 32


def test_hardware_flops_count_the_rerun_matmuls() -> None:
    default = plan_of(None)
    listed = plan_of(["core_attn", "mla_up_proj", "mlp", "shared_experts"])
    batch, tokens = 16, 16 * 32
    up = gemm_flops(tokens, 80, 24) + gemm_flops(tokens, 112, 8)
    mlp = 3 * gemm_flops(tokens, 128, 64)  # one dense layer
    shared = 3 * gemm_flops(tokens, 32, 64)  # three MoE layers
    extra = 4 * up + mlp + 3 * shared
    assert hardware_flops_per_step(listed) == pytest.approx(
        hardware_flops_per_step(default) + extra
    )
    assert model_flops_per_step(listed) == model_flops_per_step(default)
    assert batch == default.training.global_batch_size


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        ({"recompute": "full"}, r"recompute_modules needs recompute selective"),
        ({"recompute_modules": ["moe"]}, r"moe \(rerunning the whole MoE layer"),
        ({"recompute_modules": ["mlp", "mlp"]}, r"lists a module twice"),
        ({"recompute_modules": ["core"]}, r"not one of core_attn, mla_up_proj"),
        ({"recompute_modules": [3]}, r"parallel.recompute_modules must list names"),
    ],
)
def test_bad_module_lists_are_one_clear_error(parallel: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_of(["mlp"], **parallel)


def test_modules_a_model_or_stack_lacks_are_refused() -> None:
    dense = {k: v for k, v in LATENT_MOE.items() if not k.startswith(("moe_", "num_experts"))}
    with pytest.raises(ValueError, match=r"moe_act needs model.num_experts"):
        plan_of(["moe_act"], dense, ep=1, etp=0)
    plain = {k: v for k, v in dense.items() if k not in ("kv_lora_rank", "q_lora_rank")}
    plain = {k: v for k, v in plain.items() if k not in ("qk_rope_head_dim", "v_head_dim")}
    with pytest.raises(ValueError, match=r"mla_up_proj needs model.kv_lora_rank"):
        plan_of(["mla_up_proj"], plain, ep=1, etp=0)
    with pytest.raises(ValueError, match=r"stack eager has no such knob"):
        load_and_resolve_eager()


def load_and_resolve_eager() -> Any:
    plan = load_plan(
        {
            "model": LATENT_MOE,
            "cluster": {"node": "dgx-h100"},
            "parallel": {"recompute": "selective", "recompute_modules": ["layernorm"]},
            "training": {"micro_batch_size": 2, "global_batch_size": 16, "stack": "eager"},
        }
    )
    return resolve_plan(plan, 8)


def test_megatron_importer_reads_the_modules(tmp_path: Path) -> None:
    args = (
        "pretrain_gpt.py --recompute-granularity selective --recompute-modules layernorm moe_act "
        "moe\n"
    )
    path = tmp_path / "run.sh"
    path.write_text(args)
    imported = from_megatron_args(path)
    assert imported.sections["parallel"]["recompute_modules"] == ["layernorm", "moe_act"]
    assert any("--recompute-modules moe" in line for line in imported.warnings)
    path.write_text(args.replace("moe_act", "attn"))
    with pytest.raises(ValueError, match=r"--recompute-modules 'attn' is not one of"):
        from_megatron_args(path)


def test_mla_up_proj_reruns_a_direct_query_projection_too() -> None:
    """Without query compression Megatron-Core's checkpointed up projection starts from the
    hidden state and runs ``linear_q_proj`` inside it."""
    direct = {**LATENT_MOE, "q_lora_rank": 0}
    plan = plan_of(["mla_up_proj"], direct)
    up = [k for k in layer_kernels(plan).recompute if k.name == "mla_up_proj_recompute"]
    gemms = sorted(k.flops for k in up if k.kind == "gemm")
    assert gemms == sorted([gemm_flops(64, 40, 64), gemm_flops(64, 56, 8)])


def test_delayed_fp8_with_layernorm_or_moe_act_is_refused() -> None:
    with pytest.raises(ValueError, match=r"layernorm with training.te_fp8_recipe delayed"):
        plan = load_plan(
            {
                "model": LATENT_MOE,
                "cluster": {"node": "dgx-h100"},
                "parallel": {
                    "recompute": "selective",
                    "recompute_modules": ["layernorm"],
                    "tp": 2,
                    "ep": 2,
                    "etp": 1,
                    "sequence_parallel": True,
                },
                "training": {
                    "micro_batch_size": 2,
                    "global_batch_size": 16,
                    "stack": "megatron",
                    "precision": "fp8",
                },
            }
        )
        resolve_plan(plan, 8)


@pytest.mark.parametrize(("listed", "read"), [("moe", []), ("", []), ("mlp moe", ["mlp"])])
def test_the_importer_keeps_what_megatron_reruns(tmp_path: Path, listed: str, read: list) -> None:
    """``--recompute-modules moe`` (not modelled) or an empty list rerun no attention core:
    Megatron's default applies only when the flag is absent."""
    path = tmp_path / "run.sh"
    path.write_text(
        f"pretrain_gpt.py --recompute-granularity selective --recompute-modules {listed}\n"
    )
    assert from_megatron_args(path).sections["parallel"]["recompute_modules"] == read


def test_a_rerun_mlp_repeats_its_tp_collectives() -> None:
    """Megatron-Core checkpoints the MLP with its forward: under sequence parallelism the rerun
    gathers the MLP's input and reduce-scatters its output again, once per dense layer."""
    from sim.compute.compute_model import ComputeModel
    from sim.replay.recipes import step_costs, uniform_recipes
    from topologies.hardware import GPUS

    dense = {k: v for k, v in LATENT_MOE.items() if not k.startswith(("moe_", "num_experts"))}

    def backward_collectives(modules: list[str]) -> list[str]:
        plan = plan_of(modules, dense, ep=1, etp=0)
        costs = step_costs(plan, ComputeModel(GPUS["h100-sxm"]))
        steps = uniform_recipes(plan, costs, 2)["B"]
        return [s.op for s in steps if hasattr(s, "op") for _ in range(s.repeat)]

    base, rerun = backward_collectives(["core_attn"]), backward_collectives(["core_attn", "mlp"])
    assert sorted(rerun) == sorted(base + ["all_gather", "reduce_scatter"] * 2)


@pytest.mark.parametrize(
    ("recipe", "priced"), [("tensorwise", "current"), ("delayed", "delayed"), ("mxfp8", "current")]
)
def test_the_importer_reads_the_fp8_recipe(tmp_path: Path, recipe: str, priced: str) -> None:
    """Megatron's ``--fp8-recipe``: tensorwise is Transformer Engine's current scaling (what
    ``layernorm`` / ``moe_act`` recompute need under FP8); block scaling is priced as it."""
    path = tmp_path / "run.sh"
    path.write_text(f"pretrain_gpt.py --bf16 --fp8-format hybrid --fp8-recipe {recipe}\n")
    imported = from_megatron_args(path)
    assert imported.sections["training"]["te_fp8_recipe"] == priced
    assert any("block scaling" in w for w in imported.warnings) == (recipe == "mxfp8")
