"""The published-run mapping: field parsing and real cases hand-checked against the papers."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refdata
from fileio.strict import shorten
from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from sim.validation.cases import (
    load_cases,
    map_case,
    parse_architecture,
    parse_attention_backend,
    parse_block_shape,
    parse_cuda_graphs,
    parse_data_parallel,
    parse_float8,
    parse_gpu,
    parse_precision,
    parse_recompute,
    parse_stack,
    parse_vpp,
    source_key,
    source_table,
)

CASES_PATH = refdata.CASES_PATH
needs_cases = pytest.mark.skipif(not CASES_PATH.exists(), reason="refdata is not installed")


def _cases() -> dict[str, dict[str, Any]]:
    return {case["id"]: case for case in load_cases(CASES_PATH)}


# --- field parsing ---


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "full (uniform, every transformer layer: --activations-checkpoint-method uniform)",
            "full",
        ),
        ("activation checkpointing (full)", "full"),
        ("selective (recompute QK^T, softmax, softmax-dropout, attn-over-V only)", "selective"),
        ("none", "none"),
        ("not stated", None),
        ("selective + microbatch-level (store full activations)", None),
        ("selective, per-op (selective_ac_option = 'op')", "op"),
        ("op SAC", "op"),
    ],
)
def test_parse_recompute(text: str, expected: str | None) -> None:
    mode, problem = parse_recompute(text)
    assert mode == expected
    assert (problem is None) == (expected is not None)


def test_parse_recompute_names_the_unsupported_mode() -> None:
    _, problem = parse_recompute("selective + microbatch-level")
    assert problem is not None and "microbatch-level" in problem


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fp16 mixed precision (--fp16, loss-scale 8192)", "fp16"),
        ("FP8 (Transformer Engine, delayed scaling) + BF16", "fp8"),
        ("BF16 (implied by MFU vs 989 TFLOP/s)", "bf16"),
        ("mixed precision (BF16)", "bf16"),
        ("16-bit mixed precision", "fp16"),
        (None, None),
    ],
)
def test_parse_precision(text: str | None, expected: str | None) -> None:
    assert parse_precision(text)[0] == expected


def test_parse_precision_records_the_16_bit_assumption() -> None:
    assert parse_precision("16-bit mixed precision")[1] is not None
    assert parse_precision("fp16")[1] is None


@pytest.mark.parametrize(
    ("parallel", "kind", "knobs"),
    [
        ({"zero_stage": 0, "dp_impl": "torch DDP"}, "ddp", {}),
        ({"zero_stage": 0, "dp_impl": "Megatron local DDP"}, "ddp", {"overlap_grad_reduce": False}),
        ({"zero_stage": 3}, "zero3", {}),
        (
            {"zero_stage": 3, "zero3_fetch": "sync_per_weight"},
            "zero3",
            {"zero_fetch": "sync_per_weight"},
        ),
        ({"zero_stage": "1 (DeepSpeed, per secondary sources)"}, "zero1", {}),
        (
            {"zero_stage": "Megatron-Core distributed optimizer (ZeRO-1-like)"},
            "distributed_optimizer",
            {},
        ),
        ({"fsdp": "FULL_SHARD (ZeRO-3)"}, "fsdp", {}),
        ({"fsdp": "FSDP2 (fully_shard), 8-way"}, "fsdp", {"fsdp_version": 2}),
        (
            {"zero_stage": 0, "dp_grad_allreduce_overlap": False},
            "ddp",
            {"overlap_grad_reduce": False},
        ),
    ],
)
def test_parse_data_parallel(parallel: dict[str, Any], kind: str, knobs: dict[str, Any]) -> None:
    assert parse_data_parallel(parallel) == (kind, knobs, None)


def test_parse_data_parallel_unknown_stage_is_a_problem() -> None:
    kind, _, problem = parse_data_parallel({"zero_stage": "distributed optimizer implied"})
    assert kind == "distributed_optimizer" and problem is None
    kind, _, problem = parse_data_parallel({"zero_stage": "unknown"})
    assert kind is None and problem == "zero_stage (unknown)"


def test_parse_vpp_only_matters_with_a_pipeline() -> None:
    assert parse_vpp({"pp": 1, "virtual_pipeline_stages": "not stated"}) == (1, None)
    assert parse_vpp({"pp": 4, "virtual_pipeline_stages": 3}) == (3, None)
    vpp, problem = parse_vpp({"pp": 12, "virtual_pipeline_stages": "not stated"})
    assert vpp is None and problem == "virtual_pipeline_stages (not stated)"


def test_parse_gpu_and_source_key() -> None:
    assert parse_gpu("A100-SXM4-80GB") == "a100-sxm-80gb"
    assert parse_gpu("A100 80GB SXM") == "a100-sxm-80gb"
    assert parse_gpu("H100 (SXM, 80GB)") == "h100-sxm"
    assert parse_gpu("H100-SXM5-80GB") == "h100-sxm"
    assert parse_gpu("V100") is None
    assert parse_gpu("H100 (HBM2e, 96GB, 500W)") == "h100-96gb-500w"
    assert parse_gpu("H200 SXM 141GB") == "h200"
    assert parse_gpu("B200 (HGX, 180GB)") == "b200"
    assert parse_gpu("GB200 NVL72") == "gb200"  # the superchip's B200, at 1,200 W
    assert source_key("nemo2407_h100_fp8_GPT3-5B_64gpu") == "nemo2407"
    assert source_key("megatron_readme_h100_weak_1.7B") == "megatron_readme"


@pytest.mark.parametrize(
    ("case", "stack"),
    [
        ({"source": "Narayanan et al. 2021", "parallel": {"tp": 8}}, "megatron"),
        ({"source": "torchtitan (arXiv:2410.06511)", "parallel": {"compile": False}}, "eager"),
        ({"source": "torchtitan", "parallel": {"compile": True}}, "compile"),
        ({"source": "x", "parallel": {"fsdp": "FSDP2", "note": "torch.compile"}}, "compile"),
        ({"source": "x", "stack": "eager", "parallel": {"compile": True}}, "eager"),
    ],
)
def test_parse_stack(case: dict[str, Any], stack: str) -> None:
    assert parse_stack(case) == stack


def test_parse_attention_backend() -> None:
    assert parse_attention_backend("SDPA, FlashAttention-2 backend (torch 2.5)") == "flash2"
    assert parse_attention_backend("FA2") == "flash2"
    assert parse_attention_backend("cuDNN fused attention") == "cudnn"
    assert parse_attention_backend(None) == "cudnn"


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("FP8 (torchao Float8Linear, tensorwise dynamic scaling) + BF16; FSDP2 all-gathers in "
         "bf16", {"float8_recipe": "tensorwise"}),
        ("FP8 (torchao Float8Linear, tensorwise dynamic scaling, enable_fsdp_float8_all_gather, "
         "precompute_float8_dynamic_scale_for_fsdp) + BF16",
         {"float8_recipe": "tensorwise", "float8_all_gather": True}),
        ("float8 rowwise", {"float8_recipe": "rowwise"}),
        ("FP8, row-wise scaling", {"float8_recipe": "rowwise"}),
        ("float8 rowwise_with_gw_hp", {"float8_recipe": "rowwise_with_gw_hp"}),
        ("FP8 (Transformer Engine) + BF16", {}),
    ],
)  # fmt: skip
def test_parse_float8(text: str, keys: dict[str, Any]) -> None:
    assert parse_float8(text) == keys


@needs_cases
def test_float8_wording_reaches_torchtitan_plans_only() -> None:
    """torchtitan's float8 runs get a recipe; Transformer Engine's FP8 runs (megatron) none."""
    plans = {m.case_id: m.plan for m in map(map_case, load_cases(CASES_PATH)) if m.plan}
    trainy = plans["torchtitan_trainy_8B_32gpu_h200_compile_float8"]["training"]
    assert (trainy["float8_recipe"], trainy["float8_all_gather"]) == ("tensorwise", True)
    nemo = plans["nemo2407_h100_fp8_LLAMA3-8B_8gpu"]["training"]
    assert nemo["precision"] == "fp8" and "float8_recipe" not in nemo


def test_an_uneven_pipeline_split_reaches_the_plan() -> None:
    """Megatron-Bridge's 70B layout: 40 virtual stages, the last one holding 1 layer."""
    case = next(c for c in load_cases(CASES_PATH) if c["id"].startswith("mbridge_2604"))
    plan = map_case(case).plan
    assert plan is not None and plan["parallel"]["pipeline_layers"] == [2] * 35 + [3, 2, 2, 2, 1]
    resolved = resolve_plan(load_plan(plan), 64)
    assert (resolved.parallel.pp, resolved.parallel.vpp) == (8, 5)
    for junk in ("2,2", [2, "x"], []):
        mangled = copy.deepcopy(case)
        mangled["parallel"]["pipeline_layers"] = junk
        assert f"pipeline_layers ({shorten(junk)})" in map_case(mangled).missing


