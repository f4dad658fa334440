"""Fuzzing every input path: plan files, cluster files, calibrations and command-line flags.

Each case writes its inputs into a fresh folder and runs the command in-process
(``sim.cli.main.main`` for ``commsim plan|collective|topo``; ``comm_bench.cli.main`` for
``commbench`` with the rank launcher replaced by a stub, so options are parsed and checked but
no rank starts), under a time limit and an address-space limit. Every case must end in one of:

- exit 0 with a valid result: the JSON parses (strictly: no NaN or Infinity) and its numbers are
  finite, and the files asked for exist;
- exit 2 with exactly one stderr line ``<program>: error: ...``, no traceback, and no file
  written or changed.

Inputs are valid files (``examples/*.yaml``, ``results/*/calibration*.json``, cluster mappings)
with one to three mutations: wrong types, negatives, zero, huge numbers (1e30, 2**63), NaN and
infinities, lists or mappings where scalars go, unknown keys, deleted keys, deep nesting, YAML
aliases (every repeated value written as an alias), alias bombs and junk text.

CI runs a fixed set of a few hundred cases (``derandomize=True``), under a minute on two
cores. A longer, random run (``FUZZ_EXAMPLES`` cases per test; hypothesis prints how to replay
a failure)::

    FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz.py -x

The tests carry the ``fuzz`` marker (``-m "not fuzz"`` leaves them out). Crashes found in files
no one has fixed yet would be listed in ``KNOWN_DEFECTS`` (the fuzz skips those cases), each
with an xfail'd reproducer; there are none: the last four are regression tests at the end.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import resource
import signal
import stat
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from fileio.strict import load_json
from schedules import plan as plan_module
from topologies.config import FABRIC_KEYS, NODE_KEYS
from topologies.fabrics import FABRIC_PRESETS
from topologies.hardware import GPUS, LINKS, NVSWITCHES
from topologies.nodes import INTRA_KINDS, NODE_PRESETS
from vocab.collectives import NCCL_TESTS_DTYPES, OPS, REDUCTIONS

pytestmark = pytest.mark.fuzz

ROOT = Path(__file__).resolve().parents[1]

LONG_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0"))
"""Cases per test for a long random run; 0 (unset) runs the fixed CI set."""
CASE_TIME_LIMIT_S = 30
"""Hard limit per case (a hang fails the case, it does not stall the suite)."""
CASE_MEMORY_BYTES = 3 << 30
"""Address space a case may add to the test process before it counts as a memory blow-up."""


def fuzz_settings(ci_examples: int, deadline_ms: int) -> settings:
    """The CI profile (fixed cases) or, with ``FUZZ_EXAMPLES``, the long random one."""
    return settings(
        max_examples=LONG_EXAMPLES or ci_examples,
        derandomize=not LONG_EXAMPLES,
        deadline=deadline_ms,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --- running one case -----------------------------------------------------------------------


class CaseTimeout(BaseException):
    """Raised in the case by the interval timer; a BaseException so no handler swallows it."""


@dataclass(frozen=True)
class Outcome:
    """What one command did."""

    code: int | str
    """The exit code, or ``crash: <exception>`` / ``timeout`` / ``memory``."""
    out: str
    err: str


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def _limits() -> Iterator[None]:
    """SIGALRM after ``CASE_TIME_LIMIT_S``; address space capped ``CASE_MEMORY_BYTES`` above now."""

    def alarm(_signum: int, _frame: Any) -> None:
        raise CaseTimeout

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_TIME_LIMIT_S)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space_bytes() + CASE_MEMORY_BYTES
    if hard == resource.RLIM_INFINITY or cap < hard:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def _inside(folder: Path) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def run_main(main: Callable[[list[str]], int], argv: Sequence[str], cwd: Path) -> Outcome:
    """``main(argv)`` in ``cwd`` with stdout/stderr captured and the case limits on."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.StringIO()
    code: int | str
    try:
        with (
            _inside(cwd),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            _limits(),
        ):
            code = main(list(argv))
    except CaseTimeout:
        code = "timeout"
    except MemoryError:
        code = "memory"
    except BaseException as exc:  # the case's verdict, shown with its traceback
        code = f"crash: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    out.seek(0)
    return Outcome(code, out.buffer.getvalue().decode("utf-8", "replace"), err.getvalue())


def snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under ``folder``: (size, mtime, inode), to see what a command wrote."""
    found = {}
    for path in folder.rglob("*"):
        info = path.lstat()
        found[str(path.relative_to(folder))] = (info.st_size, info.st_mtime_ns, info.st_ino)
    return found


KNOWN_DEFECTS: dict[str, str] = {}
"""Crashes not fixed yet, (traceback frame, exception) -> the fuzz skips a case that hits one;
each needs an xfail'd reproducer at the end of this module. None at present."""


def _known_defect(outcome: Outcome) -> bool:
    code = str(outcome.code)
    return code.startswith("crash") and any(
        frame in code and error in code for frame, error in KNOWN_DEFECTS.items()
    )


def check_contract(
    program: str, outcome: Outcome, before: dict[str, Any], after: dict[str, Any]
) -> None:
    """Exit 0, or exit 2 with one ``program: error:`` line and nothing written."""
    with contextlib.suppress(InvalidArgument):  # outside a hypothesis test: nothing to count
        event(f"exit {outcome.code}" if outcome.code in (0, 2) else "crash")
    if _known_defect(outcome):
        reject()
    assert outcome.code in (0, 2), f"exit {outcome.code!r}; stderr: {outcome.err[-2000:]}"
    assert "Traceback" not in outcome.err, outcome.err
    if outcome.code == 2:
        assert outcome.err.endswith("\n") and outcome.err.count("\n") == 1, outcome.err
        assert outcome.err.startswith(f"{program}: error: "), outcome.err
        assert after == before, f"files changed on failure: {sorted(set(after) ^ set(before))}"
    else:
        for line in outcome.err.splitlines():
            assert line.startswith(f"{program}: warning: "), outcome.err


def finite_json(text: str) -> Any:
    """The JSON document, refusing NaN/Infinity literals and numbers that overflow to inf."""
    document = load_json(text, name="output")
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float):
            assert math.isfinite(item), f"non-finite number in {text[:200]}"
    return document


@pytest.fixture(scope="module")
def case_dirs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    """A fresh folder per case (hypothesis runs many cases in one test function)."""
    return lambda: tmp_path_factory.mktemp("case", numbered=True)


def commsim(argv: Sequence[str], cwd: Path) -> Outcome:
    """``commsim argv`` in-process."""
    from sim.cli.main import main

    return run_main(main, argv, cwd)


# --- values -----------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
DEEP: Any = 0
for _ in range(100):
    DEEP = [DEEP]

CHOICE_WORDS = sorted(
    {
        *(
            word
            for value in vars(plan_module).values()
            if isinstance(value, tuple) and all(isinstance(w, str) for w in value)
            for word in value
        ),
        *plan_module.MLP_ACTIVATIONS,
        plan_module.FSDP2_ALIAS,
        *NODE_PRESETS,
        *FABRIC_PRESETS,
        *GPUS,
        *LINKS,
        *NVSWITCHES,
        *INTRA_KINDS,
        "fat-tree",
    }
)
"""Every word a choice-valued key takes, so mutations also make other valid inputs."""

junk_scalars = st.sampled_from(
    [0, -1, 1, 2, 3, 4, 8, 16, 2**31, 2**63, -(2**63), 10**30, 10**100, 10**400,
     0.0, -0.0, 0.5, 1.5, -1.5, 1e-300, 5e-324, 1e30, 1e300, NAN, INF, -INF,
     True, False, None, "", "x", "1", "8", "1e30", "5e8", "nan", "inf", "null", "true", "\x00",
     "é", "x" * 10_000]
)  # fmt: skip
junk_containers = st.sampled_from([[], [1], [1, 2], ["x"], {}, {"a": 1}, {"base": [1]}, DEEP])
junk = st.one_of(
    junk_scalars,
    junk_scalars,
    st.integers(0, 64),
    st.sampled_from(CHOICE_WORDS),
    junk_containers,
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
"""A value to put where any value goes."""

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)
junk_texts = st.sampled_from(
    [
        "",
        "---\n",
        "[1, 2]\n",
        "just text\n",
        "a: 1\na: 2\n",
        "a: [\n",
        "\tmodel: 1\n",
        "{" * 200 + "}" * 200,
        "[" * 1000 + "]" * 1000,
        ALIAS_BOMB,
        "a: &x [*x]\n",
        "a: &x {b: *x}\n",
        "a: !!python/object:os.system x\n",
        "model: *undefined\n",
        "--- 1\n--- 2\n",
        "\udcff\udcfe not UTF-8",  # written as the bytes ff fe (surrogateescape)
        "x" * 100_000,
    ]
)
"""Whole files that are not the document they should be."""


