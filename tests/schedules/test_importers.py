"""Importers: real configs give the exact plan sections and warnings, and load as plans.

Fixtures under ``fixtures/``: ``Meta-Llama-3-8B/config.json`` as released on the Hugging Face Hub
(meta-llama/Meta-Llama-3-8B); ``ds_config_zero3.json``, the ZeRO-3 example of the transformers
DeepSpeed guide (offload and "auto" values); ``train_llama3_70b.sh``, a Megatron-LM launch script
for Llama 3 70B written after Megatron-LM's examples/llama script; ``llama3_8b.toml``,
torchtitan's torchtitan/models/llama3/train_configs/llama3_8b.toml at 9810191bb^ (the last
TOML-configured version, v0.2.2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schedules.importers import (
    Imported,
    from_deepspeed_config,
    from_megatron_args,
    from_torchtitan_toml,
    merge_sections,
    model_from_hf_config,
)
from schedules.model_presets import resolve_model_preset
from schedules.plan import load_plan
from schedules.resolve import resolve_plan

FIXTURES = Path(__file__).parent / "fixtures"
SHAPE_KEYS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size")


def _write(tmp_path: Path, name: str, content: Any) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _ignored(file: str, *keys: str) -> list[str]:
    return [f"{file}: {key} is not modelled (ignored)" for key in keys]


def _resolved(raw: dict[str, Any], world_size: int) -> Any:
    return resolve_plan(load_plan(raw), world_size)


# --- Hugging Face ----------------------------------------------------------------------------

LLAMA3_8B_MODEL = {
    "name": "Meta-Llama-3-8B",  # the folder of config.json, as downloaded from the Hub
    "num_layers": 32,
    "hidden_size": 4096,
    "num_heads": 32,
    "num_kv_heads": 8,
    "ffn_hidden_size": 14336,
    "vocab_size": 128256,
    "seq_len": 8192,
    "mlp_activation": "swiglu",
    "norm": "rmsnorm",
    "position_embedding": "rope",
    "tied_embeddings": False,
    "linear_bias": False,
    "dropout": False,
}


def test_llama3_8b_config_json() -> None:
    imported = model_from_hf_config(FIXTURES / "Meta-Llama-3-8B" / "config.json")
    assert imported.sections == {"model": LLAMA3_8B_MODEL}
    file = "config.json"
    assert imported.warnings == (
        f"{file}: model.seq_len=8192 is max_position_embeddings, the longest context the model "
        "supports; training usually runs shorter sequences: override model.seq_len",
    )
    assert imported.ignored == (
        "bos_token_id", "eos_token_id", "initializer_range", "pretraining_tp", "rms_norm_eps",
        "rope_scaling", "rope_theta", "torch_dtype", "transformers_version", "use_cache",
    )  # fmt: skip
    preset = resolve_model_preset("llama3-8b")
    assert all(imported.sections["model"][k] == preset[k] for k in (*SHAPE_KEYS, "vocab_size"))


def test_llama_config_loads_as_a_plan() -> None:
    model = model_from_hf_config(FIXTURES / "Meta-Llama-3-8B" / "config.json")
    base = {
        "cluster": {"node": "dgx-h100"},
        "training": {"micro_batch_size": 1, "global_batch_size": 64},
    }
    raw, warnings = merge_sections(base, model)
    plan = _resolved(raw, 8)
    assert (plan.model.num_kv_heads, plan.model.activation, plan.parallel.dp) == (8, "swiglu", 8)
    assert warnings == model.warnings


QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 131072,
    "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 152064,
}  # fmt: skip
"""Qwen/Qwen2.5-7B's config.json."""


def test_qwen2_notes_its_qkv_biases_and_matches_the_preset(tmp_path: Path) -> None:
    imported = model_from_hf_config(_write(tmp_path, "config.json", QWEN25_7B))
    model = imported.sections["model"]
    preset = resolve_model_preset("qwen2.5-7b")
    assert all(model[k] == preset[k] for k in (*SHAPE_KEYS, "vocab_size"))
    assert (model["seq_len"], model["linear_bias"]) == (131072, False)
    assert imported.warnings[1] == (
        "config.json: Qwen2 has biases on q, k and v only; linear_bias is all-or-none: left off "
        "(a negligible share of the parameters)"
    )
    # use_sliding_window is false: the window keys are reported, not priced
    assert "config.json: sliding_window is not modelled (ignored)" in imported.warnings


def test_mistral_defaults_and_sliding_window(tmp_path: Path) -> None:
    config = {
        "architectures": ["MistralForCausalLM"], "hidden_size": 4096,
        "intermediate_size": 14336, "max_position_embeddings": 32768,
        "num_attention_heads": 32, "num_hidden_layers": 32, "sliding_window": 4096,
        "vocab_size": 32000, "_name_or_path": "mistralai/Mistral-7B-v0.1",
    }  # fmt: skip
    imported = model_from_hf_config(_write(tmp_path, "config.json", config))
    model = imported.sections["model"]
    assert (model["name"], model["num_kv_heads"], model["tied_embeddings"]) == (
        "mistralai/Mistral-7B-v0.1",
        8,
        False,
    )
    assert model["attention_window"] == 4096  # carried over: no warning
    assert imported.warnings == (
        "config.json: num_key_value_heads absent: the config class's 8",
        "config.json: model.seq_len=32768 is max_position_embeddings, the longest context the "
        "model supports; training usually runs shorter sequences: override model.seq_len",
    )
    # null turns the window off; Qwen2 uses its window only when asked, on some layers
    unwindowed = model_from_hf_config(
        _write(tmp_path, "config.json", {**config, "sliding_window": None})
    )
    assert "attention_window" not in unwindowed.sections["model"]
    qwen = model_from_hf_config(
        _write(tmp_path, "config.json", {**QWEN25_7B, "use_sliding_window": True})
    )
    assert "attention_window" not in qwen.sections["model"]  # max_window_layers = 28 = layers
    assert any("leaves no layer sliding" in w for w in qwen.warnings)
    qwen = model_from_hf_config(
        _write(
            tmp_path,
            "config.json",
            {**QWEN25_7B, "use_sliding_window": True, "max_window_layers": 14},
        )
    )
    assert qwen.sections["model"]["attention_window"] == 131072
    assert any(w.startswith("config.json: Qwen slides its window") for w in qwen.warnings)


def test_gpt2_config_json(tmp_path: Path) -> None:
    config = {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
        "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
        "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": 50257,
    }  # fmt: skip
    imported = model_from_hf_config(_write(tmp_path, "config.json", config))
    assert imported.sections["model"] == {
        "name": tmp_path.name, "num_layers": 12, "hidden_size": 768, "num_heads": 12,
        "num_kv_heads": 12, "ffn_hidden_size": 3072, "vocab_size": 50257, "seq_len": 1024,
        "mlp_activation": "gelu", "norm": "layernorm", "position_embedding": "learned",
        "tied_embeddings": True, "linear_bias": True, "dropout": True,
    }  # fmt: skip
    assert imported.warnings[1:] == ()
    assert imported.ignored == (
        "bos_token_id", "eos_token_id", "initializer_range", "layer_norm_epsilon",
        "summary_activation", "summary_first_dropout", "summary_proj_to_labels", "summary_type",
        "summary_use_proj", "task_specific_params",
    )  # fmt: skip


