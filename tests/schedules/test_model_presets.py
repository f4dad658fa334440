"""Model presets: the published parameter counts, overrides, and plans that name them."""

from __future__ import annotations

import pytest

from schedules.model_presets import MODEL_PRESETS, resolve_model_preset
from schedules.params import total_params
from schedules.plan import ModelConfig, load_plan

PUBLISHED_BILLIONS = {
    "llama2-7b": 6.74, "llama2-13b": 13.02, "llama2-70b": 68.98,
    "llama3-8b": 8.03, "llama3-70b": 70.55, "llama3-405b": 405.85,
    "mistral-7b": 7.24, "gpt3-175b": 174.6,
    "megatron-gpt-1.7b": 1.7, "megatron-gpt-3.6b": 3.6, "megatron-gpt-7.5b": 7.5,
    "megatron-gpt-18b": 18.4, "megatron-gpt-39b": 39.1, "megatron-gpt-76b": 76.1,
    "megatron-gpt-145b": 145.6, "megatron-gpt-310b": 310.1, "megatron-gpt-530b": 529.6,
    "megatron-gpt-1t": 1008.0,
}  # fmt: skip
"""Parameter counts the sources state (HF model cards and Narayanan et al. Table 1)."""


@pytest.mark.parametrize("name", sorted(PUBLISHED_BILLIONS))
def test_presets_have_their_published_parameter_counts(name: str) -> None:
    model = ModelConfig(**resolve_model_preset(name))
    # the sources round to 3-4 significant digits ("1.7B")
    assert total_params(model) / 1e9 == pytest.approx(PUBLISHED_BILLIONS[name], rel=0.01, abs=0.06)


def test_every_preset_names_its_source() -> None:
    assert all(source for _, source in MODEL_PRESETS.values())


def test_overrides_and_names() -> None:
    model = resolve_model_preset({"preset": "llama3-70b", "seq_len": 4096})
    assert (model["name"], model["seq_len"], model["num_kv_heads"]) == ("llama3-70b", 4096, 8)
    assert resolve_model_preset({"name": "x", "num_layers": 2}) == {"name": "x", "num_layers": 2}
    with pytest.raises(ValueError, match=r"model preset 'llama9' is unknown \(did you mean "):
        resolve_model_preset("llama9")


def test_a_plan_can_name_a_preset() -> None:
    plan = load_plan(
        {
            "model": "llama3-8b",
            "cluster": {"node": "dgx-h100"},
            "training": {"micro_batch_size": 1, "global_batch_size": 8},
        }
    )
    assert (plan.model.name, plan.model.num_layers, plan.model.vocab_size) == (
        "llama3-8b",
        32,
        128256,
    )
    custom = load_plan(
        {
            "model": {"preset": "llama3-8b", "num_layers": 4},
            "cluster": {"node": "dgx-h100"},
            "training": {"micro_batch_size": 1, "global_batch_size": 8},
        }
    )
    assert custom.model.num_layers == 4