def test_measured_memory_is_read_in_gib() -> None:
    from sim.validation.measured import measured_memory_gib

    assert measured_memory_gib({"measured": {"memory_gib": 82.4}}) == 82.4
    assert measured_memory_gib({"measured": {"max_reserved_gib": 70.1}}) == 70.1
    assert measured_memory_gib({"measured": {"memory_gib": "70.1"}}) is None  # text: not a figure
    assert measured_memory_gib({"measured": {"peak_memory_gb": 80}}) == pytest.approx(80e9 / 2**30)
    assert measured_memory_gib({"measured": {"memory_gib": "not stated"}}) is None
    assert measured_memory_gib({}) is None


def test_parse_architecture_families() -> None:
    gpt = parse_architecture({"arch": "GPT (GeLU 4h MLP), tied embeddings", "name": "GPT 22B"})
    assert gpt["mlp_activation"] == "gelu" and gpt["tied_embeddings"] is True
    llama = parse_architecture({"arch": "Llama (SwiGLU, RoPE, RMSNorm)", "name": "LLAMA2-7B"})
    assert llama["mlp_activation"] == "swiglu" and llama["norm"] == "rmsnorm"
    nemotron = parse_architecture({"arch": "Nemotron (squared-ReLU MLP, untied emb)"})
    assert nemotron["mlp_activation"] == "relu" and nemotron["tied_embeddings"] is False
    untied = parse_architecture({"arch": "GPT (GeLU 4h MLP, MHA); untied embeddings implied"})
    assert untied["mlp_activation"] == "gelu" and untied["tied_embeddings"] is False