def test_gpt_neox_parallel_residual_is_a_parallel_block(tmp_path: Path) -> None:
    config = {
        "architectures": ["GPTNeoXForCausalLM"], "hidden_act": "gelu_fast", "hidden_size": 6144,
        "intermediate_size": 24576, "max_position_embeddings": 2048, "model_type": "gpt_neox",
        "num_attention_heads": 64, "num_hidden_layers": 44, "rotary_pct": 0.25,
        "tie_word_embeddings": False, "use_parallel_residual": True, "vocab_size": 50432,
    }  # fmt: skip
    imported = model_from_hf_config(_write(tmp_path, "config.json", config))
    model = imported.sections["model"]
    assert (model["mlp_activation"], model["norm"], model["position_embedding"]) == (
        "gelu",
        "layernorm",
        "rope",
    )
    assert (model["ffn_hidden_size"], model["linear_bias"], model["dropout"]) == (
        24576,
        True,
        False,
    )
    assert model["parallel_block"] is True
    assert imported.warnings[0].startswith(
        "config.json: use_parallel_residual (the GPTNeoXConfig default): model.parallel_block"
    )
    assert imported.ignored == ("rotary_pct",)  # partial rotary: the same kernels
    sequential = model_from_hf_config(
        _write(tmp_path, "config.json", {**config, "use_parallel_residual": False})
    )
    assert "parallel_block" not in sequential.sections["model"]
    assert not any("parallel" in w for w in sequential.warnings)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"architectures": ["BertModel"]}, "config.json: architectures ['BertModel'] is not "
         "supported; supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
         "Qwen3ForCausalLM, Qwen3MoeForCausalLM, GPT2LMHeadModel, GPTNeoXForCausalLM"),
        ({"model_type": "t5"}, "config.json: model_type 't5' is not supported"),
        ({**QWEN25_7B, "hidden_size": "3584"},
         "config.json: hidden_size must be an integer, got '3584'"),
        ({k: v for k, v in QWEN25_7B.items() if k != "intermediate_size"},
         "config.json: missing key intermediate_size"),
        ({**QWEN25_7B, "tie_word_embeddings": "false"},
         "config.json: tie_word_embeddings must be true or false, got 'false'"),
        ([1, 2], "config.json: the file must be a mapping, got [1, 2]"),
        ("{", "config.json: Expecting property name enclosed in double quotes"),
        ('{"vocab_size": 1, "vocab_size": 2}',
         "config.json: key 'vocab_size' given twice in one JSON object"),
    ],
)  # fmt: skip
def test_bad_hf_configs_name_the_file_and_key(tmp_path: Path, config: Any, message: str) -> None:
    path = _write(tmp_path, "config.json", config)
    with pytest.raises(ValueError) as error:
        model_from_hf_config(path)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


# --- DeepSpeed -------------------------------------------------------------------------------


def test_zero3_ds_config_with_autos() -> None:
    imported = from_deepspeed_config(FIXTURES / "ds_config_zero3.json")
    assert imported.sections == {
        "parallel": {
            "data_parallel": "zero3",
            "zero_overlap_comm": True,
            "zero_max_live_parameters": 1_000_000_000,
            "offload_optimizer": "cpu",
            "offload_param": "cpu",
            "offload_pin_memory": True,
        }
    }
    file = "ds_config_zero3.json"
    hf = "the Hugging Face Trainer sets"
    assert imported.warnings == (
        f"{file}: zero_optimization.reduce_bucket_size is 'auto' ({hf} hidden_size^2): left out, "
        "set parallel.zero_bucket_elems",
        f"{file}: zero_optimization.stage3_prefetch_bucket_size is 'auto' ({hf} 0.9 "
        "hidden_size^2): left out, set parallel.zero_prefetch_bucket_elems",
        f"{file}: zero_optimization.stage3_param_persistence_threshold is 'auto' ({hf} 10 "
        "hidden_size): left out, set parallel.zero_param_persistence_threshold",
        *_ignored(file, "zero_optimization.stage3_max_reuse_distance"),
        f"{file}: train_batch_size is 'auto' ({hf} it from its arguments): left out, set "
        "training.global_batch_size",
        f"{file}: train_micro_batch_size_per_gpu is 'auto' ({hf} it from its arguments): left "
        "out, set training.micro_batch_size",
        f"{file}: gradient_accumulation_steps is 'auto' ({hf} it from its arguments): left out, "
        "set training.global_batch_size",
        f"{file}: bf16.enabled is 'auto' ({hf} it from --bf16): left out, set training.precision",
        f"{file}: fp16.enabled is 'auto' ({hf} it from --fp16): left out, set training.precision",
    )  # fmt: skip
    assert imported.ignored == (
        "zero_optimization.contiguous_gradients",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save", "fp16.loss_scale",
        "fp16.loss_scale_window", "fp16.initial_scale_power", "fp16.hysteresis",
        "fp16.min_loss_scale", "optimizer", "scheduler", "gradient_clipping", "steps_per_print",
        "wall_clock_breakdown",
    )  # fmt: skip


def test_zero3_ds_config_loads_as_a_plan() -> None:
    imported = from_deepspeed_config(FIXTURES / "ds_config_zero3.json")
    base = {
        "model": {"preset": "llama3-8b", "seq_len": 4096},
        "cluster": {"node": "dgx-h100", "num_nodes": 2},
        "training": {"micro_batch_size": 2, "global_batch_size": 64},
    }
    raw, _ = merge_sections(base, imported)
    plan = _resolved(raw, 16)
    assert (plan.parallel.data_parallel, plan.parallel.dp) == ("zero3", 16)
    assert plan.parallel.zero_overlap_comm is True


def test_deepspeed_batch_rules(tmp_path: Path) -> None:
    def batch(config: dict[str, Any], world_size: int | None = None) -> Imported:
        path = _write(tmp_path, "ds.json", {**config, "bf16": {"enabled": True}})
        return from_deepspeed_config(path, world_size=world_size)

    full = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 16}  # fmt: skip
    assert batch(full, 8).sections["training"] == {
        "micro_batch_size": 4,
        "global_batch_size": 512,
        "precision": "bf16",
    }
    micro_accum = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8}
    assert batch(micro_accum, 16).sections["training"]["global_batch_size"] == 512
    no_world = batch(micro_accum)
    assert "global_batch_size" not in no_world.sections["training"]
    assert (
        "ds.json: training.global_batch_size = micro batch x accumulation steps x data-parallel "
        "size: left out (pass world_size)"
    ) in no_world.warnings
    assert batch({"train_batch_size": 256}, 32).sections["training"]["micro_batch_size"] == 8
    assert (
        batch({"train_micro_batch_size_per_gpu": 2}, 8).sections["training"]["global_batch_size"]
        == 16
    )
    with pytest.raises(ValueError, match=r"^ds.json: train_batch_size=512 != "):
        batch(full, 16)
    with pytest.raises(ValueError, match="world_size must be a positive integer, got 0"):
        batch(full, 0)


