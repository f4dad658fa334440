"""The ``commsim`` command: one sub-command per module, loaded only when used.

    commsim topo dgx-h100 --nodes 128 --fabric ib-ndr
    commsim collective --topology dgx-h100 --ops all_reduce -b 1K -e 8G -f 2
    commsim calibrate results/commbench/run.json --topology localhost -o calibration.json
    commsim compare measured.json --topology dgx-h100 --calibration calibration.json -o plot.png
    commsim plan plan.yaml --json
    commsim fit plan.yaml --step-time 12.3 --compute-calibration fitted.json
    commsim validate

Each sub-command module exposes ``add_arguments(parser)`` and ``run(args) -> int``. Bad input
(a ``ValueError``, a missing file, malformed YAML/JSON) prints one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from fileio.strict import cap_line, shorten

COMMANDS: dict[str, tuple[str, str]] = {
    "topo": ("sim.cli.topo", "describe (and draw) a cluster topology"),
    "collective": ("sim.cli.collective", "simulate collectives over a size sweep"),
    "calibrate": ("sim.cli.calibrate", "fit the network model to measured collectives"),
    "compare": ("sim.cli.compare", "plot and score simulated against measured collectives"),
    "plan": ("sim.cli.plan", "simulate one training step of a parallel plan"),
    "fit": ("sim.cli.fit", "fit the compute speed to one measured step of a plan"),
    "search": ("sim.cli.search", "simulate every valid layout of a model on a cluster, ranked"),
    "sweep": ("sim.cli.sweep", "simulate plan files under what-if scenarios (stragglers, NICs)"),
    "validate": ("sim.cli.validate", "simulate published training runs and report the error"),
    "presets": ("sim.cli.presets", "list the model, server, fabric, GPU and CPU presets"),
}


def shorten_path(name: object) -> str:
    """A path for a one-line message: long names cut (``fileio.strict.shorten``)."""
    return shorten(str(name)) if name is not None else "a file"


class UsageError(ValueError):
    """Bad command-line input; printed as one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # "-1K" is a (bad) size value, not an option: let it reach the size check that names it.
        self._negative_number_matcher = re.compile(r"^-\d[\w.]*$")

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


DESCRIPTION = (
    "Simulate GPU training steps and collectives before renting the GPUs: step time, MFU, "
    "memory and a timeline of a parallel plan on a cluster, calibrated from measured "
    "collectives (commbench, nccl-tests)."
)
"""What ``commsim --help`` says the tool is for."""
EPILOG = """examples:
  commsim presets                                     models, servers, fabrics, GPUs, CPUs
  commsim plan examples/llama3-8b-ddp-8xh100.yaml     one step of a plan file
  commsim plan --model llama3-8b --cluster dgx-h100:2 --global-batch 64 --set parallel.tp=2
  commsim plan --model config.json --deepspeed ds_config.json --cluster dgx-h100:4
  commsim search --model llama3-70b --cluster dgx-h100:32 --global-batch 512
  commsim calibrate run.json --topology dgx-h100 -o calibration.json

'commsim COMMAND --help' describes a command; docs/ has the details."""
"""The examples under ``commsim --help``."""


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser, with only the sub-command named in ``argv`` imported."""
    parser = _Parser(
        prog="commsim",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``commsim``; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(args_list).parse_args(args_list)
        return int(args.handler(args))
    except BrokenPipeError:
        # The reader went away (``commsim plan --json | head``): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (ValueError, OSError, yaml.YAMLError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, FileNotFoundError) and exc.filename is not None:
            message = f"{shorten_path(exc.filename)}: file not found"  # not "[Errno 2] ..."
        elif isinstance(exc, OSError) and exc.strerror:
            # an unreadable input or output path: say which and why, without the errno prefix
            message = f"{shorten_path(exc.filename)}: {exc.strerror}"
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
            mark = exc.problem_mark
            where = "" if mark.name.startswith("<") else f"{mark.name}, "
            message = f"{exc.problem} ({where}line {mark.line + 1}, column {mark.column + 1})"
        if isinstance(exc, json.JSONDecodeError | yaml.YAMLError):
            message = f"malformed input: {message}"
        print(f"commsim: error: {cap_line(message)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