class AliasDumper(yaml.SafeDumper):
    """Writes every value that occurs twice as an anchor and aliases (``&id001`` / ``*id001``)."""

    def ignore_aliases(self, data: Any) -> bool:
        return data is None or data == ()


def dump_yaml(document: Any, aliases: bool) -> str:
    """YAML text of ``document``; with ``aliases`` repeated values become YAML aliases."""
    return yaml.dump(document, Dumper=AliasDumper if aliases else yaml.SafeDumper, sort_keys=False)


@st.composite
def mutated(
    draw: st.DrawFn,
    base: dict[str, Any],
    keys: dict[tuple[str, ...], Sequence[str]],
    share: bool = True,
) -> Any:
    """``base`` with one to three mutations; ``keys`` lists the known keys under each path.

    With ``share``, a mutation may put a list or mapping of the document at a second place
    (written as a YAML alias; possibly a cycle, which YAML can express and JSON cannot).
    """
    document = copy.deepcopy(base)
    paths = sorted(keys)
    kinds = ["set", "set", "set", "delete", "unknown", *(["share"] if share else [])]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        parent: Any = document
        for part in path:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        kind = draw(st.sampled_from(kinds))
        key = draw(st.sampled_from([*keys[path], *parent])) if keys[path] or parent else "x"
        if kind == "set":  # a copy: a later mutation must not change the shared junk value
            parent[key] = copy.deepcopy(draw(junk))
        elif kind == "delete":
            parent.pop(key, None)
        elif kind == "unknown":
            parent[draw(st.sampled_from(["bogus", "Model", "1", "", "tp "]))] = copy.deepcopy(
                draw(junk)
            )
        else:
            shared = [v for v in document.values() if isinstance(v, dict | list)]
            if shared:
                parent[key] = draw(st.sampled_from(shared))
    return document


# --- plan files -------------------------------------------------------------------------------

PLAN_FILES = sorted((ROOT / "examples").glob("*.yaml"))
PLANS = {path.name: yaml.safe_load(path.read_text()) for path in PLAN_FILES}
PLANS["tiny"] = {
    "model": {"name": "t", "num_layers": 2, "hidden_size": 256, "num_heads": 4,
              "ffn_hidden_size": 1024, "seq_len": 256, "vocab_size": 1024},
    "cluster": {"node": "dgx-h100", "num_nodes": 1},
    "parallel": {"tp": 2},
    "training": {"global_batch_size": 8, "micro_batch_size": 1},
}  # fmt: skip
PLANS["tiny-node-mapping"] = {
    **PLANS["tiny"],
    "cluster": {"node": {"base": "pcie-h100", "num_gpus": 4, "nics_per_node": 2}, "num_nodes": 2},
}
PLAN_KEYS: dict[tuple[str, ...], Sequence[str]] = {
    (): ("model", "cluster", "parallel", "training", "name", "description"),
    **{
        (section,): [f.name for f in fields(cls) if f.name != "base_dir"]
        for section, cls in plan_module._SECTIONS.items()
    },
    ("cluster", "node"): NODE_KEYS,
}
"""Every key a plan may have, by where it goes (a cluster node may be a mapping)."""
HEAVY_PLANS = ("llama3-405b-16k.yaml", "gpt3-175b-1024xa100.yaml", "deepseek-v3-1024xh100.yaml")
"""Examples that take a second or more to simulate: mutated only in the long run."""