def test_deepspeed_stages_and_knobs(tmp_path: Path) -> None:
    config = {
        "train_batch_size": 64,
        "fp16": {"enabled": True},
        "zero_optimization": {
            "stage": 2,
            "reduce_bucket_size": 2e8,
            "allgather_bucket_size": 2e8,
            "stage3_prefetch_bucket_size": 1e7,
        },
        "activation_checkpointing": {"partition_activations": True},
    }
    imported = from_deepspeed_config(_write(tmp_path, "ds.json", config))
    assert imported.sections == {
        "parallel": {"data_parallel": "zero2", "zero_bucket_elems": 200_000_000,
                     "recompute": "full"},
        "training": {"global_batch_size": 64, "precision": "fp16"},
    }  # fmt: skip
    assert imported.warnings == (
        "ds.json: zero_optimization.stage3_prefetch_bucket_size is read only at stage 3 (ignored)",
        "ds.json: zero_optimization.allgather_bucket_size is ignored by DeepSpeed when torch has "
        "all_gather_into_tensor (torch >= 1.13; runtime/utils.py all_gather_dp_groups)",
        "ds.json: activation_checkpointing configures deepspeed.checkpointing, which the model "
        "code decides to call: assumed recompute full (every layer)",
        "ds.json: activation_checkpointing.partition_activations is not modelled (ignored)",
        "ds.json: training.micro_batch_size = train_batch_size / (accumulation steps x "
        "data-parallel size): left out (pass world_size)",
    )
    stage0 = from_deepspeed_config(_write(tmp_path, "ds0.json", {"train_batch_size": 8}))
    assert stage0.sections["parallel"] == {"data_parallel": "ddp"}
    assert stage0.warnings[0].startswith("ds0.json: zero_optimization.stage 0: DeepSpeed's own")
    assert stage0.warnings[-1] == (
        "ds0.json: neither bf16 nor fp16 is enabled: DeepSpeed trains in fp32, which is not "
        "modelled (training.precision left out)"
    )


def test_deepspeed_offload_reaches_the_plan_keys(tmp_path: Path) -> None:
    """offload_optimizer / offload_param map to the plan's offload keys (on main: dropped)."""

    def zero(stage: int, **keys: Any) -> Imported:
        config = {"train_batch_size": 8, "bf16": {"enabled": True},
                  "zero_optimization": {"stage": stage, **keys}}  # fmt: skip
        return from_deepspeed_config(_write(tmp_path, "ds.json", config))

    nvme = zero(
        3,
        offload_optimizer={"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": True,
                           "buffer_count": 4, "pipeline_read": True, "pipeline_write": True,
                           "fast_init": False},
        offload_param={"device": "cpu", "pin_memory": True, "buffer_count": 5},
        sub_group_size=1e9,
    )  # fmt: skip
    assert nvme.sections["parallel"] == {
        "data_parallel": "zero3", "offload_optimizer": "nvme", "offload_pipeline_read": True,
        "offload_pipeline_write": True, "offload_param": "cpu", "offload_pin_memory": True,
    }  # fmt: skip
    assert nvme.warnings[-1].startswith("ds.json: training.micro_batch_size = ")
    assert len(nvme.warnings) == 1  # the knobs at DeepSpeed's defaults say nothing
    odd = zero(
        2,
        offload_optimizer={"device": "cpu", "pin_memory": False, "buffer_count": 8,
                           "pipeline_read": True, "ratio": 0.5},
        offload_param={"device": "cpu", "pin_memory": True},
        sub_group_size=1e8,
    )  # fmt: skip
    assert odd.sections["parallel"] == {
        "data_parallel": "zero2", "offload_optimizer": "cpu", "offload_pin_memory": False,
    }  # fmt: skip
    assert odd.warnings[:4] == (
        "ds.json: zero_optimization.offload_optimizer.buffer_count 8 is priced as DeepSpeed's "
        "default 4 (not a plan key)",
        "ds.json: zero_optimization.offload_optimizer.ratio 0.5 (partial offload, ZeRO++) is not "
        "modelled: priced as the whole optimizer offloaded",
        "ds.json: zero_optimization.offload_optimizer.pipeline_read needs device nvme (ignored)",
        "ds.json: zero_optimization.offload_param is read only at stage 3 (ignored)",
    )
    assert (
        "ds.json: zero_optimization.sub_group_size 1e+08 is priced as DeepSpeed's default "
        "1e+09 (not a plan key)" in odd.warnings
    )
    legacy = zero(2, cpu_offload=True, cpu_offload_use_pin_memory=True)
    assert legacy.sections["parallel"] == {
        "data_parallel": "zero2", "offload_optimizer": "cpu", "offload_pin_memory": True,
    }  # fmt: skip
    plan = load_plan(
        merge_sections({"model": "llama3-8b", "cluster": {"node": "dgx-h100"},
                        "training": {"micro_batch_size": 1}}, nvme)[0]
    )  # fmt: skip
    assert (plan.parallel.offload_optimizer, plan.parallel.offload_param) == ("nvme", "cpu")


def test_deepspeed_auto_accumulation_is_quiet_when_the_batch_is_fixed(tmp_path: Path) -> None:
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
              "gradient_accumulation_steps": "auto", "bf16": {"enabled": True},
              "zero_optimization": {"stage": 1}}  # fmt: skip
    fixed = from_deepspeed_config(_write(tmp_path, "ds.json", config), world_size=32)
    assert fixed.sections["training"] == {
        "micro_batch_size": 1, "global_batch_size": 64, "precision": "bf16",
    }  # fmt: skip
    assert fixed.warnings == ()
    open_batch = {**config, "train_micro_batch_size_per_gpu": "auto"}
    left = from_deepspeed_config(_write(tmp_path, "ds.json", open_batch), world_size=32)
    assert left.warnings[-1].startswith("ds.json: gradient_accumulation_steps is 'auto'")


def test_importer_warnings_summarised_in_one_line() -> None:
    """Notes that change the result first, the 'auto' values with the plan keys to set, the
    keys not modelled, the noise counted; a line asking for a key the plan gives is left out."""
    ds = from_deepspeed_config(FIXTURES / "ds_config_zero3.json")
    assert ds.summary() == (
        "ds_config_zero3.json: zero_optimization.reduce_bucket_size, "
        "zero_optimization.stage3_prefetch_bucket_size, "
        "zero_optimization.stage3_param_persistence_threshold, train_batch_size, "
        "train_micro_batch_size_per_gpu, gradient_accumulation_steps, bf16.enabled, "
        "fp16.enabled 'auto' (the Hugging Face Trainer fills them in): set "
        "parallel.zero_bucket_elems, parallel.zero_prefetch_bucket_elems, "
        "parallel.zero_param_persistence_threshold, training.global_batch_size, "
        "training.micro_batch_size, training.precision; not modelled (ignored): "
        "zero_optimization.stage3_max_reuse_distance; 12 keys ignored that change nothing a "
        "step costs"
    )
    given = {"training.precision", "training.global_batch_size", "training.micro_batch_size"}
    assert "train_batch_size" not in str(ds.summary(given))
    megatron = from_megatron_args(FIXTURES / "train_llama3_70b.sh")
    assert megatron.summary({"model.vocab_size"}) == (
        "train_llama3_70b.sh: 11 keys ignored that change nothing a step costs"
    )
    assert "give model.vocab_size" in str(megatron.summary())
    assert Imported(sections={}, warnings=()).summary() is None