@pytest.mark.parametrize(
    ("model", "keys", "assumed"),
    [
        ({"arch": "GPT (GeLU 4h MLP)"}, {}, False),
        ({"arch": "GPT-3 with parallel transformer block (PTB)"}, {"parallel_block": True}, False),
        ({"arch": "GPT, parallel block", "parallel_block": False}, {}, False),  # the key wins
        ({"use_parallel_residual": True}, {"parallel_block": True}, False),
        ({"parallel_attn": "yes"}, {"parallel_block": True}, False),
        ({"arch": "PTB", "parallel_residual": 0}, {}, False),
        ({"sliding_window": 4096}, {"attention_window": 4096}, False),
        ({"window_size": [2048, 0]}, {"attention_window": 2048}, False),
        ({"arch": "GPT with sliding window attention"}, {}, True),
        ({"arch": "GPT (SWA)", "attention_window": 1024}, {"attention_window": 1024}, False),
    ],
)
def test_parse_block_shape(model: dict[str, Any], keys: dict[str, Any], assumed: bool) -> None:
    found, assumptions = parse_block_shape(model)
    assert found == keys and bool(assumptions) is assumed


@pytest.mark.parametrize(
    ("case", "graphed"),
    [
        ({"notes": "CUDA graphs enabled for the layers"}, True),
        ({"parallel": {"precision": "FP8 with cuda-graph capture"}}, True),
        ({"notes": "run without CUDA graphs"}, False),
        ({"notes": "CUDA graphs off"}, False),
        ({"parallel": {"cuda_graphs": "true"}}, True),
        ({"cuda_graphs": False, "notes": "CUDA graphs"}, False),  # the key wins
        ({}, False),
    ],
)
def test_parse_cuda_graphs(case: dict[str, Any], graphed: bool) -> None:
    assert parse_cuda_graphs(case) is graphed


@needs_cases
def test_a_parallel_block_and_window_reach_the_plan() -> None:
    case = copy.deepcopy(_cases()["narayanan21_t1_76.1B"])
    case["model"]["arch"] += ", parallel transformer block, sliding window attention"
    mapping = map_case(case)
    assert mapping.plan is not None and mapping.plan["model"]["parallel_block"] is True
    assert "attention_window" not in mapping.plan["model"]
    assert any("sliding-window attention named" in a for a in mapping.assumptions)
    case["model"]["sliding_window"] = 1024
    assert map_case(case).plan["model"]["attention_window"] == 1024  # type: ignore[index]


