"""What commbench says about each rank's device, as nccl-tests prints it."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from comm_bench.dist_env import bus_id
from vocab.nccl_table import run_header


def test_a_gpu_is_named_by_its_pci_location(monkeypatch):
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x18, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    # util.cu writeDeviceReport: "[%04x:%02x:%02x]" of pciDomainID, pciBusID, pciDeviceID
    assert bus_id(torch.device("cuda", 3)) == "0000:18:00"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace())
    assert bus_id(torch.device("cuda", 0)) is None  # a torch without the fields: cuda:0
    assert bus_id(torch.device("cpu")) is None


def test_the_device_rows_use_the_location_where_known():
    env = {
        "commbench_version": "1", "torch_version": "2", "nccl_version": "2.27.7",
        "backend": "nccl", "world_size": 2, "num_nodes": 1, "ranks_per_node": 2, "host": "h",
        "devices": [
            {"rank": 0, "local_rank": 0, "pid": 7, "host": "h", "device": "cuda:0",
             "bus_id": "0000:18:00", "device_name": "NVIDIA H100 80GB HBM3"},
            {"rank": 1, "local_rank": 1, "pid": 8, "host": "h", "device": "cuda:1",
             "bus_id": None, "device_name": "NVIDIA H100 80GB HBM3"},
        ],
    }  # fmt: skip
    config = {
        "min_bytes": 8, "max_bytes": 64, "step_factor": 2, "step_bytes": 0,
        "warmup_iters": 5, "iters": 20, "check_iters": 1, "average": "mean",
    }  # fmt: skip
    lines = run_header(env, config, "all_reduce")
    assert lines[1] == "# Collective test starting: all_reduce_perf"
    assert lines[-2] == (
        "#  Rank  0 Group  0 Pid      7 on          h device  0 [0000:18:00] NVIDIA H100 80GB HBM3"
    )
    assert "[cuda:1]" in lines[-1]
