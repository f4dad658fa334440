"""Outputs never destroy what they touch: devices, FIFOs, links, inputs and folders survive.

Every output target a user can name is tried through real commands (``commsim plan --trace``,
``--output``, ``commsim topo --draw``) and through the module itself. Device nodes are made with
mknod in a temporary folder (never the machine's own ``/dev``), and skipped where not permitted.
"""

from __future__ import annotations

import ast
import errno
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from fileio.output import OutputError, check_output, check_outputs, twin, write_bytes, write_text
from sim.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
NULL_DEVICE = (1, 3)
"""Linux's major/minor numbers of the null device."""
FULL_DEVICE = (1, 7)
"""Linux's major/minor numbers of the full device (every write fails with ENOSPC)."""

TINY_PLAN = """\
model:
  {name: tiny, num_layers: 2, hidden_size: 256, num_heads: 4, ffn_hidden_size: 1024, seq_len: 256,
   vocab_size: 1024}
cluster: {node: dgx-h100, num_nodes: 1}
parallel: {tp: 2, pp: 1}
training: {global_batch_size: 4, micro_batch_size: 1}
"""


def _mknod(path: Path, device: tuple[int, int]) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(*device))
    except (PermissionError, OSError) as error:
        pytest.skip(f"mknod is not permitted here ({error.strerror})")


def _make_target(kind: str, folder: Path) -> Path:
    """A target path of ``kind`` inside ``folder`` (plus whatever it needs around it)."""
    path = folder / "out.json"
    if kind == "regular":
        path.write_bytes(b"previous contents")
    elif kind == "folder":
        path.mkdir()
    elif kind == "symlink":
        real = folder / "real.json"
        real.write_bytes(b"previous contents")
        path.symlink_to(real)
    elif kind == "dangling symlink":
        path.symlink_to(folder / "not-yet.json")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "null device":
        _mknod(path, NULL_DEVICE)
    elif kind == "full device":
        _mknod(path, FULL_DEVICE)
    elif kind == "missing parent":
        path = folder / "absent" / "out.json"
    elif kind == "read-only folder":
        sub = folder / "locked"
        sub.mkdir()
        path = sub / "out.json"
        sub.chmod(0o555)
    return path


KINDS = (
    "new",
    "regular",
    "folder",
    "symlink",
    "dangling symlink",
    "fifo",
    "null device",
    "full device",
    "missing parent",
    "read-only folder",
)


def _snapshot(folder: Path) -> dict[str, tuple[int, bytes | None]]:
    """Kind and bytes of everything in ``folder`` (regular files only have bytes)."""
    found: dict[str, tuple[int, bytes | None]] = {}
    for path in sorted(folder.rglob("*")):
        mode = path.lstat().st_mode
        data = path.read_bytes() if stat.S_ISREG(mode) else None
        found[str(path.relative_to(folder))] = (stat.S_IFMT(mode), data)
    return found