def test_source_table_is_shortened() -> None:
    assert source_table({"source": {"table": "Table 2 (also Figure 10)"}}) == "Table 2"
    assert (
        source_table({"source": {"table": "Section 6.3 text + Abstract (530B)"}}) == "Section 6.3"
    )
    assert source_table({"source": {"table": "Appendix C text"}}) == "Appendix C"
    assert source_table({"source": {"repo": "NVIDIA/NeMo"}}) == ""


def test_a_case_with_empty_sections_lists_what_is_missing() -> None:
    mapping = map_case({"id": "bare", "model": None, "parallel": None, "hardware": None})
    assert not mapping.simulable and mapping.plan is None
    assert "num_gpus (None)" in mapping.missing and "model.num_layers (None)" in mapping.missing


def test_load_cases_rejects_a_non_list(tmp_path: Path) -> None:
    path = tmp_path / "cases.json"
    path.write_text('{"cases": []}')
    with pytest.raises(ValueError, match="expected a JSON list"):
        load_cases(path)


# --- real cases (hand-checked against the papers' tables) ---


@needs_cases
def test_narayanan_76b_maps_to_interleaved_tp8_pp4() -> None:
    mapping = map_case(_cases()["narayanan21_t1_76.1B"])
    assert mapping.simulable and mapping.plan is not None
    assert mapping.plan["cluster"] == {"node": "dgx-a100", "num_nodes": 128, "fabric": "ib-hdr"}
    parallel = mapping.plan["parallel"]
    assert (parallel["tp"], parallel["pp"], parallel["dp"], parallel["vpp"]) == (8, 4, 32, 3)
    assert parallel["schedule"] == "interleaved"
    assert parallel["recompute"] == "full"
    assert parallel["data_parallel"] == "ddp" and parallel["overlap_grad_reduce"] is False
    training = mapping.plan["training"]
    assert (training["micro_batch_size"], training["global_batch_size"]) == (2, 1792)
    assert training["precision"] == "fp16"
    model = mapping.plan["model"]
    assert (model["num_layers"], model["hidden_size"], model["vocab_size"]) == (60, 10240, 51200)
    assert model["mlp_activation"] == "gelu" and model["tied_embeddings"] is True
    assert (model["position_embedding"], model["norm"], model["linear_bias"]) == (
        "learned",
        "layernorm",
        True,
    )
    # Megatron in 2021 had no FlashAttention: the s x s attention scores were materialised.
    assert mapping.plan["training"]["flash_attention"] is False


@needs_cases
def test_nemo_llama3_8b_maps_cp_fp8_and_distributed_optimizer() -> None:
    mapping = map_case(_cases()["nemo2407_h100_fp8_LLAMA3-8B_8gpu"])
    assert mapping.simulable and mapping.plan is not None
    assert mapping.plan["cluster"]["node"] == "dgx-h100"
    assert mapping.plan["cluster"]["num_nodes"] == 1
    parallel = mapping.plan["parallel"]
    assert (parallel["tp"], parallel["pp"], parallel["cp"], parallel["dp"]) == (1, 1, 2, 4)
    assert parallel["data_parallel"] == "distributed_optimizer"
    assert parallel["tp_comm_overlap"] is False
    assert mapping.plan["training"]["precision"] == "fp8"
    model = mapping.plan["model"]
    assert model["mlp_activation"] == "swiglu" and model["tied_embeddings"] is False
    assert (model["num_kv_heads"], model["position_embedding"], model["norm"]) == (
        8,
        "rope",
        "rmsnorm",
    )
    assert mapping.plan["training"]["flash_attention"] is True
    assert mapping.plan["training"]["stack"] == "megatron"
    assert mapping.plan["training"]["cross_entropy_fusion"] == "native"  # its launcher yaml
    # 128 sequences x 8192 tokens / (12273 tokens/s/GPU x 8 GPUs)
    assert mapping.measured is not None
    assert mapping.measured.step_time_s == pytest.approx(128 * 8192 / (12273 * 8))


