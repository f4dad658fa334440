"""Which transformer layers each pipeline stage holds: even splits, Megatron's uneven ones, lists.

Three ways to say it, as the frameworks do:

- even (the default): L / (p v) layers per virtual stage;
- Megatron-LM's ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
  (``parallel.first_stage_layers`` / ``last_stage_layers``): the first and/or last pipeline rank
  get the given counts and the other ranks split the rest evenly; and
  ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``
  (``parallel.embedding_as_layer`` / ``loss_as_layer``): the input embedding and the loss each
  count as one layer of the even split over the virtual stages, so the first (last) virtual
  stage holds one transformer layer fewer (Llama 3 405B: 126 layers + embedding + loss = 128
  = 32 virtual stages x 4 over PP16 with 2 chunks);
- an explicit list (``parallel.pipeline_layers``, torchtitan's per-stage split): one count per
  pipeline rank, or per virtual stage (p v entries, in virtual-stage order ``chunk * p + rank``).

With v > 1 chunks and per-rank counts, a rank's layers are split evenly over its chunks.
Counts of virtual stages are indexed ``chunk * p + rank``, the order the model flows through.

    chunk_layers(plan.parallel, plan.model.num_layers)   # (8, 8, ..., 8) for 128 layers, pp16
"""

from __future__ import annotations

from schedules.plan import ParallelConfig


def _split(total: int, parts: int, what: str) -> list[int]:
    if parts <= 0:
        return []
    if total % parts:
        raise ValueError(f"{what}: {total} layers do not split evenly over {parts}")
    return [total // parts] * parts


def _uneven(parallel: ParallelConfig) -> bool:
    return (
        parallel.pipeline_layers is not None
        or parallel.first_stage_layers is not None
        or parallel.last_stage_layers is not None
        or parallel.embedding_as_layer
        or parallel.loss_as_layer
    )


def recomputed_layers(parallel: ParallelConfig, layers: int) -> int:
    """How many of a pipeline chunk's ``layers`` are recomputed: all of them under full
    recompute (Megatron's block method: the first ``recompute_num_layers``), none otherwise
    (selective and per-op recompute apply to parts of every layer)."""
    if parallel.recompute != "full":
        return 0
    count = parallel.recompute_num_layers
    return layers if count is None else min(count, layers)


def recomputed_fraction(parallel: ParallelConfig, layers: tuple[int, ...]) -> float:
    """Share of the layers of ``layers`` (chunks' layer counts) that full recompute reruns."""
    total = sum(layers)
    return sum(recomputed_layers(parallel, n) for n in layers) / total if total else 0.0


def chunk_layers(parallel: ParallelConfig, num_layers: int) -> tuple[int, ...]:
    """Transformer layers of each virtual stage, indexed ``chunk * pp + rank``."""
    p, v = parallel.pp, parallel.vpp
    explicit = parallel.pipeline_layers
    if explicit is not None and len(explicit) == p * v:
        return tuple(explicit)
    first, last = parallel.first_stage_layers, parallel.last_stage_layers
    if explicit is None and first is None and last is None:
        # Even over the virtual stages, the embedding and the loss taking a layer's place.
        extra_first = 1 if parallel.embedding_as_layer else 0
        extra_last = 1 if parallel.loss_as_layer else 0
        slots = _split(num_layers + extra_first + extra_last, p * v, "parallel.pp*vpp")
        slots[0] -= extra_first
        slots[-1] -= extra_last
        return tuple(slots)
    if explicit is not None:
        per_rank = list(explicit)
    else:
        head = [] if first is None else [first]
        tail = [] if last is None or p == 1 else [last]
        middle_ranks = p - len(head) - len(tail)
        rest = num_layers - sum(head) - sum(tail)
        if middle_ranks == 0 and rest != 0:
            raise ValueError(
                f"parallel.first_stage_layers/last_stage_layers give {sum(head) + sum(tail)} "
                f"layers, the model has {num_layers}"
            )
        per_rank = [*head, *_split(rest, middle_ranks, "the middle pipeline ranks"), *tail]
    counts = [0] * (p * v)
    for rank, layers in enumerate(per_rank):
        for chunk, count in enumerate(_split(layers, v, f"pipeline rank {rank}'s chunks (vpp)")):
            counts[chunk * p + rank] = count
    return tuple(counts)


def chunk_first_layer(parallel: ParallelConfig, num_layers: int, vstage: int) -> int:
    """Index of the first layer of virtual stage ``vstage`` (the model flows in vstage order)."""
    return sum(chunk_layers(parallel, num_layers)[:vstage])


def rank_layers(parallel: ParallelConfig, num_layers: int) -> tuple[int, ...]:
    """Transformer layers held by each pipeline rank (all of its chunks), rank order."""
    p, v = parallel.pp, parallel.vpp
    counts = chunk_layers(parallel, num_layers)
    return tuple(sum(counts[c * p + r] for c in range(v)) for r in range(p))


def check_stage_split(parallel: ParallelConfig, num_layers: int) -> None:
    """Raise one clear ``ValueError`` unless the layers split over the stages as the plan says."""
    p, v = parallel.pp, parallel.vpp
    if not _uneven(parallel):
        if num_layers % (p * v):
            raise ValueError(
                f"model.num_layers={num_layers} is not divisible by pp*vpp={p * v} "
                f"(pp={p}, vpp={v}); give parallel.first_stage_layers/last_stage_layers or "
                "parallel.pipeline_layers for an uneven split"
            )
        return
    explicit = parallel.pipeline_layers
    if explicit is not None:
        others = parallel.first_stage_layers, parallel.last_stage_layers
        if (
            any(x is not None for x in others)
            or parallel.embedding_as_layer
            or parallel.loss_as_layer
        ):
            raise ValueError(
                "parallel.pipeline_layers lists every stage; do not combine it with "
                "first_stage_layers, last_stage_layers, embedding_as_layer or loss_as_layer"
            )
        if len(explicit) not in (p, p * v):
            raise ValueError(
                f"parallel.pipeline_layers has {len(explicit)} entries; give one per pipeline "
                f"rank (pp={p}) or per virtual stage (pp*vpp={p * v})"
            )
        if sum(explicit) != num_layers:
            raise ValueError(
                f"parallel.pipeline_layers sums to {sum(explicit)} layers, the model has "
                f"{num_layers}"
            )
    both = parallel.first_stage_layers is not None or parallel.last_stage_layers is not None
    if both and (parallel.embedding_as_layer or parallel.loss_as_layer):
        raise ValueError(
            "parallel.first_stage_layers/last_stage_layers set the edge stages already; "
            "embedding_as_layer and loss_as_layer apply to an even split only"
        )
    layers = chunk_layers(parallel, num_layers)
    if sum(layers) != num_layers:
        raise ValueError(
            f"the pipeline split holds {sum(layers)} layers, the model has {num_layers}"
        )
    if min(layers) < 0:
        raise ValueError(f"the pipeline split gives a stage {min(layers)} layers: {list(layers)}")
    if max(layers) == 0:
        raise ValueError("the pipeline split gives every stage 0 layers")