@st.composite
def plan_documents(draw: st.DrawFn) -> str:
    """A plan file's text: an example or a tiny plan, mutated; or junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(junk_texts)
    names = sorted(PLANS) if LONG_EXAMPLES else sorted(set(PLANS) - set(HEAVY_PLANS))
    document = draw(mutated(PLANS[draw(st.sampled_from(names))], PLAN_KEYS))
    return dump_yaml(document, aliases=draw(st.booleans()))


@pytest.mark.parametrize("heavy", HEAVY_PLANS)
def test_heavy_examples_refuse_a_bad_value(heavy: str, case_dirs: Callable[[], Path]) -> None:
    """The big examples, which the CI fuzz leaves out, with one bad value each."""
    for section, key, value in (("parallel", "tp", 2**63), ("model", "norm", 1)):
        document = copy.deepcopy(PLANS[heavy])
        document[section][key] = value
        folder = case_dirs()
        (folder / "plan.yaml").write_text(dump_yaml(document, aliases=True))
        before = snapshot(folder)
        outcome = commsim(["plan", "plan.yaml", "-o", "out.json"], folder)
        check_contract("commsim", outcome, before, snapshot(folder))
        assert outcome.code == 2


@fuzz_settings(ci_examples=200, deadline_ms=10_000)
@given(text=plan_documents(), as_json=st.booleans())
def test_fuzz_plan_files(text: str, as_json: bool, case_dirs: Callable[[], Path]) -> None:
    """``commsim plan`` on mutated examples: a report and a finite JSON result, or one line."""
    folder = case_dirs()
    (folder / "plan.yaml").write_text(text, encoding="utf-8", errors="surrogateescape")
    before = snapshot(folder)
    argv = ["plan", "plan.yaml", "-o", "out.json", *(["--json"] if as_json else [])]
    outcome = commsim(argv, folder)
    check_contract("commsim", outcome, before, snapshot(folder))
    if outcome.code == 0:
        result = finite_json((folder / "out.json").read_text())
        assert result["step_time_s"] > 0
        if as_json:
            assert finite_json(outcome.out) == result
        else:
            assert "step" in outcome.out


# --- cluster files ----------------------------------------------------------------------------

CLUSTERS: dict[str, dict[str, Any]] = {
    "preset": {"node": "dgx-h100", "num_nodes": 2, "fabric": "ib-ndr"},
    "node-mapping": {
        "node": {"base": "dgx-a100", "num_gpus": 4, "nic": "ib-ndr"},
        "num_nodes": 3,
        "fabric": {"base": "ib-ndr", "radix": 8, "tiers": 2, "rail_optimized": False},
        "oversubscription": 2.0,
    },
    "full-node": {
        "node": {"gpu": "h100-pcie", "num_gpus": 8, "intra": "nvlink-bridge",
                 "nvlink": "nvlink4-bridge", "nic": "roce-400g", "nics_per_node": 4,
                 "num_pcie_switches": 4, "num_cpus": 2, "pcie": "pcie-gen5"},
        "num_nodes": 2,
        "fabric": {"kind": "fat-tree", "link": "roce-400g", "radix": 16, "name": "f"},
    },
    "localhost": {"node": {"base": "localhost", "num_gpus": 4}},
}  # fmt: skip
CLUSTER_KEYS: dict[tuple[str, ...], Sequence[str]] = {
    (): ("node", "num_nodes", "fabric", "oversubscription"),
    ("node",): NODE_KEYS,
    ("fabric",): FABRIC_KEYS,
}


@st.composite
def cluster_documents(draw: st.DrawFn) -> str:
    """A cluster file's text: one of ``CLUSTERS`` mutated, or junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(junk_texts)
    document = draw(mutated(CLUSTERS[draw(st.sampled_from(sorted(CLUSTERS)))], CLUSTER_KEYS))
    return dump_yaml(document, aliases=draw(st.booleans()))