def test_torchtitan_minus_one_shard_degree_from_the_world_size(tmp_path: Path) -> None:
    """torchtitan's ParallelDims: the shard degree is what the other degrees leave."""
    imported = from_torchtitan_toml(FIXTURES / "llama3_8b.toml", world_size=64)
    assert imported.sections["training"]["global_batch_size"] == 64  # local 1 x dp 64
    assert "dp" not in imported.sections["parallel"]  # resolve_plan derives it from the cluster
    hsdp = """
[training]
local_batch_size = 2
[parallelism]
data_parallel_replicate_degree = 2
tensor_parallel_degree = 4
"""
    path = _write(tmp_path, "t.toml", hsdp)
    parallel = from_torchtitan_toml(path, world_size=64).sections["parallel"]
    assert (parallel["data_parallel"], parallel["hsdp_shard_size"]) == ("hsdp", 8)
    assert from_torchtitan_toml(path, world_size=64).sections["training"]["global_batch_size"] == 32
    with pytest.raises(ValueError, match=r"^t.toml: data_parallel_shard_degree -1 on 12 GPUs"):
        from_torchtitan_toml(path, world_size=12)


def test_old_torchtitan_degrees_under_training_are_read_or_refused(tmp_path: Path) -> None:
    old = """
[model]
flavor = "70B"
[training]
batch_size = 8
data_parallel_degree = -1
tensor_parallel_degree = 8
[experimental]
pipeline_parallel_degree = 2
"""
    imported = from_torchtitan_toml(_write(tmp_path, "t.toml", old), world_size=64)
    parallel = imported.sections["parallel"]
    assert (parallel["tp"], parallel["pp"], parallel["data_parallel"]) == (8, 2, "fsdp2")
    assert imported.sections["training"]["global_batch_size"] == 32  # 8 x (64 / 16)
    assert imported.warnings[0] == (
        "t.toml: training.data_parallel_degree, training.tensor_parallel_degree, "
        "experimental.pipeline_parallel_degree: read as [parallelism] (torchtitan before v0.1 "
        "kept the degrees there)"
    )
    both = old + "[parallelism]\ntensor_parallel_degree = 8\n"
    with pytest.raises(ValueError) as error:
        from_torchtitan_toml(_write(tmp_path, "t.toml", both))
    assert str(error.value) == (
        "t.toml: training.data_parallel_degree is where torchtitan before v0.1 kept it, and the "
        "file has a [parallelism] table too: move it under [parallelism]"
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"zero_optimization": {"stage": 4}},
         "ds.json: zero_optimization.stage must be 0-3, got 4"),
        ({"zero_optimization": {"stage": 3, "overlap_comm": "yes"}},
         "ds.json: zero_optimization.overlap_comm must be true or false, got 'yes'"),
        ({"zero_optimization": {"stage": 3, "reduce_bucket_size": -1}},
         "ds.json: zero_optimization.reduce_bucket_size must be >= 0, got -1"),
        ({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1,
                                "stage3_prefetch_bucket_size": 1}},
         "ds.json: zero_optimization gives both stage3_prefetch_bucket_size and "
         "prefetch_bucket_size"),
        ({"zero_optimization": []}, "ds.json: zero_optimization must be a mapping, got []"),
        ({"train_batch_size": 0}, "ds.json: train_batch_size must be > 0, got 0"),
        ({"train_batch_size": 1.5}, "ds.json: train_batch_size must be an integer, got 1.5"),
        ({"bf16": {"enabled": True}, "fp16": {"enabled": True}},
         "ds.json: bf16.enabled and fp16.enabled are both true"),
    ],
)  # fmt: skip
def test_bad_deepspeed_configs(tmp_path: Path, config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as error:
        from_deepspeed_config(_write(tmp_path, "ds.json", config))
    assert str(error.value) == message


# --- Megatron-LM -----------------------------------------------------------------------------

LLAMA3_70B_MEGATRON = {
    "model": {
        "name": "train_llama3_70b", "num_layers": 80, "hidden_size": 8192, "num_heads": 64,
        "num_kv_heads": 8, "ffn_hidden_size": 28672, "seq_len": 8192,
        "mlp_activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
        "tied_embeddings": False, "linear_bias": False, "dropout": False,
    },
    "parallel": {
        "tp": 8, "pp": 4, "vpp": 4, "schedule": "interleaved", "sequence_parallel": True,
        "recompute": "selective", "data_parallel": "distributed_optimizer",
        "overlap_grad_reduce": True, "overlap_param_gather": True, "tp_comm_overlap": True,
    },
    "training": {
        "micro_batch_size": 1, "global_batch_size": 512, "precision": "bf16",
        "stack": "megatron",
    },
}  # fmt: skip


def test_llama3_70b_megatron_launch_script() -> None:
    imported = from_megatron_args(FIXTURES / "train_llama3_70b.sh")
    assert imported.sections == LLAMA3_70B_MEGATRON
    file = "train_llama3_70b.sh"
    assert imported.warnings == (
        f"{file}: no --vocab-size: the vocabulary comes from the tokenizer "
        "('meta-llama/Meta-Llama-3-70B'): give model.vocab_size",
    )
    assert imported.ignored == (
        "--rotary-base", "--lr", "--min-lr", "--lr-decay-style", "--train-iters",
        "--tokenizer-type", "--tokenizer-model", "--data-path", "--save", "--load",
        "--log-interval",
    )  # fmt: skip


def test_megatron_script_loads_as_a_plan() -> None:
    imported = from_megatron_args(FIXTURES / "train_llama3_70b.sh")
    base = {"model": {"vocab_size": 128256}, "cluster": {"node": "dgx-h100", "num_nodes": 64}}
    raw, _ = merge_sections(base, imported)
    plan = _resolved(raw, 512)
    assert (plan.parallel.dp, plan.parallel.vpp, plan.training.stack) == (16, 4, "megatron")
    preset = resolve_model_preset("llama3-70b")
    assert all(getattr(plan.model, k) == preset[k] for k in (*SHAPE_KEYS, "vocab_size"))


def test_megatron_defaults_are_megatrons(tmp_path: Path) -> None:
    """An args file, ``--flag=value``, Megatron's GPT defaults and a repeated flag."""
    args = (
        "--num-layers 24 --hidden-size=2048 --num-attention-heads 16 --seq-length 2048\n"
        "--max-position-embeddings 4096 --vocab-size 50257 --micro-batch-size 4\n"
        "--global-batch-size 256 --global-batch-size 512 --fp16 --foo bar baz\n"
    )
    imported = from_megatron_args(_write(tmp_path, "args.txt", args))
    assert imported.sections["model"] == {
        "name": "args", "num_layers": 24, "hidden_size": 2048, "num_heads": 16,
        "num_kv_heads": 16, "ffn_hidden_size": 8192, "vocab_size": 50257, "seq_len": 2048,
        "mlp_activation": "gelu", "norm": "layernorm", "position_embedding": "learned",
        "tied_embeddings": True, "linear_bias": True, "dropout": True,
    }  # fmt: skip
    assert imported.sections["parallel"] == {"data_parallel": "ddp", "overlap_grad_reduce": False}
    assert imported.sections["training"]["global_batch_size"] == 512
    assert imported.warnings == (
        "args.txt: --global-batch-size given 2 times: the last is used",
        "args.txt: the learned position table has --max-position-embeddings 4096 rows; the plan "
        "counts seq_len x hidden_size",
        "args.txt: no --use-distributed-optimizer: Megatron's DDP (one all-reduce of the "
        "gradient buffer in buckets) is priced as data_parallel ddp",
        "args.txt: --foo is not modelled (ignored)",
    )


@pytest.mark.parametrize(
    ("flags", "graphed"),
    [
        ("--enable-cuda-graph", True),
        ("--external-cuda-graph", True),
        ("--cuda-graph-impl transformer_engine", True),
        ("--cuda-graph-impl none", False),
        ("", False),
    ],
)
def test_megatron_cuda_graphs(tmp_path: Path, flags: str, graphed: bool) -> None:
    args = f"--micro-batch-size 1 --global-batch-size 8 --bf16 {flags}\n"
    training = from_megatron_args(_write(tmp_path, "args.txt", args)).sections["training"]
    assert training.get("cuda_graphs", False) is graphed


@pytest.mark.parametrize(
    ("kind", "positions", "note"),
    [("none", "none", False), ("rope", "rope", False), ("mrope", "rope", True),
     ("learned_absolute", "learned", False),
     ("learned_absolute --no-position-embedding", "none", False),
     ("rope --no-position-embedding", "rope", False)],
)  # fmt: skip
def test_megatron_position_embedding_types(
    tmp_path: Path, kind: str, positions: str, note: bool
) -> None:
    args = (
        "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
        f"--max-position-embeddings 128 --position-embedding-type {kind}\n"
    )
    imported = from_megatron_args(_write(tmp_path, "args.txt", args))
    assert imported.sections["model"]["position_embedding"] == positions
    priced = f"--position-embedding-type {kind}: priced as rope"
    assert any(priced in line for line in imported.warnings) is note


@pytest.mark.parametrize(
    ("flags", "fusion"),
    [
        ("--cross-entropy-loss-fusion", "native"),
        ("--cross-entropy-loss-fusion --cross-entropy-fusion-impl native", "native"),
        ("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te", "te_inplace"),
        ("--cross-entropy-fusion-impl te", None),  # the implementation alone fuses nothing
        ("", None),
    ],
)
def test_megatron_cross_entropy_fusion(tmp_path: Path, flags: str, fusion: str | None) -> None:
    args = f"--micro-batch-size 1 --global-batch-size 8 --bf16 {flags}\n"
    imported = from_megatron_args(_write(tmp_path, "args.txt", args))
    assert imported.sections["training"].get("cross_entropy_fusion") == fusion
    newer = "set training.cross_entropy_fusion: te for Transformer Engine 2.18 or later"
    assert any(newer in line for line in imported.warnings) is (fusion == "te_inplace")


def test_megatron_bash_arrays_variables_and_pipeline_split(tmp_path: Path) -> None:
    """Llama 3 405B as Megatron splits it: 126 layers + embedding + loss over PP16 x 2."""
    script = """#!/bin/bash
PP=${PP:-16}
MODEL_ARGS=(
    --num-layers 126 --hidden-size 16384 --num-attention-heads 128  # the 405B shape
    --group-query-attention --num-query-groups 8 --ffn-hidden-size 53248 --swiglu
    --seq-length 8192 --position-embedding-type rope --normalization RMSNorm
)
MODEL_ARGS+=(--untie-embeddings-and-output-weights --disable-bias-linear)
PAR_ARGS="--tensor-model-parallel-size 8 --pipeline-model-parallel-size $PP"
python tools/preprocess_data.py --input x.json
torchrun --nproc_per_node 8 pretrain_gpt.py ${MODEL_ARGS[@]} $PAR_ARGS \\
    --num-layers-per-virtual-pipeline-stage 4 --account-for-embedding-in-pipeline-split \\
    --account-for-loss-in-pipeline-split --recompute-granularity full \\
    --recompute-method block --recompute-num-layers 2 --micro-batch-size 1 \\
    --global-batch-size 2048 --bf16 --vocab-size 128256 | tee log.txt
"""
    imported = from_megatron_args(_write(tmp_path, "train.sh", script))
    parallel = imported.sections["parallel"]
    assert {k: parallel[k] for k in ("tp", "pp", "vpp", "embedding_as_layer", "recompute")} == {
        "tp": 8, "pp": 16, "vpp": 2, "embedding_as_layer": True, "recompute": "full",
    }  # fmt: skip
    assert parallel["pp_scatter_gather"] is False  # tp > 1, pp > 1, no SP: Megatron-Core's p2p
    # block recompute of 2 of each chunk's 4 layers is carried, not rounded up to every layer
    assert parallel["recompute_num_layers"] == 2
    assert not any("--recompute-method" in w for w in imported.warnings)
    raw, _ = merge_sections({"cluster": {"node": "dgx-h100", "num_nodes": 512}}, imported)
    plan = _resolved(raw, 4096)
    assert (plan.model.num_layers, plan.parallel.loss_as_layer, plan.parallel.dp) == (126, True, 32)
    assert plan.parallel.recompute_num_layers == 2


SHAPE = "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("--micro-batch-size x", "a.sh: --micro-batch-size must be an integer, got 'x'"),
        ("--tensor-model-parallel-size $TP",
         "a.sh: --tensor-model-parallel-size $TP is a shell variable the file does not set"),
        ("--bf16 true", "a.sh: --bf16 takes no value, got 'true'"),
        (f"{SHAPE} --normalization rmsnorm",
         "a.sh: --normalization must be one of LayerNorm, RMSNorm, got 'rmsnorm'"),
        ("--num-layers 2 --hidden-size 8",
         "a.sh: --num-attention-heads missing (a model needs --num-layers, --hidden-size, "
         "--num-attention-heads, --seq-length)"),
        ("--recompute-granularity full",
         "a.sh: --recompute-granularity full needs --recompute-method and "
         "--recompute-num-layers (Megatron-Core refuses it without them)"),
        (f"{SHAPE} --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 3",
         "a.sh: --num-layers-per-virtual-pipeline-stage 3 does not divide the 32/4 layers of a "
         "pipeline stage"),
        ("--bf16 --fp16", "a.sh: --bf16 and --fp16 together (Megatron refuses both)"),
        ("--cross-entropy-loss-fusion --cross-entropy-fusion-impl triton",
         "a.sh: --cross-entropy-fusion-impl must be one of native, te, got 'triton'"),
        ("--lr 'unclosed", "a.sh: cannot be read as shell words: No closing quotation"),
    ],
)  # fmt: skip
def test_bad_megatron_args(tmp_path: Path, args: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        from_megatron_args(_write(tmp_path, "a.sh", f"pretrain_gpt.py {args}\n"))
    assert str(error.value) == message


# --- torchtitan ------------------------------------------------------------------------------


def test_torchtitan_llama3_8b_toml() -> None:
    imported = from_torchtitan_toml(FIXTURES / "llama3_8b.toml")
    assert imported.sections == {
        "model": {"preset": "llama3-8b", "seq_len": 8192, "separate_projections": True},
        "parallel": {"tp": 1, "pp": 1, "cp": 1, "data_parallel": "fsdp2",
                     "fsdp_reduce_dtype": "fp32", "recompute": "op"},
        "training": {"micro_batch_size": 1, "precision": "bf16", "stack": "eager"},
    }  # fmt: skip
    file = "llama3_8b.toml"
    assert imported.warnings == (
        f"{file}: training.global_batch_size unset: torchtitan uses local_batch_size x the "
        "data-parallel degree, which data_parallel_shard_degree -1 leaves to the world size: "
        "left out",
        *_ignored(file, "quantize"),  # its float8 table, with no float8 converter: not read
    )
    assert imported.ignored == (
        "model.hf_assets_path", "training.max_norm", "training.steps", "training.dataset", "job",
        "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "validation",
    )  # fmt: skip


def test_torchtitan_toml_loads_as_a_plan() -> None:
    """The file's comment: a preset for 64 A100s; 8 nodes of 8 give FSDP over 64 ranks."""
    imported = from_torchtitan_toml(FIXTURES / "llama3_8b.toml")
    base = {"cluster": {"node": "dgx-a100", "num_nodes": 8}, "training": {"global_batch_size": 64}}
    raw, _ = merge_sections(base, imported)
    plan = _resolved(raw, 64)
    assert (plan.model.name, plan.model.seq_len, plan.parallel.fsdp2) == ("llama3-8b", 8192, True)


LLAMA3_70B_TOML = """
[model]
name = "llama3"
flavor = "70B"
converters = ["float8"]

[training]
local_batch_size = 8
global_batch_size = 1024
seq_len = 8192

[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 4
tensor_parallel_degree = 8
enable_async_tensor_parallel = true
pipeline_parallel_degree = 8
pipeline_parallel_schedule = "Interleaved1F1B"
fsdp_reshard_after_forward = "never"

[activation_checkpoint]
mode = "full"

[compile]
enable = true
"""


def test_torchtitan_hsdp_interleaved_pipeline_float8(tmp_path: Path) -> None:
    imported = from_torchtitan_toml(_write(tmp_path, "70b.toml", LLAMA3_70B_TOML))
    # torchtitan's split of 80 layers + embedding + output over 16 stages: 82 = 5 x 16 + 2
    split = [5, 6, *[5] * 13, 4]
    assert imported.sections == {
        "model": {"preset": "llama3-70b", "seq_len": 8192, "separate_projections": True},
        "parallel": {
            "tp": 8, "pp": 8, "cp": 1, "dp": 8, "sequence_parallel": True,
            "data_parallel": "hsdp", "fsdp_version": 2, "hsdp_shard_size": 4,
            "fsdp_reshard_after_forward": False, "fsdp_reduce_dtype": "fp32",
            "schedule": "interleaved", "pipeline_layers": split, "vpp": 2,
            "tp_comm_overlap": True, "recompute": "full",
        },
        "training": {"micro_batch_size": 1, "global_batch_size": 1024, "precision": "fp8",
                     "stack": "compile", "float8_recipe": "tensorwise"},
    }  # fmt: skip
    assert imported.warnings == (
        "70b.toml: parallelism.enable_async_tensor_parallel (async TP): priced as tp_comm_overlap",
        "70b.toml: training.global_batch_size > local_batch_size x dp = 64: torchtitan runs "
        "several pipeline rounds per step, the plan one round of all the micro-batches (a "
        "smaller bubble)",
        "70b.toml: model.converters float8 (torchao Float8Linear): recipe tensorwise",
    )
    raw, _ = merge_sections({"cluster": {"node": "dgx-h100", "num_nodes": 64}}, imported)
    plan = _resolved(raw, 512)
    assert (plan.parallel.hsdp_shard_size, plan.parallel.pipeline_layers) == (4, tuple(split))


def test_torchtitan_single_stage_split_ddp_and_old_names(tmp_path: Path) -> None:
    toml = """
[model]
flavor = "8B"
[training]
batch_size = 4
compile = true
[parallelism]
data_parallel_replicate_degree = 4
data_parallel_shard_degree = 1
pipeline_parallel_degree = 4
[activation_checkpoint]
mode = "selective"
selective_ac_option = "1"
"""
    imported = from_torchtitan_toml(_write(tmp_path, "t.toml", toml))
    parallel = imported.sections["parallel"]
    assert parallel == {
        "tp": 1, "pp": 4, "cp": 1, "dp": 4, "data_parallel": "ddp", "ddp_bucket_mb": 100.0,
        "schedule": "1f1b", "pipeline_layers": [8, 9, 8, 7], "recompute": "full",
    }  # fmt: skip
    assert imported.sections["training"] == {
        "micro_batch_size": 1, "global_batch_size": 16, "precision": "bf16", "stack": "compile",
    }  # fmt: skip
    assert imported.sections["model"] == {
        "preset": "llama3-8b",
        "seq_len": 2048,
        "separate_projections": True,
    }


def test_torchtitan_cpu_offload_is_fsdp2_offload(tmp_path: Path) -> None:
    toml = """
[model]
flavor = "8B"
[training]
local_batch_size = 1
enable_cpu_offload = true
"""
    parallel = from_torchtitan_toml(_write(tmp_path, "t.toml", toml)).sections["parallel"]
    assert (parallel["data_parallel"], parallel["offload_param"]) == ("fsdp2", "cpu")
    ddp = toml + "[parallelism]\ndata_parallel_shard_degree = 1\n"
    imported = from_torchtitan_toml(_write(tmp_path, "d.toml", ddp))
    assert "offload_param" not in imported.sections["parallel"]
    warning = "d.toml: training.enable_cpu_offload applies only with FSDP (ignored)"
    assert warning in imported.warnings


def test_torchtitan_unmodelled_schedule_and_flavor(tmp_path: Path) -> None:
    toml = """
[model]
flavor = "debugmodel"
[parallelism]
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "ZBVZeroBubble"
"""
    imported = from_torchtitan_toml(_write(tmp_path, "t.toml", toml))
    assert imported.sections["model"] == {"seq_len": 2048, "separate_projections": True}
    assert "schedule" not in imported.sections["parallel"]
    assert imported.warnings[:3] == (
        "t.toml: model.flavor 'debugmodel' has no preset: give model's shape",
        "t.toml: parallelism.pipeline_parallel_schedule ZBVZeroBubble is not modelled",
        "t.toml: activation_checkpoint.selective_ac_option 2: priced as full on every layer",
    )


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[parallelism]\ntensor_parallel_degree = '8'",
         "t.toml: parallelism.tensor_parallel_degree must be an integer, got '8'"),
        ("[parallelism]\ndata_parallel_shard_degree = 0",
         "t.toml: parallelism.data_parallel_shard_degree must be -1 or >= 1"),
        ("[activation_checkpoint]\nmode = 'sometimes'",
         "t.toml: activation_checkpoint.mode must be one of selective, full, none, "
         "memory_budget, got 'sometimes'"),
        ("[activation_checkpoint]\nselective_ac_option = 'x'",
         "t.toml: activation_checkpoint.selective_ac_option must be 'op' or a layer interval, "
         "got 'x'"),
        ("[training]\nbatch_size = 1\nlocal_batch_size = 1",
         "t.toml: training gives batch_size and local_batch_size"),
        ("[model]\nflavor = '8B'\n[parallelism]\npipeline_parallel_degree = 40",
         "t.toml: 40 pipeline stages cannot hold 32 layers with first/last_stage_less_layers 1/1"),
        ("[training\n", "t.toml: Expected ']' at the end of a table declaration"),
        ("training = 3", "t.toml: training must be a mapping, got 3"),
    ],
)  # fmt: skip
def test_bad_torchtitan_configs(tmp_path: Path, toml: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        from_torchtitan_toml(_write(tmp_path, "t.toml", toml))
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


# --- merging ---------------------------------------------------------------------------------


def test_merge_later_wins_per_key_and_says_so() -> None:
    first = Imported(sections={"model": {"seq_len": 8192, "num_layers": 2}}, warnings=("a",))
    second = Imported(sections={"model": {"seq_len": 4096}, "parallel": {"tp": 2}}, warnings=())
    base = {"model": "llama3-8b", "cluster": {"node": "dgx-h100"}}
    raw, warnings = merge_sections(base, first, second)
    assert raw == {
        "model": {"preset": "llama3-8b", "seq_len": 4096, "num_layers": 2},
        "cluster": {"node": "dgx-h100"},
        "parallel": {"tp": 2},
    }
    assert warnings == ("a", "merge: model.seq_len=8192 replaced by 4096 (import 2)")
    assert base == {"model": "llama3-8b", "cluster": {"node": "dgx-h100"}}  # not modified
    with pytest.raises(ValueError, match="base plan section 'parallel' must be a mapping"):
        merge_sections({"parallel": 3}, second)


def test_hf_model_and_torchtitan_sequence_length_merge() -> None:
    """The HF model's seq_len (max_position_embeddings) gives way to the training run's."""
    model = model_from_hf_config(FIXTURES / "Meta-Llama-3-8B" / "config.json")
    titan = from_torchtitan_toml(FIXTURES / "llama3_8b.toml")
    base = {"cluster": {"node": "dgx-a100", "num_nodes": 8}, "training": {"global_batch_size": 64}}
    raw, warnings = merge_sections(base, model, titan)
    plan = _resolved(raw, 64)
    assert (plan.model.name, plan.model.seq_len) == ("Meta-Llama-3-8B", 8192)
    assert warnings == (*model.warnings, *titan.warnings)  # the same seq_len: nothing replaced


def test_torchtitan_context_parallel_rotate_method(tmp_path: Path) -> None:
    toml = """
[model]
flavor = "8B"
[training]
local_batch_size = 1
seq_len = 131072
[parallelism]
context_parallel_degree = 8
context_parallel_rotate_method = "alltoall"
"""
    parallel = from_torchtitan_toml(_write(tmp_path, "t.toml", toml)).sections["parallel"]
    assert (parallel["cp"], parallel["cp_rotate_method"]) == (8, "alltoall")
    default = toml.replace('context_parallel_rotate_method = "alltoall"\n', "")
    parallel = from_torchtitan_toml(_write(tmp_path, "d.toml", default)).sections["parallel"]
    assert parallel["cp_rotate_method"] == "allgather"


def test_torchtitan_compile_components_without_the_loss(tmp_path: Path) -> None:
    """``[compile] components = ["model"]`` compiles the layers and leaves the loss eager."""
    toml = LLAMA3_70B_TOML.replace("enable = true", 'enable = true\ncomponents = ["model"]')
    imported = from_torchtitan_toml(_write(tmp_path, "70b.toml", toml))
    assert imported.sections["training"]["stack"] == "compile"
    assert imported.sections["training"]["compile_loss"] is False
    default = from_torchtitan_toml(_write(tmp_path, "default.toml", LLAMA3_70B_TOML))
    assert "compile_loss" not in default.sections["training"]  # the stack's default: compiled


def test_torchtitan_disable_loss_parallel(tmp_path: Path) -> None:
    """``disable_loss_parallel`` with tensor parallelism: the plan's loss is not vocab-sharded."""
    toml = LLAMA3_70B_TOML.replace(
        "tensor_parallel_degree = 8", "tensor_parallel_degree = 8\ndisable_loss_parallel = true"
    )
    imported = from_torchtitan_toml(_write(tmp_path, "70b.toml", toml))
    assert imported.sections["training"]["loss_parallel"] is False
    default = from_torchtitan_toml(_write(tmp_path, "default.toml", LLAMA3_70B_TOML))
    assert "loss_parallel" not in default.sections["training"]


MOE_ARGS = (
    "--num-layers 56 --hidden-size 6144 --num-attention-heads 48 --seq-length 4096 "
    "--group-query-attention --num-query-groups 8 --ffn-hidden-size 16384 --swiglu "
    "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --sequence-parallel "
    "--use-distributed-optimizer --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 "
    "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 8192 "
    "--moe-shared-expert-intermediate-size 2048 --moe-grouped-gemm --moe-permute-fusion "
    "--moe-router-fusion --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2 "
    "--moe-layer-freq '([0]*1+[1]*55)' --micro-batch-size 1 --global-batch-size 256 --bf16"
)


def test_megatron_moe_flags(tmp_path: Path) -> None:
    imported = from_megatron_args(_write(tmp_path, "moe.sh", f"pretrain_gpt.py {MOE_ARGS}\n"))
    model, parallel = imported.sections["model"], imported.sections["parallel"]
    assert {k: v for k, v in model.items() if "expert" in k or k.startswith("moe")} == {
        "num_experts": 8, "moe_top_k": 2, "moe_ffn_hidden_size": 8192,
        "moe_shared_expert_ffn_hidden_size": 2048, "moe_first_dense_layers": 1,
    }  # fmt: skip
    assert {k: parallel[k] for k in ("ep", "etp", "moe_token_dispatcher")} == {
        "ep": 8, "etp": 1, "moe_token_dispatcher": "alltoall",
    }  # fmt: skip
    assert parallel["moe_permute_fusion"] is parallel["moe_router_fusion"] is True
    assert not any("--moe" in w for w in imported.warnings)  # the aux-loss coefficient: noise
    raw, _ = merge_sections(
        {"model": {"vocab_size": 32000}, "cluster": {"node": "dgx-h100", "num_nodes": 16}},
        imported,
    )
    plan = _resolved(raw, 128)
    assert (plan.parallel.dp, plan.parallel.ep, plan.model.num_experts) == (8, 8, 8)
    assert plan.parallel.moe_permute_fusion and plan.parallel.moe_router_fusion


@pytest.mark.parametrize(
    ("extra", "warning"),
    [
        ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep "
         "--moe-grouped-gemm",
         "m.sh: the flex dispatcher's hybridep backend is priced as DeepEP"),
        ("", "m.sh: no --moe-grouped-gemm: Megatron runs the local experts one after another "
         "(SequentialMLP); priced as a grouped GEMM"),
    ],
)  # fmt: skip
def test_megatron_moe_notes(tmp_path: Path, extra: str, warning: str) -> None:
    args = f"pretrain_gpt.py {SHAPE} --num-experts 8 {extra}\n"
    assert warning in from_megatron_args(_write(tmp_path, "m.sh", args)).warnings


