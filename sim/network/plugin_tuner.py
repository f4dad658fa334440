"""Tuner plugins that override NCCL's pick on cloud fabrics: aws-ofi-nccl's region tuner on p5.

On AWS p5/p5e, aws-ofi-nccl loads a tuner that chooses all_reduce's (algorithm, protocol) from
polygons drawn in (log2 bytes, log2 ranks) space, measured on p5 (aws/aws-ofi-nccl commit
2daf7d3, ``src/tuner/nccl_ofi_regions.cpp`` ``region_init_internal_p5_p5e``; point-in-polygon as
``is_inside_region``: on an edge counts as inside, first region wins). It applies with 8 ranks per
node on more than 2 nodes only (``num_nodes <= 2``: "regions are not well defined", NCCL's own
tuner decides), and only to all_reduce (no regions for the other collectives at 8 ranks per
node); outside every polygon NCCL's tuner decides.

    region_pick("all_reduce", num_ranks=32, num_nodes=4, size_bytes=1 << 30, allowed=("ring",))
"""

from __future__ import annotations

import math
from collections.abc import Collection

TUNERS = ("nccl", "aws-ofi-p5")
"""Values of ``FabricSpec.tuner``: NCCL's own tuner, or aws-ofi-nccl's p5 region tuner."""

_MAX_SIZE = 100.0 * 1024**3
"""``TUNER_MAX_SIZE``: 100 GiB."""
_MAX_RANKS = 1024.0 * 1024
"""``TUNER_MAX_RANKS``."""
_EPS = 1e-10
"""``is_inside_region``'s tolerance."""

Point = tuple[float, float]


def _log2(point: Point) -> Point:
    """``transform_log2``: 0 becomes 1e-6 first."""
    return tuple(math.log2(v if v > 0 else 1e-6) for v in point)  # type: ignore[return-value]


def _extend(a: Point, b: Point, z: Point) -> Point:
    """``extend_region``: the far point of line a-b with z's x or y (original scale)."""
    (ax, ay), (bx, by), (zx, zy) = _log2(a), _log2(b), _log2(z)
    if ax == bx:
        x, y = ax, zy
    elif ay == by:
        x, y = zx, ay
    else:
        m = (ay - by) / (ax - bx)
        c = by - m * bx
        projected = m * zx + c
        x, y = (zx, projected) if projected < zy else ((zy - c) / m, zy)
    return 2.0**x, 2.0**y


_Z = (_MAX_SIZE, _MAX_RANKS)
_TREE_LL128 = _extend((402653184, 2048), (402653184, 4096), _Z)
_NVLSTREE_1 = _extend((8053063680, 160), (9663676416, 192), _Z)
_RING_SIMPLE = _extend((8053063680, 160), (9663676416, 192), _Z)

P5_ALL_REDUCE_8PPN: tuple[tuple[str, str, tuple[Point, ...]], ...] = (
    ("tree", "ll128", (
        (0, 16), (31457280, 16), (37748736, 32), (117440512, 64), (301989888, 128),
        (301989888, 256), (335544320, 512), (536870912, 1024), (402653184, 2048),
        (402653184, 4096), _TREE_LL128, (0, _TREE_LL128[1]),
    )),
    ("nvlstree", "simple", ((31457281, 16), (_MAX_SIZE, 16), (31457281, 16))),
    ("ring", "ll128", (
        (31457280, 17), (1073741824, 17), (2147483648, 64), (2147483648, 128),
        (1342177280, 160), (2147483648, 256), (1074790400, 256), (444596224, 160),
        (301989888, 128), (117440512, 64), (37748736, 32),
    )),
    ("nvlstree", "simple", (
        (2147483648, 128), (6442450944, 128), (8053063680, 160), (9663676416, 192), _NVLSTREE_1,
        _TREE_LL128, (402653184, 4096), (402653184, 2048), (536870912, 1024), (335544320, 512),
        (301989888, 256), (310378496, 160), (444596224, 160), (1074790400, 256),
        (2684354560, 256), (2147483648, 224), (1342177280, 160),
    )),
    ("ring", "simple", (
        (1073741824, 17), (_RING_SIMPLE[0], 17), _RING_SIMPLE, (9663676416, 192),
        (8053063680, 160), (2684354560, 64), (1610612736, 32),
    )),
)  # fmt: skip
"""aws-ofi-nccl's p5/p5e all_reduce regions with 8 ranks per node: (algorithm, protocol, polygon
in (bytes, ranks)), in the source's order."""

_REGIONS = tuple((a, p, tuple(_log2(v) for v in poly)) for a, p, poly in P5_ALL_REDUCE_8PPN)


def _cross(a: Point, b: Point) -> float:
    return a[0] * b[1] - a[1] * b[0]


def _intersect(x0: Point, x1: Point, y0: Point, y1: Point) -> tuple[int, Point | None]:
    """``intersect``: 1 cross, -1 not, 0 parallel or at an end of y0-y1; and the crossing point."""
    dx = (x1[0] - x0[0], x1[1] - x0[1])
    dy = (y1[0] - y0[0], y1[1] - y0[1])
    d = _cross(dy, dx)
    if abs(d) < _EPS:
        return 0, None
    a = (_cross(x0, dx) - _cross(y0, dx)) / d
    sect = (y0[0] + a * dy[0], y0[1] + a * dy[1])
    if a < -_EPS or a > 1 + _EPS:
        return -1, sect
    if a < _EPS or a > 1 - _EPS:
        return 0, sect
    b = (_cross(x0, dy) - _cross(y0, dy)) / d
    return (-1 if b < 0 or b > 1 else 1), sect


def _distance(x: Point, y0: Point, y1: Point) -> float:
    """``distance``: from x to its perpendicular foot on y0-y1, inf when the foot is outside."""
    dy = (y1[0] - y0[0], y1[1] - y0[1])
    result, sect = _intersect(x, (x[0] + dy[1], x[1] - dy[0]), y0, y1)
    if result == -1:
        return math.inf
    foot = sect if sect is not None else (0.0, 0.0)  # the source leaves it at the origin
    return math.hypot(foot[0] - x[0], foot[1] - x[1])


def inside(point: Point, polygon: tuple[Point, ...]) -> bool:
    """``is_inside_region`` >= 0 (inside or on an edge), in log2 coordinates."""
    count = len(polygon)
    edges = [(polygon[i], polygon[(i + 1) % count]) for i in range(count)]
    if any(_distance(point, a, b) < _EPS for a, b in edges):
        return True
    xs, ys = [v[0] for v in polygon], [v[1] for v in polygon]
    if not (min(xs) <= point[0] <= max(xs) and min(ys) <= point[1] <= max(ys)):
        return False
    far = _log2((2.0 * _MAX_SIZE, 2.0 * _MAX_RANKS))
    crossings = sum(_intersect(point, far, a, b)[0] == 1 for a, b in edges)
    return crossings % 2 == 1


def region_pick(
    op: str, *, num_ranks: int, num_nodes: int, size_bytes: float, allowed: Collection[str]
) -> tuple[str, str] | None:
    """aws-ofi-nccl's p5 choice among the ``allowed`` algorithms (NCCL marks the others
    ``NCCL_ALGO_PROTO_IGNORE`` and the tuner skips their regions), or None where it leaves the
    choice to NCCL."""
    if op != "all_reduce" or num_nodes <= 2 or num_ranks != 8 * num_nodes:
        return None
    point = _log2((float(size_bytes), float(num_ranks)))
    for algo, proto, polygon in _REGIONS:
        if algo not in allowed:
            continue
        if inside(point, polygon):
            return algo, proto
    return None
