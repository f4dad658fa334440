"""Two layer shapes beside the sequential block: the parallel block (attention and MLP side by
side on one norm, one TP reduction) and sliding-window attention, checked term by term against
hand counts."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from schedules.actions import CommStep
from schedules.activations import layer_activation_bytes
from schedules.flops import attention_core_flops, window_pairs_fraction
from schedules.kernels import (
    ELEMENTWISE_BYTES,
    attention,
    elementwise_forward_bytes,
    layer_kernels,
    residual_stream_elements,
)
from schedules.messages import tp_collectives_per_layer
from schedules.params import layer_params, layer_params_per_gpu, norm_params
from schedules.plan import ModelConfig, load_plan
from schedules.resolve import resolve_plan
from schedules.zero3_spec import layer_submodules
from sim.compute.compute_model import ComputeModel
from sim.replay.recipes import layer_recipes, step_costs
from tests.model_configs import gpt
from topologies.hardware import GPUS


def _plan(model: dict[str, Any] | None = None, *, tp: int = 2, **parallel: Any) -> Any:
    raw = {
        "model": {"name": "m", "num_layers": 4, "hidden_size": 1024, "num_heads": 16,
                  "num_kv_heads": 8, "ffn_hidden_size": 4096, "vocab_size": 32000,
                  "seq_len": 4096, **(model or {})},
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {"tp": tp, "sequence_parallel": tp > 1, **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": 8 // tp, "stack": "megatron"},
    }  # fmt: skip
    return resolve_plan(load_plan(raw), 8 // tp * tp)


# --- sliding-window attention ---


@pytest.mark.parametrize("window", [0, 1, 7, 16, 63, 64, 100])
def test_window_fraction_counts_the_products_inside_the_window(window: int) -> None:
    """s^2 x fraction = the query-key pairs a causal window keeps, sum_i min(i, W), less half
    of the diagonal's (the convention of the unwindowed count: s^2/2 for its s(s+1)/2 pairs)."""
    s = 64
    seen = min(window, s) if window else s
    pairs = sum(min(i, seen) for i in range(1, s + 1))
    assert window_pairs_fraction(s, window) * s * s == pytest.approx(pairs - seen / 2)


def test_windowed_attention_kernel_skips_the_blocks_outside_it() -> None:
    s, w, d = 8192, 2048, 128
    full = attention(batch=2, num_heads=8, seq_q=s, seq_kv=s, head_dim=d)
    windowed = attention(batch=2, num_heads=8, seq_q=s, seq_kv=s, head_dim=d, window=w)
    # 4 b a s^2 d x (W/s - W^2/(2 s^2)) = 4 b a d (s W - W^2/2)
    assert windowed.flops == pytest.approx(4 * 2 * 8 * d * (s * w - w * w / 2))
    assert full.flops == pytest.approx(4 * 2 * 8 * d * s * s / 2)
    assert windowed.dims == (s, w) and windowed.bytes == full.bytes  # Q, K, V, O read once
    back = attention(batch=2, num_heads=8, seq_q=s, seq_kv=s, head_dim=d, window=w, backward=True)
    assert back.flops == pytest.approx(2.5 * windowed.flops)
    wide = attention(batch=2, num_heads=8, seq_q=s, seq_kv=s, head_dim=d, window=2 * s)
    assert wide.flops == full.flops and wide.dims == full.dims


def test_window_in_the_model_flops() -> None:
    """Causal: 4bs^2h x the window's fraction; counted whole (Narayanan's convention): s x W."""
    model = dataclasses.replace(gpt(2, 1024, 16, seq_len=4096), attention_window=1024)
    b, s, h, w = 2, 4096, 1024, 1024
    assert attention_core_flops(model, b, causal=True) == pytest.approx(
        4 * b * h * (s * w - w * w / 2)
    )
    assert attention_core_flops(model, b, causal=False) == pytest.approx(4 * b * s * w * h)


def test_window_shortens_a_step_and_keeps_its_memory() -> None:
    full, windowed = _plan(), _plan({"attention_window": 1024})
    compute = ComputeModel(GPUS["h100-sxm"])
    assert compute.layer_times(windowed).forward_s < compute.layer_times(full).forward_s
    flash = {"tp": 2, "sequence_parallel": True, "recompute": "none", "flash_attention": True}
    assert layer_activation_bytes(windowed.model, 1, **flash) == layer_activation_bytes(
        full.model, 1, **flash
    )


def test_window_refuses_context_parallelism() -> None:
    with pytest.raises(ValueError, match=r"model.attention_window=1024 with parallel.cp=2"):
        _plan({"attention_window": 1024}, tp=1, cp=2)
    _plan({"attention_window": 4096}, tp=1, cp=2)  # as wide as the sequence: no window


# --- the parallel block ---


def test_parallel_block_has_one_norm() -> None:
    model = gpt(2, 1024, 16)
    block = dataclasses.replace(model, parallel_block=True)
    assert layer_params(model) - layer_params(block) == norm_params(model) == 2 * 1024
    modules = layer_submodules(
        hidden=1024, ffn=4096, kv_size=1024, gated=False, bias=True, norm_params=2048, tp=2,
        parallel_block=True,
    )  # fmt: skip
    assert [name for name, _ in modules].count("post_attn_norm") == 0
    assert sum(sum(t) for _, t in modules) == pytest.approx(layer_params_per_gpu(block, 2))


