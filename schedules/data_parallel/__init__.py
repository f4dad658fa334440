"""Data-parallel kinds, one module each, found through one registry.

Each module (``ddp``, ``zero`` for DeepSpeed ZeRO-1/2, ``zero3``, ``fsdp`` for torch FSDP1 and
FSDP2, ``hsdp``, ``distributed_optimizer``) defines one ``DataParallelKind`` (``spec``): the
framework knobs it owns, its checks, which states it shards, its gradient bytes, its buckets,
its gradient sync under pipelining, its memory buffers, its offload and which program builder
replays it. ``registry`` maps the plan's ``parallel.data_parallel`` names to them; nothing
outside this package compares that name. docs/data-parallel-kinds.md walks through adding one.

    from schedules.data_parallel.registry import data_parallel_kind
    data_parallel_kind(plan.parallel).grad_bytes(plan.parallel)
"""
