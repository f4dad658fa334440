"""Process groups of a training job: Megatron's tp-cp-dp-pp rank order and the groups it forms.

Ranks are numbered with tp varying fastest, then cp, then dp, then pp; the expert groups of a
mixture-of-experts model re-split each stage's tp x cp x dp GPUs as etp x ep x edp, as
Megatron-Core's ``RankGenerator`` does.

    Layout(tp=2, dp=4, pp=2).group("dp", 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedules.plan import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Megatron's rank order tp-cp-dp-pp: tp varies fastest, then cp, then dp, then pp."""

    tp: int = 1
    """Tensor-parallel degree."""
    cp: int = 1
    """Context-parallel degree."""
    dp: int = 1
    """Data-parallel degree."""
    pp: int = 1
    """Pipeline-parallel degree."""
    ep: int = 1
    """Expert-parallel degree (the tp * cp * dp GPUs of a stage re-split as etp x ep x edp)."""
    etp: int = 0
    """Expert tensor-parallel degree; 0 means tp."""

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "dp", "pp", "ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if (self.tp * self.cp * self.dp) % (self.ep * (self.etp or self.tp)):
            raise ValueError(
                f"ep * etp = {self.ep} * {self.etp or self.tp} must divide tp * cp * dp = "
                f"{self.tp * self.cp * self.dp}"
            )

    def _expert_group(self, kind: str, rank: int) -> tuple[int, ...]:
        """Megatron-Core's expert groups (order etp-ep-edp inside a pipeline stage): ``ep``,
        ``etp``, ``edp`` (expert data parallel) and ``tpep`` (etp x ep)."""
        stage_size = self.tp * self.cp * self.dp
        base, local = divmod(rank, stage_size)
        etp = self.etp or self.tp
        strides = {"etp": (1, etp), "ep": (etp, self.ep), "tpep": (1, etp * self.ep)}
        strides["edp"] = (etp * self.ep, stage_size // (etp * self.ep))
        stride, size = strides[kind]
        start = local - (local // stride % size) * stride
        return tuple(base * stage_size + start + i * stride for i in range(size))

    @property
    def world_size(self) -> int:
        """tp * cp * dp * pp."""
        return self.tp * self.cp * self.dp * self.pp

    def rank(self, *, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """Global rank of the given coordinates."""
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates ``{"tp", "cp", "dp", "pp"}`` of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        return {"tp": tp, "cp": cp, "dp": rest % self.dp, "pp": rest // self.dp}

    def group(self, kind: str, rank: int, *, shard_size: int = 0) -> tuple[int, ...]:
        """Ranks of ``rank``'s group: ``tp``, ``cp``, ``dp``, ``dpcp`` (DP x CP), ``pp``,
        ``dp_shard`` / ``dp_replicate`` (HSDP split of DP into groups of ``shard_size``),
        ``dpcp_shard`` (a ``dp_shard`` group with every CP rank of its members: HSDP's shard
        group under CP),
        ``embd`` (first and last pipeline stage), ``mp`` (TP x PP, Megatron's model-parallel
        group) and ``world``."""
        c = self.coords(rank)
        if kind == "embd":
            ends = sorted({0, self.pp - 1})
            return tuple(self.rank(**{**c, "pp": s}) for s in ends)
        if kind == "mp":
            return tuple(
                self.rank(**{**c, "tp": t, "pp": s}) for s in range(self.pp) for t in range(self.tp)
            )
        if kind == "world":
            return tuple(range(self.world_size))
        if kind in ("ep", "etp", "edp", "tpep"):
            return self._expert_group(kind, rank)
        if kind in ("tp", "cp", "dp", "pp"):
            size = getattr(self, kind)
            return tuple(self.rank(**{**c, kind: i}) for i in range(size))
        if kind == "dpcp":
            return tuple(
                self.rank(**{**c, "dp": d, "cp": k}) for d in range(self.dp) for k in range(self.cp)
            )
        if kind in ("dp_shard", "dp_replicate", "dpcp_shard"):
            if shard_size < 1 or self.dp % shard_size:
                raise ValueError(f"HSDP shard size {shard_size} must divide dp={self.dp}")
            base, offset = divmod(c["dp"], shard_size)
            members = (
                [i * shard_size + offset for i in range(self.dp // shard_size)]
                if kind == "dp_replicate"
                else [base * shard_size + i for i in range(shard_size)]
            )
            cps = range(self.cp) if kind == "dpcp_shard" else (c["cp"],)
            return tuple(self.rank(**{**c, "dp": d, "cp": k}) for d in members for k in cps)
        raise ValueError(f"unknown group kind {kind!r}")


def layout_of(plan: Plan) -> Layout:
    """Rank layout of a resolved plan."""
    par = plan.parallel
    return Layout(tp=par.tp, cp=par.cp, dp=par.dp, pp=par.pp, ep=par.ep, etp=par.expert_tp)