def test_parallel_block_halves_the_tp_collectives() -> None:
    assert tp_collectives_per_layer(True, parallel_block=True) == {
        "forward": {"all_gather": 1, "reduce_scatter": 1},
        "backward": {"all_gather": 2, "reduce_scatter": 1},
    }
    assert tp_collectives_per_layer(False, parallel_block=True) == {
        "forward": {"all_reduce": 1},
        "backward": {"all_reduce": 1},
    }

    def counts(plan: Any) -> dict[str, int]:
        recipes = layer_recipes(plan, step_costs(plan, ComputeModel(GPUS["h100-sxm"])), 4)
        out: dict[str, int] = {}
        for phase in ("F", "B"):
            for step in recipes[phase]:
                if isinstance(step, CommStep) and step.group == "tp":
                    key = f"{phase} {step.op}"
                    out[key] = out.get(key, 0) + step.repeat
        return out

    # Megatron's placement, 4 layers: forward 2 AG + 2 RS, backward 4 AG + 2 RS per layer
    assert counts(_plan()) == {"F all_gather": 8, "F reduce_scatter": 8, "B all_gather": 16,
                               "B reduce_scatter": 8}  # fmt: skip
    assert counts(_plan({"parallel_block": True})) == {
        "F all_gather": 4, "F reduce_scatter": 4, "B all_gather": 8, "B reduce_scatter": 4
    }  # fmt: skip


def test_parallel_block_memory_and_elementwise_work() -> None:
    """One norm input and one input shared by QKV and the MLP: 2 x 2h bytes per token fewer
    outside the TP region; one norm's bytes fewer among the layer's elementwise kernels."""
    plain, block = _plan(), _plan({"parallel_block": True})
    tokens, h, t = 4096, 1024, 2
    for recompute in ("none", "selective"):
        kw = {"tp": t, "sequence_parallel": True, "recompute": recompute, "flash_attention": True}
        saved = layer_activation_bytes(plain.model, 1, **kw) - layer_activation_bytes(
            block.model, 1, **kw
        )
        assert saved == pytest.approx(2 * 2 * h * tokens / t)
    norm = ELEMENTWISE_BYTES["megatron"]["rmsnorm"] * residual_stream_elements(plain)
    assert elementwise_forward_bytes(plain) - elementwise_forward_bytes(block) == norm
    assert [k.name for k in layer_kernels(block).forward] == [
        k.name for k in layer_kernels(plain).forward
    ]


def test_parallel_block_is_faster_under_tensor_parallelism() -> None:
    from sim.replay.simulate import simulate_plan

    # 16 layers, so that the layers' collectives outweigh the embedding's and the head's
    plain = simulate_plan(_plan({"num_layers": 16}, tp=8))
    block = simulate_plan(_plan({"parallel_block": True, "num_layers": 16}, tp=8))
    assert block.step_time_s < plain.step_time_s
    # one gather and one reduce-scatter per layer and pass instead of two of each, the same size
    exposed = plain.breakdown.exposed_comm_s.get("tp", 0.0)
    assert block.breakdown.exposed_comm_s.get("tp", 0.0) / exposed == pytest.approx(0.5, abs=0.05)


def test_parallel_block_refuses_experts() -> None:
    with pytest.raises(ValueError, match="parallel_block with num_experts=8"):
        ModelConfig(
            name="m", num_layers=2, hidden_size=256, num_heads=4, ffn_hidden_size=512,
            vocab_size=1000, seq_len=128, num_experts=8, parallel_block=True,
        )  # fmt: skip


def test_the_report_names_the_block_shape(tmp_path: Any, capsys: Any) -> None:
    import yaml

    from sim.cli.main import main

    raw = {
        "model": {"name": "m", "num_layers": 2, "hidden_size": 256, "num_heads": 4,
                  "ffn_hidden_size": 1024, "seq_len": 512, "vocab_size": 1024,
                  "parallel_block": True, "attention_window": 128},
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "training": {"global_batch_size": 8, "micro_batch_size": 1},
    }  # fmt: skip
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["plan", str(path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (
        "Plan: m (2 layers, hidden 256, seq 512, parallel block, attention window 128) "
        "on 8 x h100-sxm"
    )


def test_a_parallel_block_rebuilds_no_second_norm_input() -> None:
    """DTensor TP without SP under per-op recompute reruns the attention output's all-reduce to
    rebuild the MLP norm's input; a parallel block has no such norm."""
    from schedules.tp_steps import LinearShares, tp_backward_steps

    def names(parallel_block: bool) -> list[str]:
        steps = tp_backward_steps(
            backward_input_s=1.0, backward_weight_s=1.0, recompute_s=0.5, num_layers=2,
            tp_bytes=8.0, shares=LinearShares(), tp=4, dtensor=True, regather=True,
            per_layer=1 if parallel_block else 2, parallel_block=parallel_block,
        )  # fmt: skip
        return [s.name for s in steps if isinstance(s, CommStep)]

    assert names(False) == ["AR residual", "all_reduce dgrad"]
    assert names(True) == ["all_reduce dgrad"]