def _drain(path: Path) -> Callable[[], bytes]:
    """Read a FIFO in a thread so a writer can open it; returns a function giving what came."""
    received: list[bytes] = []

    def reader() -> None:
        with open(path, "rb") as handle:
            received.append(handle.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()

    def result() -> bytes:
        thread.join(timeout=30)
        return b"".join(received)

    return result


def _commsim(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flag", ["--trace", "--output"])
def test_plan_outputs_never_destroy_their_target(
    kind: str, flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(TINY_PLAN)
    target = _make_target(kind, tmp_path)
    mode_before = target.lstat().st_mode if os.path.lexists(target) else None
    before = _snapshot(tmp_path)
    drained = _drain(target) if kind == "fifo" else None
    code, err = _commsim(["plan", str(plan), flag, str(target)], capsys)
    if drained is not None:
        assert b'"' in drained()  # the FIFO's reader got the JSON
    after = _snapshot(tmp_path)
    assert plan.read_text() == TINY_PLAN
    if mode_before is not None:  # a device stays a device, a link a link, a folder a folder
        assert stat.S_IFMT(target.lstat().st_mode) == stat.S_IFMT(mode_before)
    if code == 0:
        assert err == ""
        written = target.resolve()
        if stat.S_ISREG(written.stat().st_mode):
            assert written.read_bytes().startswith(b"{")
        untouched = {k: v for k, v in before.items() if tmp_path / k != written}
        assert untouched == {k: v for k, v in after.items() if k in untouched}
    else:
        assert code == 2
        assert len(err.strip().splitlines()) == 1 and err.startswith("commsim: error: ")
        assert after == before
    if (tmp_path / "locked").exists():
        (tmp_path / "locked").chmod(0o755)


def test_results_by_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What each kind gives: written, discarded, or refused with its reason."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(TINY_PLAN)
    expected = {
        "new": 0,
        "regular": 0,
        "symlink": 0,
        "dangling symlink": 0,
        "folder": 2,
        "missing parent": 2,
    }
    for kind, code in expected.items():
        folder = tmp_path / kind.replace(" ", "_")
        folder.mkdir()
        target = _make_target(kind, folder)
        got, err = _commsim(["plan", str(plan), "--trace", str(target)], capsys)
        assert got == code, (kind, err)
    assert (tmp_path / "symlink" / "out.json").is_symlink()
    assert (tmp_path / "symlink" / "real.json").read_bytes().startswith(b"{")
    assert (tmp_path / "dangling_symlink" / "not-yet.json").read_bytes().startswith(b"{")


def test_a_full_device_fails_with_no_space_and_stays_a_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(TINY_PLAN)
    full = tmp_path / "full"
    _mknod(full, FULL_DEVICE)
    code, err = _commsim(["plan", str(plan), "--trace", str(full)], capsys)
    assert code == 2
    assert err.strip() == f"commsim: error: cannot write '{full}': no space left on device"
    assert stat.S_ISCHR(full.stat().st_mode)


def test_a_null_device_discards_and_stays_a_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(TINY_PLAN)
    null = tmp_path / "NUL"
    _mknod(null, NULL_DEVICE)
    code, err = _commsim(["plan", str(plan), "--trace", str(null), "-o", str(null)], capsys)
    assert code == 0, err
    assert stat.S_ISCHR(null.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NUL", "plan.yaml"]


def test_an_input_as_output_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(TINY_PLAN)
    link = tmp_path / "link.json"
    link.symlink_to(plan)
    hard = tmp_path / "hard.json"
    os.link(plan, hard)
    for target in (plan, link, hard):
        code, err = _commsim(["plan", str(plan), "--trace", str(target)], capsys)
        assert code == 2
        assert "is also an input" in err
    assert plan.read_text() == TINY_PLAN


def test_two_outputs_naming_one_file_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(TINY_PLAN)
    out = tmp_path / "out.json"
    code, err = _commsim(["plan", str(plan), "--trace", str(out), "-o", str(out)], capsys)
    assert code == 2 and "name the same file" in err
    assert not out.exists()


def test_a_drawing_into_a_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "outdir"
    folder.mkdir()
    code, err = _commsim(["topo", "dgx-h100", "--draw", str(folder)], capsys)
    assert code == 2
    assert err.strip() == f"commsim: error: --draw '{folder}' is a folder; give a file name"
    assert list(tmp_path.iterdir()) == [folder]


def test_regular_files_are_replaced_atomically_keeping_their_mode(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text("old")
    path.chmod(0o640)
    write_text(path, "new")
    assert path.read_text() == "new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temporary left


def test_a_new_file_gets_the_mode_open_would_give(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        write_bytes(tmp_path / "new.json", b"{}")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644


def test_extension_decides_the_format_and_a_mismatch_is_an_error(tmp_path: Path) -> None:
    assert check_output(tmp_path / "t.SVG", formats=(".png", ".svg")).format == "svg"
    with pytest.raises(OutputError, match=r"extension '\.txt' is not one this output writes"):
        check_output(tmp_path / "t.txt", formats=(".png", ".svg"), option="--timeline")
    assert check_output("-", formats=(".json",)).format == "json"


def test_a_csv_twin_only_beside_regular_files(tmp_path: Path) -> None:
    target = check_output(tmp_path / "run.json", formats=(".json",))
    sibling = twin(target, ".csv")
    assert sibling is not None and sibling.path == tmp_path / "run.csv"
    assert twin(check_output("-"), ".csv") is None
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert twin(check_output(fifo, formats=(".json",)), ".csv") is None


def test_check_outputs_skips_absent_options(tmp_path: Path) -> None:
    targets = check_outputs({"--a": (None, (".json",)), "--b": (tmp_path / "b.json", (".json",))})
    assert list(targets) == ["--b"]


def test_a_write_error_is_one_line(tmp_path: Path) -> None:
    full = tmp_path / "full"
    _mknod(full, FULL_DEVICE)
    with pytest.raises(OutputError) as info:
        write_bytes(check_output(full), b"x" * 100_000)
    assert str(info.value) == f"cannot write '{full}': {os.strerror(errno.ENOSPC).lower()}"


WRITE_CALLS = {"write_text", "write_bytes", "mkstemp", "NamedTemporaryFile", "replace", "rename"}
"""Calls that write or replace files; only ``fileio/output.py`` makes them."""


def _writes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        owner = func.value if isinstance(func, ast.Attribute) else None
        owner_name = getattr(owner, "id", "")
        if name == "open" and owner_name in ("", "os", "io", "builtins"):
            modes = [a for a in node.args[1:2]] + [
                k.value for k in node.keywords if k.arg == "mode"
            ]
            flags = ast.unparse(node.args[1]) if owner_name == "os" and len(node.args) > 1 else ""
            text = "".join(
                m.value for m in modes if isinstance(m, ast.Constant) and isinstance(m.value, str)
            )
            discard = bool(node.args) and ast.unparse(node.args[0]) == "os.devnull"
            writes = set(text) & set("wax+") or "O_WRONLY" in flags or "O_CREAT" in flags
            if writes and not discard:
                found.append(f"line {node.lineno}: {ast.unparse(node)[:60]}")
        elif name in ("write_text", "write_bytes") and owner_name not in ("output",):
            # output.write_text(target, ...) is the module; Path(...).write_text is not
            if isinstance(func, ast.Attribute):
                found.append(f"line {node.lineno}: {ast.unparse(node)[:60]}")
        elif name in ("mkstemp", "NamedTemporaryFile") or (
            name in ("replace", "rename") and owner_name == "os"
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:60]}")
        elif name == "savefig":
            first = node.args[0] if node.args else None
            if not (isinstance(first, ast.Name) and first.id == "buffer"):
                found.append(f"line {node.lineno}: savefig to a path")
    return found


def test_the_output_module_is_the_only_code_that_writes_files() -> None:
    offenders = {}
    for package in ("comm_bench", "sim", "topologies", "schedules", "fileio", "vocab"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "fileio" / "output.py":
                continue
            if found := _writes(path):
                offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, offenders


def test_the_write_scan_finds_writes() -> None:
    sample = ROOT / "fileio" / "output.py"
    assert _writes(sample)  # the module itself does write, so the scan can see writes


def test_commsim_runs_with_a_pipe_as_output(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(TINY_PLAN)
    run = subprocess.run(
        [sys.executable, "-m", "sim", "plan", str(plan), "-o", "-", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count('"step_time_s"') == 2  # the file on stdout, then the --json report
