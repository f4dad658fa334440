"""The compute calibration: fitted kernel throughput curves per dtype, as versioned JSON.

A kernel family (GEMM, attention forward, attention backward) runs at
``rate(dims) = max_flops_per_s * prod(d / (d + dim_half) for d in dims)`` plus a fixed
``latency_s`` per kernel: small dimensions saturate the GPU less, large ones approach the
asymptote. ``fit_kernel`` fits the three numbers to measured (dims, FLOPs, seconds) samples
(``commbench --compute`` writes them); ``efficiency`` overrides the default fraction of the
spec's dense peak when only a scale is known (e.g. fitted on published step times).

    calibration = load_compute_calibration("compute.json")
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fileio.output import Target, write_text
from fileio.strict import did_you_mean, load_json, read_input, shorten

COMPUTE_SCHEMA = "commsim-compute/1"
"""Version tag of the compute calibration JSON."""
STEP_SCHEMA = "commbench-step/1"
"""Version tag of the step measurement JSON (``commbench --step``): the other file a compute
calibration is made from (``sim.replay.step_fit``, once the GPU is known)."""
LAUNCH_BOUND_IDLE = 0.08
"""Idle share of the unprofiled step (one minus the profiled kernels' busy time over the
measured step) from which a step calibration fits the host time per launch
(``sim.replay.step_fit``): below it the GPU was rarely waiting, the launches hid behind the
kernels, and the kernel model's own error (1.2-2.3 % on the H100 step sets' defaults, up
to 7 %) would be read as host time. Fitted at 3.5 % and 5.6 % idle, two eager steps gave 36 and
53 us per launch, where the launch-bound steps of the same machine gave 25-28, and mispredicted
other steps by up to 85 % (results/h100_heldout4). Not held out from those sets: 0.05, 0.08
and 0.15 were each scored on them; the H100 machine's 26 steps come out alike at 0.08 and 0.15
(3.0 %, max 11.8 %), and 0.08 was kept for the H200 machine's two steps at 9-10 % idle, whose
fits carry that machine's host (9.8 % against 10.3 % at 0.15)."""
KERNEL_KINDS = ("gemm", "attention_forward", "attention_backward")
"""Kernel families with a fitted curve."""
KERNEL_DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8")
"""Data types a kernel curve can be fitted in (those the GPU catalogue gives peaks for)."""
MEASUREMENT_KEYS = ("kind", "dtype", "dims", "flops", "time_s")
"""The fields of one raw sample in ``measurements`` (``commbench --compute``)."""
EFFICIENCY_KEYS = (*KERNEL_KINDS, "memory", "memory_elementwise", "memory_loss", "memory_copy")
"""Keys of ``ComputeCalibration.efficiency``."""
MIN_EFFICIENCY = 1e-3
"""Smallest fraction of peak accepted: below it kernel times reach 1e300 s and overflow."""
_DIM_HALF_GRID_POINTS = 241
"""dim_half values ``fit_kernel`` tries: a log grid from 1 to 16384 (numpy, imported by the fit
alone: a plan on default figures never loads it)."""

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelFit:
    """Throughput curve of one kernel family in one dtype."""

    max_flops_per_s: float
    """Asymptotic FLOP/s for large dimensions."""
    dim_half: float
    """Dimension at which one dimension's saturation factor d / (d + dim_half) is 1/2."""
    latency_s: float = 0.0
    """Fixed time per kernel (launch and tail)."""

    def __post_init__(self) -> None:
        numbers = (self.max_flops_per_s, self.dim_half, self.latency_s)
        finite = all(isinstance(x, int | float) and math.isfinite(x) for x in numbers)
        if not finite or not self.max_flops_per_s > 0 or self.dim_half < 0 or self.latency_s < 0:
            raise ValueError(
                f"kernel fit needs finite max_flops_per_s > 0, dim_half >= 0, latency_s >= 0; got "
                f"{self.max_flops_per_s}, {self.dim_half}, {self.latency_s}"
            )

    def saturation(self, dims: Sequence[float]) -> float:
        """prod(d / (d + dim_half)): the fraction of ``max_flops_per_s`` reached at these dims."""
        return math.prod(d / (d + self.dim_half) for d in dims)

    def time_s(self, flops: float, dims: Sequence[float]) -> float:
        """Seconds for a kernel of ``flops`` FLOPs with these dimensions."""
        return self.latency_s + flops / (self.max_flops_per_s * self.saturation(dims))

    def to_json(self) -> dict[str, float]:
        """JSON object of this fit."""
        return {
            "max_flops_per_s": self.max_flops_per_s,
            "dim_half": self.dim_half,
            "latency_s": self.latency_s,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeCalibration:
    """Fitted compute parameters for one device (``"schema": "commsim-compute/1"``)."""

    device: str = ""
    """Name of the measured device (e.g. torch.cuda.get_device_name), informational."""
    gpu: str = ""
    """Catalogue GPU key it applies to ('' for whatever GPU the plan uses)."""
    kernels: Mapping[str, Mapping[str, KernelFit]] = field(default_factory=dict, hash=False)
    """dtype -> kernel kind (``KERNEL_KINDS``) -> fitted curve."""
    efficiency: Mapping[str, float] = field(default_factory=dict, hash=False)
    """Overrides of the default fraction of peak per kind (``EFFICIENCY_KEYS``), all dtypes."""
    memory_bandwidth_bytes_per_s: float | None = None
    """Measured achievable memory bandwidth; None keeps spec x memory efficiency."""
    measurements: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    """The raw samples the fits came from (kind, dtype, dims, flops, time_s)."""
    time_scale: float = 1.0
    """Factor on every kernel time (``commsim fit``: fitted so that a plan's simulated step
    matches a measured one); 1 keeps the curves as they are."""
    fitted_on: str = ""
    """What ``time_scale`` was fitted on (plan, GPUs, measured step), informational."""
    overlap_slowdown: float | None = None
    """Compute slowdown while communication runs beside it (0.2: 20% longer); None for the
    default (``sim.compute.compute_model.DEFAULT_OVERLAP_SLOWDOWN``)."""
    in_step_slowdown: float | None = None
    """How much longer a kernel runs inside a training step than its curve says (0.2: 20%
    longer); None for the default of the GPU's generation
    (``sim.compute.compute_model.IN_STEP_SLOWDOWN``), which applies to the default curves and to
    ``commbench --compute``'s isolated measurements; fits to measured steps (``commbench
    --step``) write 0."""
    cpu_adam_params_per_s: float | None = None
    """Measured CPU Adam step rate of the whole host (parameters per second, every core;
    ``commbench --compute`` on the host): the CPU step of offloaded optimizers. None keeps the
    catalogue CPU's memory bandwidth."""
    optimizer_bytes_per_param: float | None = None
    """Bytes the optimizer step moves per parameter (Adam's states and master weights, the
    gradient and its casts), as measured; None: Adam's 26 plus the gradient's bytes."""
    host_s_per_launch: float | None = None
    """Host time to launch one kernel (framework dispatch, Python and the CUDA launch); None for
    the default (``sim.compute.compute_model.DEFAULT_HOST_S_PER_LAUNCH``)."""
    launches_per_kernel: float | None = None
    """Kernel launches the measured training loop makes per kernel of the modelled inventory
    (``schedules.kernels``); None for the stack's default
    (``sim.compute.compute_model.LAUNCHES_PER_KERNEL``)."""
    kernel_gap_s: float | None = None
    """GPU time between consecutive kernels while the host is ahead, as measured in a profiled
    step (``vocab.kernel_classes.kernel_gap_s``); None for the default
    (``sim.compute.compute_model.KERNEL_GAP_S``)."""

    def __post_init__(self) -> None:
        for dtype, kinds in self.kernels.items():
            if dtype not in KERNEL_DTYPES:
                raise ValueError(
                    f"compute calibration: unknown kernel dtype {shorten(dtype)}"
                    f"{did_you_mean(dtype, KERNEL_DTYPES)}; valid: {', '.join(KERNEL_DTYPES)}"
                )
            unknown = set(kinds) - set(KERNEL_KINDS)
            if unknown:
                raise ValueError(
                    f"compute calibration: unknown kernel kind {sorted(unknown)[0]!r} for "
                    f"{dtype}; valid: {', '.join(KERNEL_KINDS)}"
                )
        bandwidth = self.memory_bandwidth_bytes_per_s
        if bandwidth is not None and not (
            isinstance(bandwidth, int | float) and math.isfinite(bandwidth) and bandwidth > 0
        ):
            raise ValueError(
                f"compute calibration: memory_bandwidth_bytes_per_s must be a finite number > 0, "
                f"got {bandwidth}"
            )
        for key, value in self.efficiency.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if key not in EFFICIENCY_KEYS or not number or not MIN_EFFICIENCY <= value <= 1.5:
                raise ValueError(
                    f"compute calibration: efficiency {key}={shorten(value)} invalid; keys "
                    f"{', '.join(EFFICIENCY_KEYS)} with values in [{MIN_EFFICIENCY:g}, 1.5]"
                )
        try:
            _time_scale(self.time_scale)
        except ValueError as exc:
            raise ValueError(f"compute calibration: {exc}") from None
        adam = self.cpu_adam_params_per_s
        if adam is not None and not (
            isinstance(adam, int | float) and not isinstance(adam, bool) and 1e3 <= adam <= 1e14
        ):
            raise ValueError(
                f"compute calibration: cpu_adam_params_per_s must be a number in [1e3, 1e14], "
                f"got {shorten(adam)}"
            )
        for name, bounds in (
            ("host_s_per_launch", (0.0, 0.1)),
            ("launches_per_kernel", (0.1, 100)),
            ("optimizer_bytes_per_param", (1.0, 1000.0)),
            ("kernel_gap_s", (0.0, 1e-4)),
        ):
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and bounds[0] <= value <= bounds[1]
            ):
                raise ValueError(
                    f"compute calibration: {name} must be a number in [{bounds[0]:g}, "
                    f"{bounds[1]:g}], got {shorten(value)}"
                )
        in_step = self.in_step_slowdown
        if in_step is not None and not (
            isinstance(in_step, int | float) and not isinstance(in_step, bool) and 0 <= in_step <= 1
        ):
            raise ValueError(
                f"compute calibration: in_step_slowdown must be a number in [0, 1] (0.2: 20% "
                f"slower), got {shorten(in_step)}"
            )
        slowdown = self.overlap_slowdown
        if slowdown is not None and not (
            isinstance(slowdown, int | float)
            and not isinstance(slowdown, bool)
            and 0 <= slowdown <= MAX_OVERLAP_SLOWDOWN
        ):
            raise ValueError(
                f"compute calibration: overlap_slowdown must be a number in "
                f"[0, {MAX_OVERLAP_SLOWDOWN}] (0.2: 20% slower), got {slowdown!r}"
            )

    def kernel(self, kind: str, dtype: str) -> KernelFit | None:
        """The fitted curve for ``kind`` in ``dtype``, or None."""
        return self.kernels.get(dtype, {}).get(kind)

    def to_json(self) -> dict[str, Any]:
        """The JSON object (schema ``commsim-compute/1``)."""
        return {
            "schema": COMPUTE_SCHEMA,
            "device": self.device,
            "gpu": self.gpu,
            "kernels": {
                dtype: {kind: fit.to_json() for kind, fit in kinds.items()}
                for dtype, kinds in self.kernels.items()
            },
            "efficiency": dict(self.efficiency),
            "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s,
            "measurements": [dict(m) for m in self.measurements],
            "time_scale": self.time_scale,
            "fitted_on": self.fitted_on,
            "overlap_slowdown": self.overlap_slowdown,
            "in_step_slowdown": self.in_step_slowdown,
            "cpu_adam_params_per_s": self.cpu_adam_params_per_s,
            "optimizer_bytes_per_param": self.optimizer_bytes_per_param,
            "host_s_per_launch": self.host_s_per_launch,
            "launches_per_kernel": self.launches_per_kernel,
            "kernel_gap_s": self.kernel_gap_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ComputeCalibration:
        """Parse the JSON object; a wrong schema or unknown key is a ValueError."""
        if data.get("schema") != COMPUTE_SCHEMA:
            raise ValueError(
                f"compute calibration schema {data.get('schema')!r} is not {COMPUTE_SCHEMA!r}"
            )
        allowed = {"schema", *cls.__dataclass_fields__}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"compute calibration: unknown key {unknown[0]!r}")
        for name in ("device", "gpu", "fitted_on"):
            if not isinstance(data.get(name, ""), str):
                raise ValueError(
                    f"bad compute calibration: {name} must be text, got {shorten(data[name])}"
                )
        bandwidth = data.get("memory_bandwidth_bytes_per_s")
        if bandwidth is not None:
            bandwidth = _file_number("memory_bandwidth_bytes_per_s", bandwidth, (1e6, 1e16))
        measurements = _file_object(data, "measurements", [])
        if not isinstance(measurements, list) or not all(
            isinstance(m, Mapping) for m in measurements
        ):
            raise ValueError(
                f"bad compute calibration: measurements must be a list of objects, got "
                f"{shorten(measurements)}"
            )
        for index, sample in enumerate(measurements):
            if sorted(sample) != sorted(MEASUREMENT_KEYS):
                raise ValueError(
                    f"bad compute calibration: measurements[{index}] must have "
                    f"{', '.join(MEASUREMENT_KEYS)}, got {shorten(dict(sample))}"
                )
        return cls(
            device=data.get("device", ""),
            gpu=data.get("gpu", ""),
            kernels=_file_kernels(_file_object(data, "kernels", {})),
            efficiency=dict(_file_object(data, "efficiency", {})),
            memory_bandwidth_bytes_per_s=bandwidth,
            measurements=tuple(measurements),
            time_scale=_time_scale(data.get("time_scale", 1.0)),
            fitted_on=data.get("fitted_on", ""),
            overlap_slowdown=data.get("overlap_slowdown"),
            in_step_slowdown=data.get("in_step_slowdown"),
            cpu_adam_params_per_s=data.get("cpu_adam_params_per_s"),
            optimizer_bytes_per_param=data.get("optimizer_bytes_per_param"),
            host_s_per_launch=data.get("host_s_per_launch"),
            launches_per_kernel=data.get("launches_per_kernel"),
            kernel_gap_s=data.get("kernel_gap_s"),
        )


