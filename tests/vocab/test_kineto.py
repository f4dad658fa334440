"""Reading torch.profiler traces: the shipped H100 traces, hand-made ones with exact timelines,
a CPU trace made here with torch.profiler, and the bad files that get one-line errors."""

from __future__ import annotations

import gzip
import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from vocab.kineto import load_trace, training_step
from vocab.trace_summary import collective_name, gemm_shape, read_step

TRACES = Path(__file__).resolve().parents[2] / "refdata" / "h100" / "traces"
CASES = ("llama1b-s4096-b2", "llama1b-s4096-b2-compiled", "small-h1024-s1024-b4")


def _raw(case: str) -> dict[str, Any]:
    with gzip.open(TRACES / f"trace_{case}.json.gz") as handle:
        return json.load(handle)


@pytest.mark.parametrize("case", CASES)
def test_the_shipped_traces_give_every_kernel_of_their_one_step(case: str) -> None:
    events = _raw(case)["traceEvents"]
    marker = next(
        e for e in events if e.get("name") == "ProfilerStep#1" and e["cat"] == "user_annotation"
    )
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    launched = {e["args"]["correlation"] for e in gpu}
    launches = [
        e for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
        and e["args"].get("correlation") in launched
    ]  # fmt: skip
    step = read_step(TRACES / f"trace_{case}.json.gz")
    assert step.marker == "ProfilerStep#1"
    assert step.num_kernels == len(gpu) and step.num_launches == len(launches)
    end = max(marker["ts"] + marker["dur"], *(e["ts"] + e["dur"] for e in gpu))
    assert step.wall_s == pytest.approx((end - marker["ts"]) * 1e-6)
    assert sum(step.classes_s.values()) == pytest.approx(sum(e["dur"] for e in gpu) * 1e-6)
    assert step.busy_s <= sum(step.classes_s.values()) + 1e-12
    assert step.busy_s <= sum(step.phases_s.values()) + 1e-12 < step.wall_s
    assert all(step.phases_s[phase] > 0 for phase in ("forward", "backward", "optimizer"))
    assert step.unplaced == 0 and step.collectives == {}


def test_the_small_trace_records_every_gemm_shape() -> None:
    step = read_step(TRACES / "trace_small-h1024-s1024-b4.json.gz")
    # 8 layers x 4 weight GEMMs + the LM head, each forward, input and weight gradient, 4 times
    assert step.num_gemm_calls == len(step.gemm_shapes) == (8 * 4 + 1) * 3 * 4
    assert (4096, 32000, 1024) in step.gemm_shapes  # the LM head: 4 x 1024 tokens, vocab 32000
    assert step.classes_s["other"] == 0.0  # unnamed kernels take their operator's class


def _event(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def _synthetic(*, markers: bool = True, nccl: bool = False, training: bool = True) -> dict:
    """Two steps 1000 us apart: a forward GEMM, a backward GEMM launched by autograd on thread
    2 (with an all-reduce), an AdamW step, a synchronize; each GPU op 20 us, 10 us after launch."""
    events = []
    ids = iter(range(1, 1000))

    def launch(ts: float, tid: int, kernel: str, **args: Any) -> None:
        c = next(ids)
        events.append(_event("cuda_runtime", "cudaLaunchKernel", ts, 2, tid, correlation=c))
        events.append(_event("kernel", kernel, ts + 10, 20, 7, correlation=c, **args))

    for index, start in enumerate((0, 1000)):
        if markers:
            events.append(_event("user_annotation", f"ProfilerStep#{index}", start, 900))
        launch(start + 10, 1, "sm90_xmma_gemm_bf16bf16_bf16f32")
        if training:
            events.append(_event("cpu_op", "autograd::engine::evaluate_function: MmBackward0",
                                 start + 100, 200, tid=2))  # fmt: skip
            launch(start + 150, 2, "sm90_xmma_gemm_bf16bf16_bf16f32")
            if nccl:
                launch(start + 200, 2, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)",
                       **{"Collective name": "allreduce", "In msg nelems": 1000,
                          "dtype": "BFloat16"})  # fmt: skip
            events.append(_event("user_annotation", "Optimizer.step#AdamW.step", start + 600, 100))
            launch(start + 620, 1, "multi_tensor_apply_kernel<adam>")
        events.append(_event("cuda_runtime", "cudaDeviceSynchronize", start + 800, 50))
    return {
        "traceEvents": events,
        "distributedInfo": {"rank": 1, "world_size": 2},
        "deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}],
    }