@fuzz_settings(ci_examples=100, deadline_ms=10_000)
@given(text=cluster_documents(), in_plan=st.booleans(), as_json=st.booleans())
def test_fuzz_cluster_files(
    text: str, in_plan: bool, as_json: bool, case_dirs: Callable[[], Path]
) -> None:
    """Through ``commsim topo FILE`` and through a tiny plan's ``cluster.file``."""
    folder = case_dirs()
    (folder / "cluster.yaml").write_text(text, encoding="utf-8", errors="surrogateescape")
    if in_plan:
        tiny = copy.deepcopy(PLANS["tiny"])
        tiny["cluster"] = {"file": "cluster.yaml"}
        tiny["parallel"] = {"tp": 1}
        (folder / "plan.yaml").write_text(yaml.safe_dump(tiny))
        argv = ["plan", "plan.yaml", *(["--json"] if as_json else [])]
    else:
        argv = ["topo", "cluster.yaml", *(["--json"] if as_json else [])]
    before = snapshot(folder)
    outcome = commsim(argv, folder)
    check_contract("commsim", outcome, before, snapshot(folder))
    if outcome.code == 0:
        assert finite_json(outcome.out) if as_json else outcome.out.strip()


# --- calibration files ------------------------------------------------------------------------

NETWORK_CALIBRATIONS = {
    "localhost": json.loads((ROOT / "results/localhost/calibration.json").read_text()),
    "dgx-h100": json.loads(
        (ROOT / "results/nccl/calibration_h100_all_reduce_ring_nvls.json").read_text()
    ),
}


def _calibration_keys(document: dict[str, Any]) -> dict[tuple[str, ...], Sequence[str]]:
    keys: dict[tuple[str, ...], Sequence[str]] = {(): list(document)}
    for entry, values in document["params"].items():
        keys[("params", entry)] = list(values)
        keys[("params", entry, "fit")] = list(values["fit"])
    keys[("params",)] = list(document["params"])
    keys[("fitted_from",)] = list(document["fitted_from"])
    return keys


COMPUTE_CALIBRATION: dict[str, Any] = {
    "schema": "commsim-compute/1",
    "device": "NVIDIA H100 80GB HBM3",
    "gpu": "h100-sxm",
    "kernels": {
        "bf16": {
            "gemm": {"max_flops_per_s": 7.0e14, "dim_half": 300.0, "latency_s": 5e-6},
            "attention_forward": {"max_flops_per_s": 4.0e14, "dim_half": 100.0},
        }
    },
    "efficiency": {"memory": 0.8, "attention_backward": 0.5},
    "memory_bandwidth_bytes_per_s": 3.0e12,
    "measurements": [{"kind": "gemm", "dtype": "bf16", "dims": [1024, 1024, 1024],
                      "flops": 2.1e9, "time_s": 1e-5}],
}  # fmt: skip
COMPUTE_KEYS: dict[tuple[str, ...], Sequence[str]] = {
    (): list(COMPUTE_CALIBRATION),
    ("kernels",): ["bf16", "fp8", "fp16", "x"],
    ("kernels", "bf16"): ["gemm", "attention_forward", "attention_backward", "x"],
    ("kernels", "bf16", "gemm"): ["max_flops_per_s", "dim_half", "latency_s"],
    ("kernels", "bf16", "attention_forward"): ["max_flops_per_s", "dim_half", "latency_s"],
    ("efficiency",): ["gemm", "attention_forward", "attention_backward", "memory", "x"],
}


def dump_json(document: Any, draw: st.DrawFn) -> str:
    """JSON text; NaN/Infinity literals stay (the reader must refuse them) or become 1e400."""
    text = json.dumps(document, indent=draw(st.sampled_from([None, 1])))
    return text.replace("Infinity", "1e400") if draw(st.booleans()) else text


@st.composite
def network_calibrations(draw: st.DrawFn) -> tuple[str, str]:
    """(topology preset, calibration JSON text)."""
    topology = draw(st.sampled_from(sorted(NETWORK_CALIBRATIONS)))
    if draw(st.integers(0, 9)) == 0:
        return topology, draw(junk_texts)
    base = NETWORK_CALIBRATIONS[topology]
    return topology, dump_json(draw(mutated(base, _calibration_keys(base), share=False)), draw)


@fuzz_settings(ci_examples=60, deadline_ms=10_000)
@given(case=network_calibrations())
def test_fuzz_network_calibrations(case: tuple[str, str], case_dirs: Callable[[], Path]) -> None:
    """``commsim collective --calibration`` on mutated fits: finite times, or one line."""
    topology, text = case
    folder = case_dirs()
    (folder / "cal.json").write_text(text, encoding="utf-8", errors="surrogateescape")
    before = snapshot(folder)
    argv = ["collective", "--topology", topology, "--calibration", "cal.json", "--ops", "all",
            "-b", "1K", "-e", "1G", "-f", "32", "--output", "run.json"]  # fmt: skip
    outcome = commsim(argv, folder)
    check_contract("commsim", outcome, before, snapshot(folder))
    if outcome.code == 0:
        assert finite_json((folder / "run.json").read_text())["results"]
        assert "inf" not in outcome.out and "nan" not in outcome.out