@needs_cases
@pytest.mark.parametrize(
    ("parallel", "stack", "training", "missing"),
    [
        ({"cross_entropy_fusion": "te_inplace"}, None, {"cross_entropy_fusion": "te_inplace"}, ()),
        ({}, None, {}, ()),  # Megatron-LM's default, the unfused loss
        ({"cross_entropy_fusion": "fused"}, None, {}, ("cross_entropy_fusion ('fused')",)),
        ({"cross_entropy_fusion": "native"}, "eager", {}, ()),  # a Megatron knob only
    ],
)
def test_the_cross_entropy_a_case_names_reaches_megatron_plans(
    parallel: dict[str, Any], stack: str | None, training: dict[str, Any], missing: tuple
) -> None:
    case = copy.deepcopy(_cases()["narayanan21_t1_1.7B"])
    case["parallel"].update(parallel)
    if stack:
        case["stack"] = stack
    mapping = map_case(case)
    assert mapping.missing == missing
    if mapping.plan is not None:
        plan = mapping.plan["training"]
        assert {k: plan[k] for k in plan if k == "cross_entropy_fusion"} == training


@needs_cases
def test_korthikanti_selective_keeps_sequence_parallel_and_reported_time() -> None:
    mapping = map_case(_cases()["korthikanti22_t5_22B_selective_plus_sp"])
    assert mapping.simulable and mapping.plan is not None
    assert mapping.plan["parallel"]["sequence_parallel"] is True
    assert mapping.plan["parallel"]["recompute"] == "selective"
    assert mapping.measured is not None and mapping.measured.step_time_s == 1.1
    assert any("16-bit" in note for note in mapping.assumptions)


@needs_cases
@pytest.mark.parametrize(
    ("case_id", "knob"),
    [
        ("narayanan21_t2_ptdp_174B_384gpu", "virtual_pipeline_stages"),
        ("korthikanti22_appC_175B_microbatch_level_recompute", "microbatch-level"),
        ("korthikanti22_t4_22B_layer_selective_recompute", "whole training step"),
        ("megatron_readme_h100_weak_1.7B", "micro_batch_size"),
        ("bloom176B_384xA100", "Omni-Path"),
        ("mtnlg530B_2240gpu", "micro_batch_size"),
        ("fsdp_vldb23_gpt175B_bs1", "num_gpus"),
        ("opt175B_992xA100", "micro_batch_size"),
    ],
)
def test_unfaithful_cases_name_the_missing_knob(case_id: str, knob: str) -> None:
    mapping = map_case(_cases()[case_id])
    assert not mapping.simulable and mapping.plan is None
    assert any(knob in item for item in mapping.missing), mapping.missing


@needs_cases
def test_deepseek_v3_maps_with_every_mechanism_it_runs() -> None:
    """The DeepSeek-V3 row carries its latent attention, its multi-token-prediction depth, its
    layout with an empty last virtual stage, its recompute modules, its DeepEP dispatcher with
    the group-limited routing it sends by, and its all-to-all overlap with delayed weight
    gradients."""
    mapping = map_case(_cases()["mbridge_2509_h100_fp8_DEEPSEEKV3_1024gpu"])
    assert mapping.missing == () and mapping.plan is not None
    plan = resolve_plan(load_plan(mapping.plan), 1024)
    assert (plan.model.kv_lora_rank, plan.parallel.pipeline_layers[-1]) == (512, 0)
    assert plan.model.mtp_num_layers == 1 and plan.parallel.overlap_moe_expert_parallel_comm
    assert plan.parallel.delay_wgrad_compute and plan.parallel.moe_token_dispatcher == "flex"
    assert (plan.model.moe_router_num_groups, plan.model.moe_router_group_topk) == (8, 4)
    assert plan.parallel.recompute_modules == ("mla_up_proj", "mlp")


@needs_cases
def test_every_simulable_case_is_a_valid_plan_for_its_world_size() -> None:
    for case in load_cases(CASES_PATH):
        mapping = map_case(case)
        if mapping.simulable:
            assert mapping.num_gpus is not None and mapping.plan is not None
            plan = resolve_plan(load_plan(mapping.plan), mapping.num_gpus)
            assert plan.parallel.dp * plan.parallel.model_parallel_size == mapping.num_gpus