@pytest.mark.parametrize(
    ("freq", "keys"),
    [
        ("2", {"moe_layer_freq": 2}),
        ("1", {}),
        ("'([0]+[1]*31)'", {"moe_first_dense_layers": 1}),  # Megatron's docstring form
        ("'[1]*32'", {}),
        ("'([1]*1+[0]*1)*16'", {"moe_layer_freq": 2}),
        ("'[0]*2+([1]+[0]*2)*10'", {"moe_first_dense_layers": 2, "moe_layer_freq": 3}),
    ],
)
def test_megatron_moe_layer_freq(tmp_path: Path, freq: str, keys: dict[str, int]) -> None:
    args = f"pretrain_gpt.py {SHAPE} --num-experts 8 --moe-grouped-gemm --moe-layer-freq {freq}\n"
    model = from_megatron_args(_write(tmp_path, "m.sh", args)).sections["model"]
    assert {
        k: v for k, v in model.items() if k in ("moe_layer_freq", "moe_first_dense_layers")
    } == (keys)


@pytest.mark.parametrize(
    ("freq", "message"),
    [
        ("'([0]*3+[1]*28)'", "m.sh: --moe-layer-freq '([0]*3+[1]*28)' must be an integer >= 1 or "
         "a list of 0s and 1s, one per layer of the --num-layers 32 (as ([0]*k+[1]*m)), with at "
         "least one MoE layer"),
        ("'[1,1,0]+[1]*29'", "m.sh: --moe-layer-freq '[1,1,0]+[1]*29': only k dense layers "
         "followed by every n-th layer MoE is modelled"),
        ("'__import__(\"os\")'", "m.sh: --moe-layer-freq '__import__(\"os\")' must be an "
         "integer >= 1 or a list of 0s and 1s, one per layer of the --num-layers 32 (as "
         "([0]*k+[1]*m)), with at least one MoE layer"),
    ],
)  # fmt: skip
def test_bad_megatron_moe_layer_freq(tmp_path: Path, freq: str, message: str) -> None:
    args = f"pretrain_gpt.py {SHAPE} --num-experts 8 --moe-layer-freq {freq}\n"
    with pytest.raises(ValueError) as error:
        from_megatron_args(_write(tmp_path, "m.sh", args))
    assert str(error.value) == message