@st.composite
def compute_calibrations(draw: st.DrawFn) -> str:
    """A compute calibration's text: ``COMPUTE_CALIBRATION`` mutated, or junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(junk_texts)
    return dump_json(draw(mutated(COMPUTE_CALIBRATION, COMPUTE_KEYS, share=False)), draw)


@fuzz_settings(ci_examples=60, deadline_ms=10_000)
@given(text=compute_calibrations())
def test_fuzz_compute_calibrations(text: str, case_dirs: Callable[[], Path]) -> None:
    """``commsim plan --compute-calibration`` on mutated files: a finite step, or one line."""
    folder = case_dirs()
    (folder / "compute.json").write_text(text, encoding="utf-8", errors="surrogateescape")
    (folder / "plan.yaml").write_text(yaml.safe_dump(PLANS["tiny"]))
    before = snapshot(folder)
    argv = ["plan", "plan.yaml", "--compute-calibration", "compute.json", "--json"]
    outcome = commsim(argv, folder)
    check_contract("commsim", outcome, before, snapshot(folder))
    if outcome.code == 0:
        assert finite_json(outcome.out)["step_time_s"] > 0


# --- command-line flags -----------------------------------------------------------------------

LONG = "x" * 300
"""A file name longer than file systems allow (255 bytes)."""
NUMBERS = ["0", "-1", "1", "2", "3", "4", "8", "1.5", "2.0", "1e30", "1e400", "nan", "inf",
           "-inf", str(2**63), "9" * 400, "", " ", "x", "0x10", "1_000"]  # fmt: skip
SIZES = ["0", "1", "64", "1K", "1k", "32M", "1G", "4G", "1T", "-1K", "1KB", "1KiB", "1.5K",
         "99999999999999999999T", "1P", "K", "", "nan", "2 M"]  # fmt: skip
PATHS = ["out.json", "out.png", "out.csv", "out.txt", "out", "missing/out.json",
         "missing/deeper/out.png", ".", "folder", "folder/", "-", "", "null-device",
         "/proc/out.json", "input.yaml", "input.json", "link.json", "loop.json",
         LONG + ".json"]  # fmt: skip


def _flags(table: dict[str, Sequence[str | None]]) -> st.SearchStrategy[list[str]]:
    """Zero or more ``flag value`` pairs from ``table`` (a value of ``None`` means a switch)."""
    pair = st.sampled_from(sorted(table)).flatmap(
        lambda flag: st.sampled_from(list(table[flag])).map(
            lambda value: [flag] if value is None else [flag, value]
        )
    )
    return st.lists(pair, max_size=4).map(lambda pairs: [x for p in pairs for x in p])


def _device(path: Path, minor: int) -> None:
    """A private character device in the case folder (the memory driver: 3 null, 5 zero), or a
    FIFO where making devices is not allowed: special files either way, never the machine's."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, minor))
    except (PermissionError, OSError, AttributeError):
        os.mkfifo(path)


def _prepare_paths(folder: Path) -> None:
    """The files, folders and devices ``PATHS`` and the flag tables refer to."""
    (folder / "folder").mkdir()
    _device(folder / "null-device", 3)
    _device(folder / "zero-device", 5)
    (folder / "input.yaml").write_text(yaml.safe_dump(PLANS["tiny"]))
    (folder / "input.json").write_text((ROOT / "results/localhost/calibration.json").read_text())
    (folder / "link.json").symlink_to("input.json")
    (folder / "loop.json").symlink_to("loop.json")


