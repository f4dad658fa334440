"""The hardware catalogue: datasheet figures, nominal vs effective, sources present."""

import dataclasses

import pytest

from topologies.hardware import (
    GPU_FAMILIES,
    GPUS,
    LINKS,
    NVSWITCHES,
    PRECISIONS,
    GPUSpec,
    gpu_family,
    lookup,
    peak_flops_per_s,
)


def test_contract_keys_present():
    assert {"h100-sxm", "h100-pcie", "h200", "a100-sxm-80gb", "a100-sxm-40gb", "cpu"} <= set(GPUS)
    assert {
        "nvlink3", "nvlink4", "pcie-gen4", "pcie-gen5", "ib-hdr", "ib-ndr", "ib-xdr",
        "roce-400g", "upi", "xgmi", "loopback",
    } <= set(LINKS)  # fmt: skip


def test_gpu_datasheet_figures():
    h100 = GPUS["h100-sxm"]
    assert h100.peak_flops_per_s["bf16"] == pytest.approx(989.4e12)
    assert h100.peak_flops_per_s["fp8"] == pytest.approx(2 * 989.45e12, rel=1e-3)
    assert h100.hbm_bandwidth_bytes_per_s == 3.35e12
    assert h100.hbm_bytes == 80 * 2**30
    assert GPUS["h200"].hbm_bytes == 141 * 2**30
    assert GPUS["h200"].hbm_bandwidth_bytes_per_s == 4.8e12
    assert GPUS["a100-sxm-80gb"].peak_flops_per_s["bf16"] == pytest.approx(312e12)
    assert GPUS["a100-sxm-80gb"].hbm_bandwidth_bytes_per_s == pytest.approx(2.0e12, rel=0.02)


def test_link_rates_per_direction():
    assert LINKS["nvlink4"].nominal_bandwidth_bytes_per_s == 18 * 25e9
    assert LINKS["nvlink4"].effective_bandwidth_bytes_per_s == pytest.approx(18 * 20.6e9)
    assert LINKS["nvlink3"].nominal_bandwidth_bytes_per_s == 12 * 25e9
    assert LINKS["pcie-gen4"].nominal_bandwidth_bytes_per_s == 32e9
    assert LINKS["pcie-gen5"].nominal_bandwidth_bytes_per_s == 64e9
    assert LINKS["pcie-gen5"].effective_bandwidth_bytes_per_s == 48e9
    for name, gbit in (("ib-hdr", 200), ("ib-ndr", 400), ("ib-xdr", 800), ("roce-400g", 400)):
        assert LINKS[name].nominal_bandwidth_bytes_per_s == gbit * 1e9 / 8
    assert 46e9 <= LINKS["ib-ndr"].effective_bandwidth_bytes_per_s <= 49e9


def test_every_figure_has_a_source_and_sane_values():
    for spec in (*GPUS.values(), *LINKS.values(), *NVSWITCHES.values()):
        assert spec.source
    for gpu in GPUS.values():
        assert set(gpu.peak_flops_per_s) <= set(PRECISIONS)
        assert gpu.hbm_bytes > 0 and gpu.hbm_bandwidth_bytes_per_s > 0
    for link in LINKS.values():
        assert 0 < link.effective_bandwidth_bytes_per_s <= link.nominal_bandwidth_bytes_per_s
        assert link.latency_s > 0
        assert link.kind in ("nvlink", "pcie", "network", "cpu_link", "loopback")


def test_nvswitch_generations():
    assert NVSWITCHES["nvswitch-gen3"].supports_nvls
    assert not NVSWITCHES["nvswitch-gen2"].supports_nvls


def test_specs_are_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        GPUS["h100-sxm"].hbm_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        GPUS["h100-sxm"].peak_flops_per_s["bf16"] = 1.0  # type: ignore[index]
    assert len({GPUS["h100-sxm"], GPUS["h200"]}) == 2


def test_peak_flops_unsupported_precision_names_valid_ones():
    assert peak_flops_per_s(GPUS["h100-sxm"], "fp8") > 0
    with pytest.raises(ValueError, match="no 'fp8' peak; it supports: bf16"):
        peak_flops_per_s(GPUS["a100-sxm-80gb"], "fp8")


def test_lookup_names_valid_keys():
    with pytest.raises(
        ValueError, match=r"unknown GPU 'h300' \(did you mean .*\); valid: a100-sxm"
    ):
        lookup(GPUS, "h300", "GPU")


def test_every_catalogue_gpu_names_its_family():
    families = {key: gpu.family for key, gpu in GPUS.items()}
    assert families == {
        "h100-sxm": "hopper",
        "h100-96gb-500w": "hopper",
        "h100-pcie": "hopper",
        "b200": "blackwell",
        "gb200": "blackwell",
        "h200": "hopper",
        "a100-sxm-80gb": "ampere",
        "a100-sxm-40gb": "ampere",
        "v100-sxm3-32gb": "volta",
        "cpu": "cpu",
    }
    assert set(families.values()) <= set(GPU_FAMILIES)
    # the name alone implies the same family for every real GPU of the catalogue
    assert all(gpu_family(key) == f for key, f in families.items() if key != "cpu")


def _custom(name: str, **family: str) -> GPUSpec:
    return GPUSpec(name=name, hbm_bytes=1.0, hbm_bandwidth_bytes_per_s=1.0,
                   peak_flops_per_s={"bf16": 1.0}, source="test", **family)  # fmt: skip


def test_custom_gpu_without_family_derives_it_from_its_name():
    assert _custom("H100 SXM").family == "hopper"
    assert _custom("gh200-480gb").family == "hopper"
    assert _custom("h800").family == "hopper"
    assert _custom("A800-80GB").family == "ampere"
    assert _custom("v100-pcie").family == "volta"
    assert _custom("mi300x").family == "other"
    assert _custom("h100-like", family="blackwell").family == "blackwell"


def test_custom_gpu_family_must_be_known():
    with pytest.raises(ValueError, match="GPU 'x': family='rdna'; valid: hopper, ampere"):
        _custom("x", family="rdna")
