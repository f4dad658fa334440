"""Offload: what DeepSpeed ZeRO-Offload / ZeRO-Infinity and FSDP's CPU offload move off the GPU.

Plan keys in the frameworks' vocabulary (``parallel.offload_*``): DeepSpeed's
``offload_optimizer.device`` and ``offload_param.device`` (``cpu`` or ``nvme``), their
``pin_memory`` and the NVMe ``pipeline_read`` / ``pipeline_write``; for ``fsdp`` / ``hsdp``,
``offload_param: cpu`` is FSDP2's ``CPUOffloadPolicy`` (FSDP1's
``CPUOffload(offload_params=True)``), which keeps the sharded parameters, their gradients and
the optimizer on the CPU together.

What moves, read from DeepSpeed v0.16.4 (commit 38327e07) and torch 2.13:

- ZeRO-1/2 (``stage_1_and_2.py``, ``cpu_offload``): the fp32 master partition (always pinned),
  the fp32 gradient partition and Adam's moments live on the CPU: 16 bytes per parameter of the
  rank's partition. Per reduced gradient bucket, the rank's slice is cast to fp32 on the GPU and
  copied to the CPU (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``), on the reduction
  stream when ``overlap_comm``, else on the compute stream. With gradient accumulation each
  micro-step first moves the bit16 slice (``async_accumulate_grad_in_cpu_via_gpu``: to the CPU on
  micro-step 0, back to the GPU on the later ones). The step runs DeepSpeedCPUAdam on the CPU,
  then copies the fp32 partition to the GPU (``fp32_partition.to(device)``) and casts it there,
  before the usual all-gather. On the GPU stay the bit16 weights, the gradient buckets and a
  ``largest parameter`` bit16 staging buffer; ZeRO-2's gradient partition is gone, ZeRO-1 keeps
  its full bit16 gradients (it reduces only at the accumulation boundary).
- ZeRO-3 (``stage3.py``): with ``offload_optimizer`` the fp32 parameters, gradients and moments
  are on the CPU (``cpu``) or on NVMe (``nvme``, ZeRO-Infinity: swapped through pinned buffers
  per sub-group, reading parameters, moments and gradients and writing back the first three), and
  the bit16 gradient partitions sit in a CPU buffer: each reduce-scatter's slice goes to the CPU,
  back to the GPU for its norm (``partition_grads``), and as fp32 to the CPU (or to NVMe) at the
  boundary. With ``offload_param`` the bit16 parameter partitions are on the CPU (or NVMe): each
  all-gather first copies the rank's partition to the GPU (after an NVMe read), and the step
  updates them on the CPU; without it the step copies the updated bit16 partition to the GPU.
- FSDP2 (``_fsdp_param.py``, ``_fsdp_collectives.py``) and FSDP1 (``_flat_param.py``,
  ``_runtime_utils.py``): the fp32 shard is copied to the GPU before every all-gather and cast
  there; after every reduce-scatter (HSDP: all-reduce) the gradient shard is cast to the
  parameter dtype (fp32) and copied to the CPU; FSDP2 adds it there into the gradient of the
  earlier micro-batches; the optimizer steps on the CPU tensors. Where the copies sit in the step
  is ``schedules.fsdp_offload``.

    per_param = gpu_state_bytes_per_param(offload_of(plan.parallel), {"weights": 2, ...})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from schedules.actions import Collective, ProgramBuilder
from schedules.plan import OFFLOAD_DEVICES

if TYPE_CHECKING:
    from schedules.plan import ParallelConfig, Plan
COPY_OPS = ("d2h", "h2d", "nvme_read", "nvme_write")
"""Program actions that move bytes between a GPU and its host (or the host's NVMe). Each runs on
a per-rank stream of its own name; the replay times it on the host's links."""
CPU_ADD = "cpu_add"
"""Program action of host work on a gradient (FSDP2 accumulating a micro-batch's shard into the
CPU gradient); its size is the host memory traffic, timed at the CPU optimizer's bandwidth."""
HOST_OPS = (*COPY_OPS, CPU_ADD)
"""Program actions that the host's copy engines or CPU run, not the GPU's SMs or the network."""
CPU_ADD_BYTES_PER_ELEM = 12.0
"""``grad._local_tensor += new_sharded_grad`` on fp32 CPU tensors: read both, write one."""
FP32_BYTES = 4.0
BIT16_BYTES = 2.0
CPU_ADAM_BYTES_PER_PARAM = 28.0
"""DeepSpeedCPUAdam (``csrc/adam/cpu_adam_impl.cpp``) and torch's fused CPU Adam per parameter:
read the fp32 parameter, gradient, momentum and variance (16 bytes), write back the parameter
and both moments (12 bytes). Memory-bound on any server CPU (a few FLOPs per 28 bytes)."""
CPU_UNSCALE_BYTES_PER_PARAM = 8.0
"""fp16 training: ``unscale_and_clip_grads`` divides the fp32 CPU gradients by the loss scale
(read and write 4 bytes each) before the step; bf16 has no loss scale."""
CPU_CAST_BYTES_PER_PARAM = 6.0
"""ZeRO-3 with parameters on the CPU: the step casts the fp32 partition into the bit16 one
there (read 4, write 2)."""
ZERO_SUB_GROUP_ELEMS = 1_000_000_000
"""DeepSpeed ``sub_group_size`` (config default 1e9): the tile of one optimizer swap."""
NVME_OPTIMIZER_BUFFERS = 4
"""DeepSpeed ``offload_optimizer.buffer_count`` (default 4): pinned swap buffers of one
sub-group's fp32 elements."""
NVME_PARAM_BUFFER_BYTES = 5 * 100_000_000 * BIT16_BYTES
"""DeepSpeed ``offload_param`` with nvme: ``buffer_count`` 5 x ``buffer_size`` 1e8 bit16
elements of pinned swap buffers per rank."""


def check_offload_devices(parallel: ParallelConfig) -> tuple[str, str] | None:
    """The offload keys name a device, and the offload knobs need an offload: the first
    offloaded (key, value), or None when nothing is offloaded. The data-parallel kind checks
    the rest (``schedules.data_parallel.registry.check_offload``)."""
    optimizer, param = parallel.offload_optimizer, parallel.offload_param
    for key, value in (("offload_optimizer", optimizer), ("offload_param", param)):
        if value not in OFFLOAD_DEVICES:
            raise ValueError(f"parallel.{key}={value!r} is not one of {', '.join(OFFLOAD_DEVICES)}")
    on = optimizer != "none" or param != "none"
    if not on:
        knobs = ("offload_pin_memory", "offload_pipeline_read", "offload_pipeline_write")
        for knob in knobs:
            if getattr(parallel, knob) not in (None, False):
                raise ValueError(
                    f"parallel.{knob} needs parallel.offload_optimizer or offload_param"
                )
        return None
    return ("offload_optimizer", optimizer) if optimizer != "none" else ("offload_param", param)


def check_offload_swaps(parallel: ParallelConfig) -> None:
    """ZeRO-Infinity's pipelined swaps need the optimizer on NVMe."""
    optimizer = parallel.offload_optimizer
    if (parallel.offload_pipeline_read or parallel.offload_pipeline_write) and optimizer != "nvme":
        raise ValueError(
            "parallel.offload_pipeline_read / offload_pipeline_write overlap NVMe swaps with CPU "
            f"Adam: they need offload_optimizer='nvme', got {optimizer!r}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Offload:
    """A plan's offload settings, resolved against the framework's defaults."""

    zero_stage: int
    """DeepSpeed ZeRO stage whose offload this is (1, 2: ZeRO-Offload; 3: ZeRO-Infinity); 0 for
    FSDP's CPU offload."""
    optimizer: str
    """Where optimizer states, fp32 master weights and gradients live: ``cpu`` or ``nvme``
    (FSDP: ``cpu``, implied by its parameter offload); ``none`` keeps them on the GPU."""
    param: str
    """Where the sharded bit16 (FSDP: fp32) parameters live: ``none``, ``cpu`` or ``nvme``."""
    pin_memory: bool
    """Page-locked host buffers (DeepSpeed default False, FSDP default True)."""
    pipeline_read: bool = False
    """ZeRO-Infinity overlaps the next sub-group's NVMe read with the current step."""
    pipeline_write: bool = False
    """ZeRO-Infinity overlaps the previous sub-group's NVMe write with the current step."""
    fsdp2: bool = False
    """FSDP's offload is FSDP2's ``CPUOffloadPolicy`` (False: FSDP1's ``CPUOffload``)."""

    @property
    def fsdp(self) -> bool:
        """FSDP's CPU offload rather than DeepSpeed's."""
        return self.zero_stage == 0


def gpu_state_bytes_per_param(
    offload: Offload | None, per_param: dict[str, float]
) -> dict[str, float]:
    """Weights, gradients and optimizer bytes per parameter that stay on the GPU.

    ``per_param`` is the kind's sharded figure without offload. DeepSpeed moves the optimizer
    state and the gradient partition off with ``offload_optimizer`` (ZeRO-1 keeps its full
    bit16 gradients, reduced only at the boundary) and the bit16 partition with
    ``offload_param``; FSDP's offload moves all three.
    """
    if offload is None:
        return dict(per_param)
    out = dict(per_param)
    if offload.optimizer != "none":
        out["optimizer"] = 0.0
        if offload.zero_stage != 1:
            out["gradients"] = 0.0
    if offload.param != "none":
        out["weights"] = 0.0
    return out


def largest_param_elems(plan: Plan) -> float:
    """Elements of the largest parameter tensor on one GPU: the vocab-parallel embedding or LM
    head, or one MLP matrix (DeepSpeed sizes its offload staging buffers by it)."""
    model, tp = plan.model, plan.parallel.tp
    mlp = model.hidden_size * max(model.ffn_hidden_size, model.moe_ffn_hidden_size) / tp
    return max(model.vocab_size * model.hidden_size / tp, mlp)


def gpu_offload_buffer_bytes(offload: Offload | None, plan: Plan) -> float:
    """GPU buffers that offload adds: ZeRO-1/2's bit16 ``temp_grad_buffer_for_gpu_offload`` of
    the largest parameter's size; nothing lasting for ZeRO-3 and FSDP."""
    if offload is None or offload.zero_stage not in (1, 2):
        return 0.0
    return largest_param_elems(plan) * BIT16_BYTES


def host_bytes(
    offload: Offload | None, plan: Plan, *, params: float, shards: int, num_micro: int
) -> dict[str, float]:
    """Host (CPU RAM) bytes of one rank holding ``params`` parameters sharded over ``shards``.

    Components: ``fp32_params``, ``fp32_grads``, ``optimizer`` (Adam's moments), ``bit16``
    (bit16 parameter or gradient partitions on the CPU) and ``buffers`` (staging and NVMe swap
    buffers). Zero for a plan without offload.
    """
    keys = ("fp32_params", "fp32_grads", "optimizer", "bit16", "buffers")
    out = dict.fromkeys(keys, 0.0)
    if offload is None:
        return out
    part = params / shards
    if offload.optimizer == "cpu":
        out["fp32_params"] = FP32_BYTES * part
        out["fp32_grads"] = FP32_BYTES * part
        out["optimizer"] = 2 * FP32_BYTES * part
    if offload.zero_stage in (1, 2):
        if num_micro > 1:
            out["bit16"] += BIT16_BYTES * part  # accumulated_grads_in_cpu
        out["buffers"] += largest_param_elems(plan) * BIT16_BYTES
    if offload.zero_stage == 3 and offload.optimizer != "none":
        out["bit16"] += BIT16_BYTES * part  # grad_partitions_flat_buffer
    if offload.optimizer == "nvme":
        tile = min(float(ZERO_SUB_GROUP_ELEMS), part)
        out["buffers"] += NVME_OPTIMIZER_BUFFERS * tile * FP32_BYTES
    if offload.param == "cpu" and not offload.fsdp:
        out["bit16"] += BIT16_BYTES * part
    if offload.param == "nvme":
        out["buffers"] += NVME_PARAM_BUFFER_BYTES
    return out


def nvme_bytes(offload: Offload | None, *, params: float, shards: int) -> float:
    """NVMe bytes of one rank: fp32 parameters, moments and gradients (optimizer on NVMe, 16 per
    parameter) and the bit16 partition (parameters on NVMe)."""
    if offload is None:
        return 0.0
    part = params / shards
    optimizer = 4 * FP32_BYTES * part if offload.optimizer == "nvme" else 0.0
    return optimizer + (BIT16_BYTES * part if offload.param == "nvme" else 0.0)


Copy = tuple[str, float]
"""One host transfer: (op from ``COPY_OPS``, bytes)."""


def grad_copies(
    offload: Offload,
    *,
    reduced_bytes: float,
    grad_bytes: float,
    shards: int,
    microbatch: int,
    num_micro: int,
) -> tuple[Copy, ...]:
    """The host transfers after one gradient reduction of ``reduced_bytes`` (``grad_bytes`` per
    element; an all-reduced bucket for ZeRO-1/2, a reduce-scattered one for ZeRO-3 and FSDP) on
    micro-batch ``microbatch`` of ``num_micro``, in the order the framework issues them.

    FSDP casts the reduced shard to the parameter dtype (fp32) before copying it (FSDP2
    ``foreach_reduce``, FSDP1 ``_cast_grad_to_param_dtype``); FSDP2 then adds it into the CPU
    gradient of the earlier micro-batches (``CPU_ADD``)."""
    if offload.optimizer == "none":
        return ()
    # ZeRO-1/2 all-reduce the whole bucket and copy their partition's slice; ZeRO-3 and FSDP
    # reduce-scatter it and copy their output: 1/shards of the bucket either way.
    elems = reduced_bytes / grad_bytes / shards
    last = microbatch == num_micro - 1
    if offload.fsdp:
        add = ((CPU_ADD, elems * CPU_ADD_BYTES_PER_ELEM),) if offload.fsdp2 and microbatch else ()
        return (("d2h", elems * FP32_BYTES), *add)
    copies: list[Copy] = []
    if offload.zero_stage in (1, 2):
        if num_micro > 1:
            first = microbatch == 0 and offload.zero_stage == 2
            copies.append(("d2h" if first else "h2d", elems * BIT16_BYTES))
        if last:
            copies.append(("d2h", elems * FP32_BYTES))
        return tuple(copies)
    # ZeRO-3 partition_grads: into the CPU buffer and back (micro-step 0), or back, add, out.
    copies += [("d2h", elems * grad_bytes), ("h2d", elems * grad_bytes)]
    if microbatch > 0:
        copies.reverse()
    if last:
        copies.append(("d2h", elems * FP32_BYTES))
        if offload.optimizer == "nvme":
            copies.append(("nvme_write", elems * FP32_BYTES))  # swap_out_gradients
    return tuple(copies)


def fetch_copies(offload: Offload, *, gathered_bytes: float, shards: int) -> tuple[Copy, ...]:
    """The host transfers before one parameter all-gather of ``gathered_bytes`` (bit16 output):
    the rank's partition from NVMe and to the GPU (ZeRO-3), the fp32 shard (FSDP)."""
    if offload.param == "none":
        return ()
    part = gathered_bytes / shards
    if offload.fsdp:
        return (("h2d", part * FP32_BYTES / BIT16_BYTES),)
    reads: tuple[Copy, ...] = (("nvme_read", part),) if offload.param == "nvme" else ()
    return (*reads, ("h2d", part))


def step_copies(offload: Offload, *, params: float, shards: int) -> tuple[Copy, ...]:
    """The host transfers after the CPU step: ZeRO-1/2 copy the fp32 partition to the GPU;
    ZeRO-3 copies the bit16 partition there when the parameters live on the GPU (cast on the
    CPU), or writes it to NVMe when they live there; FSDP updates its CPU shards in place."""
    part = params / shards
    if offload.fsdp or offload.optimizer == "none":
        return ()
    if offload.zero_stage in (1, 2):
        return (("h2d", part * FP32_BYTES),)
    if offload.param == "none":
        return (("h2d", part * BIT16_BYTES),)
    return (("nvme_write", part * BIT16_BYTES),) if offload.param == "nvme" else ()


def cpu_step_bytes(offload: Offload, *, params: float, shards: int, precision: str) -> float:
    """Host memory traffic of the CPU optimizer step of one rank: Adam, the fp16 unscale and
    ZeRO-3's cast of the parameters kept on the CPU."""
    part = params / shards
    per_param = CPU_ADAM_BYTES_PER_PARAM
    if precision == "fp16" and not offload.fsdp:
        per_param += CPU_UNSCALE_BYTES_PER_PARAM
    if offload.zero_stage == 3 and offload.param != "none":
        per_param += CPU_CAST_BYTES_PER_PARAM
    return part * per_param


def nvme_step_bytes(offload: Offload, *, params: float, shards: int) -> tuple[float, float]:
    """(read, write) NVMe bytes of the optimizer step of one rank (ZeRO-Infinity
    ``swap_in_optimizer_state`` reads parameters, moments and gradients; ``swap_out`` writes
    back the first three)."""
    if offload.optimizer != "nvme":
        return 0.0, 0.0
    part = params / shards
    return 4 * FP32_BYTES * part, 3 * FP32_BYTES * part


def nvme_step_s(offload: Offload, *, read_s: float, cpu_s: float, write_s: float) -> float:
    """The step's time from its NVMe read, CPU and NVMe write times, overlapped as
    ``pipeline_read`` / ``pipeline_write`` say (sub-group by sub-group; the first read and the
    last write are not hidden, which is small against many sub-groups and left out)."""
    if offload.pipeline_read and offload.pipeline_write:
        return max(read_s, cpu_s, write_s)
    if offload.pipeline_read:
        return max(read_s, cpu_s) + write_s
    if offload.pipeline_write:
        return read_s + max(cpu_s, write_s)
    return read_s + cpu_s + write_s


def add_copies(
    b: ProgramBuilder,
    label: str,
    copies: tuple[Copy, ...],
    deps: tuple[int, ...],
    *,
    phase: str = "",
) -> int | None:
    """Append ``copies`` one after another (each on its own stream, after the one before);
    returns the last one's index (None when there are none). ``phase="optimizer"`` counts a
    wait on them with the optimizer step."""
    last: int | None = None
    for op, size in copies:
        if size <= 0:
            continue
        last = b.add(
            Collective(
                name=f"{op} {label}",
                group=op,
                ranks=(b.rank,),
                op=op,
                size_bytes=size,
                deps=deps if last is None else (last,),
                phase=phase,
            )
        )
    return last


@dataclass(frozen=True, slots=True, kw_only=True)
class RankOffload:
    """What one rank's step program needs to place its host copies."""

    offload: Offload
    """The plan's offload."""
    shards: int
    """Ranks the states are partitioned over (ZeRO's partition group, FSDP's shard group)."""
    grad_bytes: float
    """Bytes per element of a reduced gradient bucket."""
    num_micro: int
    """Micro-batches per step."""
    params: float
    """The rank's parameters before data-parallel sharding."""

    def bucket(self, reduced_bytes: float, microbatch: int) -> tuple[Copy, ...]:
        """Copies after a gradient reduction of ``reduced_bytes`` on ``microbatch``."""
        return grad_copies(
            self.offload,
            reduced_bytes=reduced_bytes,
            grad_bytes=self.grad_bytes,
            shards=self.shards,
            microbatch=microbatch,
            num_micro=self.num_micro,
        )

    def fetch(self, gathered_bytes: float) -> tuple[Copy, ...]:
        """Copies before a parameter all-gather of ``gathered_bytes``."""
        return fetch_copies(self.offload, gathered_bytes=gathered_bytes, shards=self.shards)

    def step(self) -> tuple[Copy, ...]:
        """Copies after the CPU optimizer step."""
        return step_copies(self.offload, params=self.params, shards=self.shards)

    def blocks_host(self, microbatch: int) -> bool:
        """Whether the host waits for the gradient copies of ``microbatch`` before issuing more
        work: FSDP2 copies ``non_blocking`` only into pinned memory with no CPU gradient to add
        into yet (``foreach_reduce``); FSDP1 and DeepSpeed never block there."""
        offload = self.offload
        return offload.fsdp2 and (not offload.pin_memory or microbatch > 0)


def rank_offload(
    offload: Offload | None, *, params: float, shards: int, num_micro: int, grad_bytes: float
) -> RankOffload | None:
    """A rank's ``RankOffload``, or None when the plan offloads nothing."""
    if offload is None:
        return None
    return RankOffload(
        offload=offload,
        shards=shards,
        grad_bytes=grad_bytes,
        num_micro=num_micro,
        params=params,
    )
