"""Megatron's distributed optimizer: gradient buffer dtype, the precision-aware optimizer's state,
FP8 weights; bytes per parameter by hand from Megatron-Core's rules (schedules.optimizer_states)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import simpy

from schedules import memory, optimizer_states
from schedules.float8 import layer_linear_params_per_gpu
from schedules.importers.megatron import from_megatron_args
from schedules.messages import dp_param_bytes
from schedules.moe import expert_tokens
from schedules.params import stage_layer_params_per_gpu, stage_params_per_gpu
from schedules.plan import ClusterConfig, ModelConfig, ParallelConfig, Plan, TrainingConfig
from schedules.resolve import resolve_plan
from schedules.step import describe_step
from schedules.transformer_engine import weight_cast_bytes_per_step
from sim.compute.compute_model import ComputeModel
from sim.network.comm_model import CommModel
from sim.replay.simulate import plan_topology, simulate_plan
from sim.replay.step_fit import modelled_classes_s
from topologies.hardware import GPUS

MODEL = ModelConfig(
    name="m", num_layers=8, hidden_size=1024, num_heads=16, num_kv_heads=4,
    ffn_hidden_size=4096, vocab_size=32000, seq_len=2048,
)  # fmt: skip
WORLD = 16
"""Two DGX H100: tp 2, dp 8."""


def make_plan(
    *, precision: str = "bf16", training: dict[str, Any] | None = None, **par: Any
) -> Plan:
    plan = Plan(
        model=MODEL,
        cluster=ClusterConfig(node="dgx-h100", num_nodes=2),
        parallel=ParallelConfig(data_parallel="distributed_optimizer", tp=2, **par),
        training=TrainingConfig(
            micro_batch_size=1, global_batch_size=64, precision=precision, **(training or {})
        ),
    )
    return resolve_plan(plan, WORLD)


AWARE = {"use_precision_aware_optimizer": True}
CURRENT = {"te_fp8_recipe": "current"}


@pytest.mark.parametrize(
    ("precision", "training", "parallel", "state", "traffic"),
    [
        # Megatron's own fp32 master and fp32 moments: 4 + 4 + 4; Adam reads and writes them and
        # writes the bf16 weight: 24 + 2
        ("bf16", {}, {}, 12, 26),
        # Transformer Engine's master as the 16-bit remainder: 2 + 4 + 4; the bf16 weight is
        # read and written beside it
        ("bf16", {}, AWARE, 10, 20 + 2 + 2),
        ("bf16", {}, {**AWARE, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 6, 16),
        # moments other than a bf16 pair are unscaled into fp32 temporaries and scaled back:
        # fp8 1 + 4 + 8 + 4 + 4 + 1 = 22, fp16 2 + 4 + 8 (its scale) + 8 + 4 + 8 + 6 = 40
        ("bf16", {}, {**AWARE, "exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "fp16"}, 5, 22 + 40 + 8),
        # a bf16 moment beside an fp32 one is not fused: 2 + 4, 8, then 4 + 2 and 2 + 2
        ("bf16", {}, {**AWARE, "exp_avg_dtype": "bf16"}, 8, 24 + 8 + 8),
        # an fp16 master (Transformer Engine's) the same way, then the bf16 weight written
        ("bf16", {}, {**AWARE, "main_params_dtype": "fp16"}, 10, 8 + 8 + 40 + 2),
        # fp16 weights: no remainders (bf16 only), Transformer Engine's fp32 master
        ("fp16", {}, AWARE, 12, 26),
        # delayed-scaling FP8 keeps Transformer Engine's master (Megatron's exception)
        ("fp8", {}, AWARE, 10, 24),
        # current scaling: Megatron's own fp32 master, the moments as set
        ("fp8", CURRENT, {**AWARE, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 8, 18),
        ("fp8", CURRENT, {**AWARE, "main_params_dtype": "fp16"}, 10, 58),
    ],
)
def test_adam_state_bytes(
    precision: str, training: dict[str, Any], parallel: dict[str, Any], state: int, traffic: int
) -> None:
    plan = make_plan(precision=precision, training=training, **parallel)
    assert optimizer_states.optimizer_bytes_per_param(plan) == state
    assert optimizer_states.adam_traffic_bytes(plan) == traffic


def test_memory_shards_the_smaller_state_and_halves_bf16_gradients() -> None:
    base = make_plan()
    lean = make_plan(
        grad_reduce_in_fp32=False, **AWARE, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"
    )
    params = stage_params_per_gpu(base, 0)
    before, after = memory.stage_memory_bytes(base, 0), memory.stage_memory_bytes(lean, 0)
    assert before["gradients"] == pytest.approx(params * 4)
    assert after["gradients"] == pytest.approx(params * 2)
    assert before["optimizer"] == pytest.approx(params * 12 / 8)  # sharded over dp = 8
    assert after["optimizer"] == pytest.approx(params * 6 / 8)
    assert after["weights"] == before["weights"]


def test_bf16_gradients_halve_the_reduce_scatter_and_megatrons_buckets() -> None:
    base, lean = make_plan(), make_plan(grad_reduce_in_fp32=False)
    params = stage_params_per_gpu(base, 0)
    for plan, per_param in ((base, 4), (lean, 2)):
        (chunk,) = describe_step(plan, gpus_per_node=8).stages[0].chunks
        assert sum(size for size, _ in chunk.grad_buckets) == pytest.approx(params * per_param)
    # Megatron's bucket is 40M elements: 160 MB of fp32 or 80 MB of bf16 gradients, so the
    # larger model's chunk splits into as many buckets of half the bytes
    big = dataclasses.replace(MODEL, hidden_size=4096, num_heads=32, num_kv_heads=8)
    buckets = []
    for fp32 in (True, False):
        plan = resolve_plan(dataclasses.replace(make_plan(grad_reduce_in_fp32=fp32), model=big), 16)
        (chunk,) = describe_step(plan, gpus_per_node=8).stages[0].chunks
        buckets.append([size for size, _ in chunk.grad_buckets])
    assert len(buckets[0]) == len(buckets[1]) > 2
    assert max(buckets[0]) == pytest.approx(40e6 * 4)
    assert buckets[1] == pytest.approx([size / 2 for size in buckets[0]])


def test_fp8_weights_gather_at_one_byte_and_keep_no_bf16_copy() -> None:
    plain = make_plan(precision="fp8", training=CURRENT)
    fp8 = make_plan(precision="fp8", training={**CURRENT, "fp8_param_gather": True})
    layers = stage_layer_params_per_gpu(fp8, 0)
    params = stage_params_per_gpu(fp8, 0)
    (chunk,) = describe_step(fp8, gpus_per_node=8).stages[0].chunks
    (plain_chunk,) = describe_step(plain, gpus_per_node=8).stages[0].chunks
    assert plain_chunk.gather_bytes == pytest.approx(params * 2)
    assert chunk.gather_bytes == pytest.approx(layers * 1 + (params - layers) * 2)
    before, after = memory.stage_memory_bytes(plain, 0), memory.stage_memory_bytes(fp8, 0)
    assert before["weights"] - after["weights"] == pytest.approx(layers * 2)
    assert after["fp8_weights"] == before["fp8_weights"] > 0


def test_fp8_weights_are_transposed_not_cast_and_the_shard_cast_reads_its_amax() -> None:
    fp8 = make_plan(precision="fp8", training={**CURRENT, "fp8_param_gather": True})
    delayed = make_plan(precision="fp8", training={"fp8_param_gather": True})
    linear = 8 * layer_linear_params_per_gpu(MODEL, 2)
    shard = 1e6
    # cast-transpose (4) and the amax read (2) per weight without FP8 weights
    assert weight_cast_bytes_per_step(make_plan(precision="fp8", training=CURRENT), 8, shard) == (
        pytest.approx(6 * linear)
    )
    assert weight_cast_bytes_per_step(fp8, 8, shard) == pytest.approx(2 * linear + 4 * shard)
    assert weight_cast_bytes_per_step(delayed, 8, shard) == pytest.approx(2 * linear)


@pytest.mark.parametrize(
    ("parallel", "training", "message"),
    [
        ({"exp_avg_dtype": "bf16"}, {}, "needs parallel.use_precision_aware_optimizer=true"),
        ({"main_params_dtype": "bf16"}, {}, "main_params_dtype='bf16' is not one of fp32, fp16"),
        ({"data_parallel": "zero1", "grad_reduce_in_fp32": False}, {}, "distributed_optimizer"),
        ({}, {"fp8_param_gather": True}, "needs training.precision=fp8"),
        (
            {"use_precision_aware_optimizer": True},
            {"precision": "fp8", "fp8_param_gather": True},
            "multi_tensor_adam_fp8",
        ),
        (
            {
                **AWARE,
                "exp_avg_dtype": "bf16",
                "exp_avg_sq_dtype": "bf16",
                "main_params_dtype": "fp16",
            },
            {"precision": "fp8", "fp8_param_gather": True},
            "multi_tensor_adam_fp8",
        ),
        (
            {**AWARE, "main_params_dtype": "fp16"},
            {"precision": "fp8", "te_fp8_recipe": "current", "fp8_param_gather": True},
            "shard_model_param is None",
        ),
        (
            {"data_parallel": "zero2"},
            {"precision": "fp8", "fp8_param_gather": True},
            "needs data_parallel distributed_optimizer on stack megatron",
        ),
    ],
)
def test_refused_in_one_line(
    parallel: dict[str, Any], training: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        plan = Plan(
            model=MODEL,
            cluster=ClusterConfig(node="dgx-h100", num_nodes=2),
            parallel=ParallelConfig(**{"data_parallel": "distributed_optimizer", **parallel}),
            training=TrainingConfig(micro_batch_size=1, global_batch_size=64, **training),
        )
        resolve_plan(plan, WORLD)


FLAGS = (
    "--tensor-model-parallel-size 2 --num-layers 8 --hidden-size 1024 --num-attention-heads 16 "
    "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 "
    "--ffn-hidden-size 4096 --vocab-size 32000 --use-distributed-optimizer --bf16 "
)


def _imported(tmp_path: Any, extra: str) -> dict[str, Any]:
    path = tmp_path / "args.txt"
    path.write_text(FLAGS + extra)
    return from_megatron_args(path).sections


def test_megatron_importer_reads_the_optimizer_dtypes(tmp_path: Any) -> None:
    plan = _imported(
        tmp_path,
        "--fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather "
        "--use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype bf16 "
        "--exp-avg-sq-dtype bf16",
    )
    parallel, training = plan["parallel"], plan["training"]
    assert parallel["grad_reduce_in_fp32"] is False
    assert parallel["use_precision_aware_optimizer"] is True
    assert (parallel["exp_avg_dtype"], parallel["exp_avg_sq_dtype"]) == ("bf16", "bf16")
    assert "main_params_dtype" not in parallel
    assert training["fp8_param_gather"] is True
    assert _imported(tmp_path, "--grad-reduce-in-bf16")["parallel"]["grad_reduce_in_fp32"] is False
    assert "grad_reduce_in_fp32" not in _imported(tmp_path, "")["parallel"]
    # fp16 keeps its 16-bit buffer unless asked (only bf16 turns fp32 accumulation on itself)
    fp16 = FLAGS.replace("--bf16", "--fp16")
    for extra, fp32 in (("", False), ("--accumulate-allreduce-grads-in-fp32", True)):
        (tmp_path / "fp16.txt").write_text(fp16 + extra)
        parallel = from_megatron_args(tmp_path / "fp16.txt").sections["parallel"]
        assert parallel.get("grad_reduce_in_fp32", True) is fp32


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("--exp-avg-dtype bf16", "need --use-precision-aware-optimizer"),
        (
            "--use-precision-aware-optimizer --main-grads-dtype bf16 "
            "--accumulate-allreduce-grads-in-fp32",
            "Megatron refuses the pair",
        ),
    ],
)
def test_megatron_importer_refuses_what_megatron_refuses(
    tmp_path: Any, extra: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _imported(tmp_path, extra)


def test_bf16_gradients_shorten_the_exposed_reduce_scatter_by_the_network_models() -> None:
    """Without ``overlap_grad_reduce`` the step ends with one reduce-scatter of every gradient
    over dp (ranks 0, 2, ..., 14) and the parameter all-gather: the exposed dp time differs by
    the reduce-scatter of 4 against 2 bytes per parameter, as the network model prices them."""
    exposed, plans = [], []
    for fp32 in (True, False):
        plan = Plan(
            model=MODEL,
            cluster=ClusterConfig(node="dgx-h100", num_nodes=2),
            parallel=ParallelConfig(
                data_parallel="distributed_optimizer",
                tp=2,
                overlap_grad_reduce=False,
                grad_reduce_in_fp32=fp32,
            ),
            training=TrainingConfig(micro_batch_size=1, global_batch_size=64),
        )
        exposed.append(simulate_plan(plan).breakdown.exposed_comm_s["dp"])
        plans.append(plan)
    estimate = CommModel(simpy.Environment(), plan_topology(plans[0])).estimate_s
    params = stage_params_per_gpu(resolve_plan(plans[0], WORLD), 0)
    dp_group = tuple(range(0, 16, 2))
    expected = estimate("reduce_scatter", dp_group, params * 4) - estimate(
        "reduce_scatter", dp_group, params * 2
    )
    assert expected > 0
    assert exposed[0] - exposed[1] == pytest.approx(expected, rel=1e-6)


def _te_plan(recipe: str | None, recompute: str = "selective", **model: Any) -> Plan:
    training = {"te_fp8_recipe": recipe} if recipe else {}
    plan = Plan(
        model=dataclasses.replace(MODEL, **model),
        cluster=ClusterConfig(node="dgx-h100", num_nodes=2),
        parallel=ParallelConfig(
            data_parallel="distributed_optimizer",
            tp=2,
            recompute=recompute,
            **({"ep": 4, "sequence_parallel": True} if model.get("num_experts") else {}),
        ),
        training=TrainingConfig(
            micro_batch_size=1,
            global_batch_size=64,
            precision="fp8" if recipe else "bf16",
            **training,
        ),
    )
    return resolve_plan(plan, WORLD)


def test_transformer_engine_saves_linear_inputs_in_fp8() -> None:
    """One dense layer of 2,048 tokens, h = 1024, f = 4096, tp 2 without SP: the qkv and fc1
    inputs (h each) and fc2's (f / 2) are kept at 1 byte instead of 2; the attention output
    (q / 2 = 512) into proj is an extra FP8 copy beside the fused attention's bf16 one under
    delayed scaling, the only copy when the core is recomputed, and Megatron-Core has proj keep
    the original under current scaling."""
    tokens, h, f, q = 2048, 1024, 4096, 1024
    base = tokens * (h + h + f / 2)
    assert memory.te_fp8_saved_bytes(_te_plan("current")) == base
    assert memory.te_fp8_saved_bytes(_te_plan("current", "none")) == base
    assert memory.te_fp8_saved_bytes(_te_plan("delayed")) == base + tokens * q / 2
    assert memory.te_fp8_saved_bytes(_te_plan("delayed", "none")) == base - tokens * q / 2
    assert memory.te_fp8_saved_bytes(_te_plan("delayed", "full")) == 0
    assert memory.te_fp8_saved_bytes(_te_plan(None)) == 0
    # the whole stage: 8 layers of one in-flight micro-batch (pp 1)
    fp8, bf16 = _te_plan("current"), _te_plan(None)
    assert memory.activation_bytes(bf16, 0) - memory.activation_bytes(fp8, 0) == (
        pytest.approx(8 * base)
    )


def test_transformer_engine_saves_the_experts_inputs_in_fp8() -> None:
    """An MoE layer (tp 2 with SP): the attention's qkv input as in a dense layer (h / 2 per
    token), the experts' permuted tokens (h each) and activation outputs (f_e / etp each) at 1 byte,
    the shared experts' activation output too (f_s / tp per token), and their fc1's FP8 copy of
    the norm output the router keeps in bf16 (+h / 2 per token)."""
    plan = _te_plan(
        "current", num_experts=8, moe_top_k=2, moe_ffn_hidden_size=512,
        moe_shared_expert_ffn_hidden_size=1024,
    )  # fmt: skip
    tokens, h = 2048, 1024
    copies = expert_tokens(plan)
    # the experts split over expert TP (etp unset: tp = 2), f_e / 2 each
    expected = tokens * h / 2 + copies * (h + 512 / 2) + tokens * 1024 / 2 - tokens * h / 2
    assert memory.te_fp8_saved_bytes(plan, moe_layer=True) == pytest.approx(expected)
    assert copies > 0


def test_the_precision_aware_optimizer_needs_the_distributed_optimizer(tmp_path: Any) -> None:
    path = tmp_path / "ddp.txt"
    path.write_text(
        FLAGS.replace("--use-distributed-optimizer ", "") + "--use-precision-aware-optimizer"
    )
    with pytest.raises(ValueError, match="without --use-distributed-optimizer"):
        from_megatron_args(path)


def test_delayed_fp8_weights_run_with_fp16_masters_and_fp32_moments() -> None:
    """Transformer Engine's FP8 Adam gets fp32 temporaries of an fp16 master and fp32 moments."""
    plan = make_plan(
        precision="fp8", training={"fp8_param_gather": True}, **AWARE, main_params_dtype="fp16"
    )
    assert optimizer_states.optimizer_bytes_per_param(plan) == 2 + 4 + 4