def test_megatron_moe_defaults_and_stray_flags(tmp_path: Path) -> None:
    args = f"pretrain_gpt.py {SHAPE} --num-experts 8 --moe-grouped-gemm\n"
    parallel = from_megatron_args(_write(tmp_path, "m.sh", args)).sections["parallel"]
    assert parallel["moe_token_dispatcher"] == "allgather"  # Megatron's default
    dense = f"pretrain_gpt.py {SHAPE} --moe-permute-fusion --expert-model-parallel-size 1\n"
    imported = from_megatron_args(_write(tmp_path, "m.sh", dense))
    assert "m.sh: --moe-permute-fusion without --num-experts (ignored)" in imported.warnings
    assert "moe_permute_fusion" not in imported.sections["parallel"]
    with pytest.raises(ValueError) as error:
        from_megatron_args(
            _write(tmp_path, "m.sh", f"pretrain_gpt.py {SHAPE} --expert-model-parallel-size 8\n")
        )
    assert str(error.value) == "m.sh: --expert-model-parallel-size 8 needs --num-experts"
    capacity = (
        f"pretrain_gpt.py {SHAPE} --num-experts 8 --moe-grouped-gemm "
        "--moe-expert-capacity-factor 1.25\n"
    )
    assert (
        "m.sh: --moe-expert-capacity-factor without --moe-pad-expert-input-to-capacity: priced "
        "as padded to capacity (static shapes, no host synchronisation)"
    ) in from_megatron_args(_write(tmp_path, "m.sh", capacity)).warnings