def _write(tmp_path: Path, trace: dict, name: str = "trace.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(trace))
    return path


def test_a_hand_made_trace_gives_its_last_step_exactly(tmp_path: Path) -> None:
    step = read_step(_write(tmp_path, _synthetic(nccl=True)))
    assert (step.marker, step.rank, step.world_size) == ("ProfilerStep#1", 1, 2)
    assert step.wall_s == pytest.approx(900e-6)  # the marker's span: the GPU ended before it
    assert step.busy_s == pytest.approx(80e-6) and step.idle_s == pytest.approx(820e-6)
    assert dict(step.phases_s) == pytest.approx(
        {"forward": 20e-6, "backward": 40e-6, "optimizer": 20e-6}
    )
    assert step.classes_s["gemm"] == pytest.approx(40e-6)
    assert step.classes_s["communication"] == pytest.approx(20e-6)
    assert step.num_kernels == step.num_launches == 4
    assert step.host_s == pytest.approx(850e-6)  # the 50 us synchronize is not launch work
    assert step.communication_only_s == pytest.approx(20e-6)
    (op, kernels), = step.collectives.items()  # fmt: skip
    assert (op, kernels.count, kernels.size_bytes) == ("all_reduce", 1, 2000.0)


def test_without_markers_the_step_lies_between_the_optimizer_steps(tmp_path: Path) -> None:
    step = read_step(_write(tmp_path, _synthetic(markers=False)))
    assert step.marker == "optimizer steps"
    assert step.wall_s == pytest.approx(1000e-6)  # from the end of one Optimizer.step to the next
    assert step.num_kernels == 3


def test_helpers_read_shapes_and_collective_names() -> None:
    assert gemm_shape("aten::mm", [[8192, 2048], [2048, 3072]]) == (8192, 3072, 2048)
    assert gemm_shape("aten::linear", [[2, 4096, 1024], [3072, 1024], [3072]]) == (8192, 3072, 1024)
    assert gemm_shape("aten::mm", [[128256, 8192], [8192, 2048], [128256, 2048]]) == (
        128256, 2048, 8192
    )  # fmt: skip
    assert gemm_shape("aten::bmm", [[8, 64, 32], [8, 32, 64]]) is None
    assert gemm_shape("aten::mm", [[4, 8], [9, 2]]) is None  # inner sizes disagree
    assert collective_name("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", {}) == "all_gather"
    assert collective_name("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", {}) == "send_recv"
    assert collective_name("x", {"Collective name": "_reduce_scatter_base"}) == "reduce_scatter"


@pytest.fixture(scope="module")
def cpu_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny model's two training steps and one inference step, profiled on CPU here."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    folder = tmp_path_factory.mktemp("cpu_traces")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 16), torch.randint(0, 8, (4,))

    def profiled(name: str, steps: int, step: Any) -> Path:
        path = folder / f"{name}.json"
        with (
            warnings.catch_warnings(),
            profile(
                activities=[ProfilerActivity.CPU],
                record_shapes=True,
                schedule=schedule(wait=0, warmup=1, active=steps),
                on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
            ) as prof,
        ):
            warnings.simplefilter("ignore")  # the profiler's notes on cycles
            for _ in range(steps + 1):
                step()
                prof.step()
        return path

    def train() -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    def infer() -> None:
        with torch.no_grad():
            model(x)

    return {"train": profiled("train", 2, train), "inference": profiled("inference", 1, infer)}


def test_a_cpu_trace_is_summed_from_its_operators(cpu_traces: dict[str, Path]) -> None:
    raw = json.loads(cpu_traces["train"].read_text())["traceEvents"]
    marker = max((e for e in raw if str(e.get("name")).startswith("ProfilerStep#")),
                 key=lambda e: e["ts"])  # fmt: skip
    inside = [
        e for e in raw
        if e.get("cat") == "cpu_op" and marker["ts"] <= e["ts"] < marker["ts"] + marker["dur"]
    ]  # fmt: skip
    step = read_step(cpu_traces["train"], device="cpu")
    assert step.marker == marker["name"] == "ProfilerStep#2"
    assert step.work == "CPU operators" and step.num_launches == 0
    assert step.num_kernels == sum(1 for e in inside if e["name"].startswith("aten::"))
    assert all(step.phases_s[phase] > 0 for phase in ("forward", "backward", "optimizer"))
    # two Linear layers: forward addmm (4 x 16 -> 32, 4 x 32 -> 8) and their backward mm calls
    assert {(4, 32, 16), (4, 8, 32)} <= set(step.gemm_shapes)
    assert step.num_gemm_calls == sum(1 for e in inside if e["name"] in ("aten::addmm", "aten::mm"))


def test_bad_traces_get_one_line_errors(tmp_path: Path, cpu_traces: dict[str, Path]) -> None:
    (tmp_path / "x.json").write_text("hello")
    cases = {
        "is not JSON": tmp_path / "x.json",
        "truncated or corrupt gzip": tmp_path / "cut.json.gz",
        "no traceEvents": _write(tmp_path, {"schemaVersion": 1}, "empty.json"),
        "no GPU kernels": cpu_traces["train"],
        "it has no backward (autograd) work and no optimizer step: a trace of inference": _write(
            tmp_path, _synthetic(training=False), "inference.json"
        ),
    }
    cut = (TRACES / "trace_small-h1024-s1024-b4.json.gz").read_bytes()[:5000]
    (tmp_path / "cut.json.gz").write_bytes(cut)
    for message, path in cases.items():
        with pytest.raises(ValueError, match=re.escape(message)) as error:
            read_step(path)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="no whole training step: it has no backward"):
        read_step(cpu_traces["inference"], device="cpu")
    with pytest.raises(FileNotFoundError, match="trace not found"):
        load_trace(tmp_path / "missing.json")


def test_the_step_finder_names_a_missing_optimizer_step(tmp_path: Path) -> None:
    trace = _synthetic()
    trace["traceEvents"] = [
        e for e in trace["traceEvents"] if "Optimizer" not in e["name"] and "adam" not in e["name"]
    ]
    with pytest.raises(ValueError, match="no optimizer step"):
        training_step(load_trace(_write(tmp_path, trace)))