KERNEL_FIT_RANGES = {
    "max_flops_per_s": (1e6, 1e18),
    "dim_half": (0.0, 1e9),
    "latency_s": (0.0, 60.0),
}
"""Accepted values of a kernel fit read from a file: a megaflop/s (a slow CPU core) to an
exaflop/s (100x a B200's dense FP8), a minute per kernel; beyond them times overflow or the
file is a typo."""


def _file_number(where: str, value: Any, bounds: tuple[float, float]) -> float:
    """``value`` as a float when it is a JSON number within ``bounds``; ValueError otherwise."""
    low, high = bounds
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not low <= value <= high:
        raise ValueError(
            f"bad compute calibration: {where}={shorten(value)}; must be a number from {low:g} to "
            f"{high:g}"
        )
    return float(value)


def _file_object(data: Mapping[str, Any], key: str, default: Any) -> Any:
    """``data[key]`` (or ``default``), which must be a JSON object when the default is one."""
    value = data.get(key, default)
    if isinstance(default, dict) and not isinstance(value, Mapping):
        raise ValueError(f"bad compute calibration: {key} must be an object, got {shorten(value)}")
    return value


def _file_kernels(kernels: Mapping[str, Any]) -> dict[str, dict[str, KernelFit]]:
    """dtype -> kind -> ``KernelFit`` from the file's ``kernels`` object, every number checked."""
    parsed: dict[str, dict[str, KernelFit]] = {}
    for dtype, kinds in kernels.items():
        kinds = _file_object(kernels, dtype, {})
        parsed[dtype] = {}
        for kind, fit in kinds.items():
            where = f"kernels.{dtype}.{kind}"
            required = ("max_flops_per_s", "dim_half")
            if (
                not isinstance(fit, Mapping)
                or not set(fit) <= set(KERNEL_FIT_RANGES)
                or not set(required) <= set(fit)
            ):
                raise ValueError(
                    f"bad compute calibration: {where} must be an object with "
                    f"{', '.join(required)} (and latency_s), got {shorten(fit)}"
                )
            values = {
                name: _file_number(f"{where}.{name}", value, KERNEL_FIT_RANGES[name])
                for name, value in fit.items()
            }
            parsed[dtype][kind] = KernelFit(**values)
    return parsed