@pytest.mark.parametrize(
    "freq",
    [
        "'([1]*65536)*65536'",  # a 2^32-item list if evaluated
        "'[1]*65536*65536*65536'",
        "'" + "+".join(["[1]"] * 3000) + "'",  # deeper than Python's parser goes
        "'" + "(" * 300 + "[1]" + ")" * 300 + "'",
        "'²'",  # a digit to str.isdigit, not to int()
        "9" * 5000,
    ],
)
def test_oversized_megatron_moe_layer_freq_is_one_error_line(tmp_path: Path, freq: str) -> None:
    args = f"pretrain_gpt.py {SHAPE} --num-experts 8 --moe-layer-freq {freq}\n"
    with pytest.raises(ValueError) as error:
        from_megatron_args(_write(tmp_path, "m.sh", args))
    assert str(error.value).startswith("m.sh: --moe-layer-freq ")
    assert "must be an integer >= 1 or a list of 0s and 1s" in str(error.value)


def test_megatron_pad_to_capacity_needs_a_capacity_factor(tmp_path: Path) -> None:
    args = f"pretrain_gpt.py {SHAPE} --num-experts 8 --moe-pad-expert-input-to-capacity\n"
    with pytest.raises(ValueError) as error:
        from_megatron_args(_write(tmp_path, "m.sh", args))
    assert str(error.value) == (
        "m.sh: --moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (Megatron "
        "refuses it without one)"
    )