PLAN_FLAGS: dict[str, Sequence[str | None]] = {
    "--json": [None], "--no-fold": [None], "-o": PATHS, "--output": PATHS, "--trace": PATHS,
    "--timeline": ["missing/t.png", "t.txt", "folder", "input.yaml", "-"],
    "--calibration": ["input.json", "input.yaml", "missing.json", "folder", "null-device",
                      "zero-device", "/proc/self/mem", LONG + ".json"],
    "--compute-calibration": ["input.json", "missing.json", "folder", "null-device", "zero-device",
                              LONG + ".json"],
    "--fidelity": ["analytical", "flow", "x", ""], "--bogus": ["1"],
    "--whatif": ["moe_imbalance=1.5", "moe_imbalance=3:2,7:1.5", "moe_imbalance=3:x",
                 "moe_imbalance=0:2,0:3", "moe_imbalance=", "slow_gpu=0:0.2", "nic=1:down",
                 "moe_imbalance=999:2", "link=leaf0-spine7:0.5", "link=leaf0:x",
                 "link=leaf0-spine99:down"],
}  # fmt: skip
COLLECTIVE_FLAGS: dict[str, Sequence[str | None]] = {
    "--topology": [*NODE_PRESETS, "input.yaml", "missing.yaml", "folder", "null-device", "x",
                   "zero-device", "/proc/self/mem", LONG, LONG + ".yaml"],
    "--nodes": NUMBERS, "--ranks": NUMBERS, "--fabric": [*FABRIC_PRESETS, "x", ""],
    "--oversubscription": NUMBERS, "--ops": ["all", *OPS, "all_reduce,all_gather", "x", "", ","],
    "-b": SIZES, "-e": SIZES, "-f": NUMBERS, "-d": [*NCCL_TESTS_DTYPES, "x"],
    "-o": [*REDUCTIONS, "x"], "-r": NUMBERS, "--algo": ["auto", "ring", "tree", "nvls", "x"],
    "--fidelity": ["analytical", "flow", "x"],
    "--calibration": ["input.json", "missing.json", "zero-device", LONG + ".json", "folder"],
    "--output": PATHS,
}  # fmt: skip
TOPO_FLAGS: dict[str, Sequence[str | None]] = {
    "--nodes": NUMBERS, "--fabric": [*FABRIC_PRESETS, "x", ""], "--oversubscription": NUMBERS,
    "--gpus-per-node": NUMBERS, "--draw": [p for p in PATHS if not p.endswith(".png")],
    "--json": [None],
}  # fmt: skip


@st.composite
def commsim_argv(draw: st.DrawFn) -> list[str]:
    """``plan``, ``collective`` or ``topo`` with a few flags from their tables."""
    command = draw(st.sampled_from(["plan", "collective", "topo"]))
    if command == "plan":
        plan = draw(st.sampled_from(["input.yaml", "input.json", "missing.yaml", "folder",
                                     "null-device", "zero-device", LONG + ".yaml"]))  # fmt: skip
        return ["plan", plan, *draw(_flags(PLAN_FLAGS))]
    if command == "topo":
        cluster = draw(
            st.sampled_from(
                [
                    *NODE_PRESETS,
                    "missing.yaml",
                    "folder",
                    "x",
                    "",
                    "zero-device",
                    "/proc/self/mem",
                    LONG + ".yaml",
                ]
            )
        )
        return ["topo", cluster, *draw(_flags(TOPO_FLAGS))]
    flags = draw(_flags(COLLECTIVE_FLAGS))
    topology = [] if "--topology" in flags else ["--topology", "localhost"]
    small = ["-b", "1K", "-e", "64K"] if "-e" not in flags else []
    return ["collective", *topology, *small, *flags]


@fuzz_settings(ci_examples=120, deadline_ms=10_000)
@given(argv=commsim_argv())
def test_fuzz_commsim_flags(argv: list[str], case_dirs: Callable[[], Path]) -> None:
    """``commsim plan|collective|topo`` with odd flag values and output paths."""
    folder = case_dirs()
    _prepare_paths(folder)
    before = snapshot(folder)
    outcome = commsim(argv, folder)
    check_contract("commsim", outcome, before, snapshot(folder))