@needs_cases
def test_simulable_case_count_per_source() -> None:
    counts: dict[str, int] = {}
    for case in load_cases(CASES_PATH):
        mapping = map_case(case)
        if mapping.simulable:
            counts[mapping.source] = counts.get(mapping.source, 0) + 1
    # Table 1 (10) + Table 2 ZeRO-3 (6); Table 5 (8) + 530B on 2240 GPUs (2); NeMo (12);
    # Mixtral 8x7B, 8x22B and Qwen3-235B-A22B (3); torchtitan 2024-12 Tables 1-6 (18: Tables
    # 1-4's 9, Table 2's three CP rows, Table 5's two PP schedules, Table 6's four rows at
    # 405B), asynchronous TP (8), H200 (2);
    # Megatron-Bridge Llama 3 70B, 3.1 405B and DeepSeek-V3 (3)
    assert counts == {
        "narayanan21": 16,
        "korthikanti22": 10,
        "nemo2407": 12,
        "mcoremoe": 3,
        "torchtitan": 28,
        "mbridge": 3,
    }


_JUNK = st.one_of(
    st.none(),
    st.just("not stated"),
    st.text(max_size=12),
    st.integers(min_value=-3, max_value=5000),
    st.floats(allow_nan=True),
    st.booleans(),
)


@needs_cases
@settings(max_examples=60, deadline=None)
@given(
    index=st.integers(min_value=0, max_value=90),
    section=st.sampled_from(["model", "parallel", "hardware", "measured"]),
    data=st.data(),
)
def test_mangled_fields_never_crash_the_mapping(index: int, section: str, data) -> None:
    cases = load_cases(CASES_PATH)
    case = copy.deepcopy(cases[index % len(cases)])
    fields = case.setdefault(section, {}) or {}
    case[section] = fields
    key = data.draw(st.sampled_from(sorted(fields) or ["absent"]))
    fields[key] = data.draw(_JUNK)
    mapping = map_case(case)  # never raises, whatever the field holds
    if mapping.simulable:
        assert mapping.num_gpus is not None and mapping.plan is not None
        try:
            resolve_plan(load_plan(mapping.plan), mapping.num_gpus)
        except ValueError as exc:  # e.g. a mangled hidden size; a clear one-line message
            assert str(exc) and "\n" not in str(exc)
    else:
        assert mapping.plan is None and mapping.missing


def test_malformed_cases_file_names_the_file(tmp_path: Path) -> None:
    from sim.validation.cases import load_cases

    path = tmp_path / "cases.json"
    path.write_text("[{")
    with pytest.raises(ValueError, match=r"malformed input: .*cases\.json: "):
        load_cases(path)


@needs_cases
@pytest.mark.parametrize(
    ("case_id", "vpp", "cp", "microbatches"),
    [
        ("torchtitan_t5_405B_512gpu_3d_1f1b_compile_float8", 1, 1, 8),
        ("torchtitan_t5_405B_512gpu_3d_interleaved_compile_float8", 2, 1, 8),
        ("torchtitan_t6_405B_512gpu_4d_seq256k_cp8_compile_float8", 1, 8, 8),
        ("torchtitan_t2_8B_8gpu_seq128k_cp4_compile_float8", 1, 4, 1),
    ],
)
def test_torchtitan_pipeline_and_cp_rows_carry_the_release_defaults(
    case_id: str, vpp: int, cp: int, microbatches: int
) -> None:
    # torchtitan 9dec370: as many micro-batches as the PP degree, generate_split_points' layers
    # (126 // stages, the remainder on the middle stages), the 'allgather' K/V rotation
    from schedules.plan import num_microbatches

    mapping = map_case(_cases()[case_id])
    assert mapping.plan is not None and mapping.num_gpus is not None
    plan = resolve_plan(load_plan(mapping.plan), mapping.num_gpus)
    assert (plan.parallel.vpp, plan.parallel.cp) == (vpp, cp)
    assert num_microbatches(plan) == microbatches
    assert plan.parallel.dp * cp == 8
    if plan.parallel.pp > 1:
        layers = plan.parallel.pipeline_layers
        assert layers is not None and sum(layers) == 126 and len(layers) == 8 * vpp
        assert layers[0] == layers[-1] == 126 // (8 * vpp)
        assert plan.training.float8_all_gather
    if cp > 1:
        assert plan.parallel.cp_rotate_method == "allgather"


@needs_cases
def test_an_unknown_cp_rotate_method_is_a_missing_knob_not_a_default() -> None:
    case = copy.deepcopy(_cases()["torchtitan_t2_8B_8gpu_seq128k_cp4_compile_float8"])
    case["parallel"]["cp_rotate_method"] = "ring"
    mapping = map_case(case)
    assert mapping.plan is None
    assert "cp_rotate_method (ring; allgather or alltoall)" in mapping.missing
