"""Where the simulations of a search or a sweep run: local processes, or tasks on Ray.

``--ray`` alone starts a Ray instance on this machine; ``--ray auto`` joins the Ray cluster this
machine is part of (started with ``ray start``); ``--ray ray://HOST:10001`` connects to a remote
one. Without ``--ray`` the work runs in ``-j`` local processes, with the same results.

    add_ray_argument(parser)   # then simulate_layouts(..., ray_address=args.ray)
"""

from __future__ import annotations

import argparse


def add_ray_argument(parser: argparse.ArgumentParser) -> None:
    """``--ray [ADDRESS]``."""
    parser.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="run the simulations as Ray tasks: alone, on a Ray instance started here; 'auto' "
        "or ray://HOST:PORT, on a running Ray cluster (needs commbench[ray] on every node)",
    )