COMMBENCH_FLAGS: dict[str, Sequence[str | None]] = {
    "--ops": ["all", *OPS, "all_reduce,reduce", "x", "", ",", "all_reduce," * 1000],
    "-b": SIZES, "-e": SIZES, "-f": NUMBERS, "-i": SIZES, "-n": NUMBERS, "-w": NUMBERS,
    "-c": NUMBERS, "-d": [*NCCL_TESTS_DTYPES, "float32", "x", ""], "-o": [*REDUCTIONS, "x", ""],
    "-r": NUMBERS, "-a": NUMBERS, "-I": NUMBERS, "--nprocs": NUMBERS,
    "--backend": ["auto", "gloo", "nccl", "mpi", ""], "-T": NUMBERS, "--output": PATHS,
    "--minbytes": SIZES, "--warmup-iters": NUMBERS, "--bogus": ["1"], "--op": ["sum"],
}  # fmt: skip


@pytest.fixture(scope="module")
def torch_loaded() -> None:
    """Import torch once, outside any case's time and memory limits."""
    pytest.importorskip("torch")


def commbench(argv: Sequence[str], cwd: Path, spawned: list[dict[str, Any]]) -> Outcome:
    """``commbench argv`` in-process, the local launcher replaced by a stub that records."""
    from comm_bench import cli, dist_env

    def stub(argv: Sequence[str], *, nprocs: int, timeout_s: float, output: Path) -> int:
        spawned.append({"nprocs": nprocs, "timeout_s": timeout_s, "output": output})
        return 0

    clean_env = {k: v for k, v in os.environ.items() if k not in dist_env.LAUNCH_VARS}
    with (
        mock.patch("comm_bench.launch.spawn_local", stub),
        mock.patch.dict(os.environ, clean_env, clear=True),
    ):
        return run_main(cli.main, argv, cwd)


@fuzz_settings(ci_examples=120, deadline_ms=10_000)
@given(flags=_flags(COMMBENCH_FLAGS))
def test_fuzz_commbench_flags(
    flags: list[str], torch_loaded: None, case_dirs: Callable[[], Path]
) -> None:
    """``commbench`` flags: the stub launcher gets a checked run, or one line and no launch."""
    folder = case_dirs()
    _prepare_paths(folder)
    spawned: list[dict[str, Any]] = []
    argv = [*flags, "--backend", "gloo"] if "--backend" not in flags else flags
    before = snapshot(folder)
    outcome = commbench(argv, folder, spawned)
    after = snapshot(folder)
    check_contract("commbench", outcome, before, after)
    if outcome.code == 0:
        (launch,) = spawned
        output = folder / launch["output"]
        assert output.suffix == ".json" and output.parent.is_dir()
        assert launch["nprocs"] >= 1 and 1 <= launch["timeout_s"] <= 86_400
    else:
        assert not spawned


# --- defects the fuzz found in the CLI entry points, with their reproducers (fixed) ---


def _plan_with(tmp: Path, **model: Any) -> Path:
    document = copy.deepcopy(PLANS["tiny"])
    document["model"].update(model)
    path = tmp / "plan.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_fixed_a_list_activation_beside_gated_mlp(case_dirs: Callable[[], Path]) -> None:
    folder = case_dirs()
    _plan_with(folder, mlp_activation=["a"], gated_mlp=True)
    outcome = commsim(["plan", "plan.yaml"], folder)
    assert outcome.code == 2


@pytest.mark.parametrize("flag", ["plan", "--calibration", "--compute-calibration"])
def test_fixed_plan_inputs_with_names_too_long(flag: str, case_dirs: Callable[[], Path]) -> None:
    folder = case_dirs()
    _plan_with(folder)
    long_name = LONG + ".yaml"
    argv = ["plan", long_name] if flag == "plan" else ["plan", "plan.yaml", flag, long_name]
    outcome = commsim(argv, folder)
    assert outcome.code == 2


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs /proc")
def test_fixed_a_plan_file_that_cannot_be_read(case_dirs: Callable[[], Path]) -> None:
    outcome = commsim(["plan", "/proc/self/mem"], case_dirs())
    assert outcome.code == 2


def test_fixed_commbench_default_output_folder_blocked(
    torch_loaded: None, case_dirs: Callable[[], Path]
) -> None:
    folder = case_dirs()
    (folder / "results").write_text("")
    spawned: list[dict[str, Any]] = []
    outcome = commbench(["--backend", "gloo"], folder, spawned)
    assert outcome.code == 2 and not spawned