def test_fp32_training_keeps_an_fp32_buffer(tmp_path: Any) -> None:
    path = tmp_path / "fp32.txt"
    path.write_text(FLAGS.replace("--bf16 ", "") + "--fp8-format hybrid")
    assert "grad_reduce_in_fp32" not in from_megatron_args(path).sections["parallel"]


def test_the_prediction_depth_saves_its_inputs_in_fp8_too() -> None:
    """A multi-token-prediction depth runs its layer under FP8 as well: its activations shrink
    by one layer's FP8-saved inputs."""
    fp8 = _te_plan("current", mtp_num_layers=1)
    bf16 = _te_plan(None, mtp_num_layers=1)
    saved = memory.te_fp8_saved_bytes(fp8)
    assert saved > 0
    assert memory.mtp_activation_bytes(bf16) - memory.mtp_activation_bytes(fp8) == (
        pytest.approx(saved)
    )


def test_the_parameter_gather_and_the_step_fit_follow_the_dtypes() -> None:
    fp8 = make_plan(precision="fp8", training={**CURRENT, "fp8_param_gather": True})
    layers, params = stage_layer_params_per_gpu(fp8, 0), stage_params_per_gpu(fp8, 0)
    assert dp_param_bytes(fp8, 0) == pytest.approx(layers + (params - layers) * 2)
    assert dp_param_bytes(make_plan(), 0) == pytest.approx(params * 2)
    lean = make_plan(**AWARE, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    compute = ComputeModel(GPUS["h100-sxm"])
    optimizer_s = modelled_classes_s(lean, compute, 1)["optimizer"]
    expected = compute.optimizer_step_s(
        stage_params_per_gpu(lean, 0), grad_bytes_per_param=4, adam_bytes_per_param=16
    )
    assert optimizer_s == pytest.approx(expected)
    assert optimizer_s < modelled_classes_s(make_plan(), compute, 1)["optimizer"]