MAX_OVERLAP_SLOWDOWN = 2.0
"""Largest accepted overlap slowdown (3x slower compute); published figures are 0.1-0.4."""
TIME_SCALE_RANGE = (0.05, 20.0)
"""Accepted ``time_scale`` values: beyond them the file describes another machine or a typo."""


def _time_scale(value: Any) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    low, high = TIME_SCALE_RANGE
    if not number or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"time_scale must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def load_compute_calibration(path: str | Path) -> ComputeCalibration:
    """Read a compute calibration JSON file."""
    return _calibration_from_document(_read_document(path), path)


def load_compute_source(path: str | Path) -> ComputeCalibration | dict[str, Any]:
    """A compute calibration file, or a step measurement (``STEP_SCHEMA``: returned as its JSON
    object, to be fitted once the GPU is known); the file is read once and told by its schema."""
    data = _read_document(path)
    if isinstance(data, dict) and data.get("schema") == STEP_SCHEMA:
        return data
    return _calibration_from_document(data, path)


def _read_document(path: str | Path) -> Any:
    try:
        return load_json(read_input(path, what="compute calibration"), name=str(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc


def _calibration_from_document(data: Any, path: str | Path) -> ComputeCalibration:
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: a compute calibration must be a JSON object")
    try:
        return ComputeCalibration.from_json(data)
    except (TypeError, AttributeError) as exc:
        # A field of the wrong type (a string where a number or an object belongs).
        raise ValueError(f"{path}: bad compute calibration: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def save_compute_calibration(calibration: ComputeCalibration, target: Target | str | Path) -> None:
    """Write a compute calibration JSON file (sorted keys, so identical inputs give equal files)."""
    text = json.dumps(calibration.to_json(), indent=2, sort_keys=True)
    write_text(target, text + "\n")


def _fit_at(dims: np.ndarray, flops: np.ndarray, times: np.ndarray, dim_half: float) -> tuple:
    """Least-squares (relative error) latency and 1/rate for one dim_half; returns (cost, fit)."""
    import numpy as np

    saturation = np.prod(dims / (dims + dim_half), axis=1)
    work = flops / saturation / times  # coefficient of 1/rate, relative to the measured time
    ones = 1.0 / times  # coefficient of the latency
    solution, *_ = np.linalg.lstsq(np.stack([ones, work], axis=1), np.ones_like(times), rcond=None)
    latency, inverse_rate = float(solution[0]), float(solution[1])
    if latency < 0 or inverse_rate <= 0:
        latency, inverse_rate = 0.0, float(work.sum() / (work @ work))
    cost = float(np.sum((latency * ones + inverse_rate * work - 1.0) ** 2))
    return cost, KernelFit(
        max_flops_per_s=1.0 / inverse_rate, dim_half=float(dim_half), latency_s=latency
    )


def fit_kernel(samples: Sequence[tuple[Sequence[float], float, float]]) -> KernelFit:
    """Fit a ``KernelFit`` to (dims, flops, seconds) samples, minimising relative time error.

    For each dim_half on a fixed log grid (1 to 16384) the latency and 1/max rate solve a linear
    least-squares problem in closed form; the dim_half with the least error wins. Deterministic.
    """
    if not samples:
        raise ValueError("fit_kernel needs at least one sample")
    import numpy as np

    dims = np.array([list(d) for d, _, _ in samples], dtype=float)
    flops = np.array([f for _, f, _ in samples], dtype=float)
    times = np.array([t for _, _, t in samples], dtype=float)
    if np.any(times <= 0) or np.any(flops <= 0) or np.any(dims <= 0):
        raise ValueError("fit_kernel needs positive dims, FLOPs and times")
    if len(samples) < 3:  # too few points for a curve: a plain rate
        return _fit_at(dims, flops, times, 0.0)[1]
    grid = np.geomspace(1.0, 16384.0, _DIM_HALF_GRID_POINTS)
    fits = [_fit_at(dims, flops, times, dim_half) for dim_half in grid]
    return min(fits, key=lambda cost_fit: cost_fit[0])[1]