def test_torchtitan_qwen3_flavors_and_expert_parallel_degrees(tmp_path: Path) -> None:
    """torchtitan v0.2.2's qwen3 flavors map to the Qwen3 presets; expert_parallel_degree and
    expert_tensor_parallel_degree become ep and etp on an MoE model and, as torchtitan says,
    change nothing on a dense one."""
    moe = (
        '[model]\nname = "qwen3"\nflavor = "30B-A3B"\n[training]\nlocal_batch_size = 2\n'
        "seq_len = 4096\n[parallelism]\nexpert_parallel_degree = 8\n"
        "expert_tensor_parallel_degree = 1\n"
    )
    imported = from_torchtitan_toml(_write(tmp_path, "moe.toml", moe), world_size=16)
    assert imported.sections["model"]["preset"] == "qwen3-30b-a3b"
    assert (imported.sections["parallel"]["ep"], imported.sections["parallel"]["etp"]) == (8, 1)
    raw, _ = merge_sections({"cluster": {"node": "dgx-h100", "num_nodes": 2}}, imported)
    plan = _resolved(raw, 16)
    assert (plan.model.head_dim, plan.model.num_experts, plan.parallel.ep) == (128, 128, 8)
    dense = moe.replace('"30B-A3B"', '"8B"')
    imported = from_torchtitan_toml(_write(tmp_path, "dense.toml", dense), world_size=16)
    assert "ep" not in imported.sections["parallel"]
    assert any("expert_parallel_degree on the dense qwen3-8b" in w for w in imported.warnings)
    small = moe.replace('"30B-A3B"', '"0.6B"')
    imported = from_torchtitan_toml(_write(tmp_path, "small.toml", small), world_size=16)
    assert "preset" not in imported.sections["model"]
    assert any("model.flavor '0.6B' has no preset" in w for w in imported.warnings)


def test_a_misspelt_key_is_named_beside_the_one_it_misses(tmp_path: Path) -> None:
    """A key a letter or two from one the importer reads gets that name in its warning; a real
    key nobody models (``stage3_max_reuse_distance``) gets none."""
    ds = tmp_path / "ds.json"
    ds.write_text(
        json.dumps(
            {
                "train_batch_size": 64, "bf16": {"enabled": True}, "zero_optimisation": {},
                "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 1e9},
            }
        )
    )  # fmt: skip
    warnings = from_deepspeed_config(ds, world_size=8).warnings
    assert "ds.json: zero_optimisation (did you mean 'zero_optimization'?) is not modelled" in (
        " ".join(warnings)
    )
    assert "ds.json: zero_optimization.stage3_max_reuse_distance is not modelled (ignored)" in (
        warnings
    )
    args = tmp_path / "args.txt"
    args.write_text("--tensor-model-paralel-size 2\n")
    assert (
        "args.txt: --tensor-model-paralel-size (did you mean '--tensor-model-parallel-size'?) "
        "is not modelled (ignored)"
    ) in from_megatron_args(args).warnings
