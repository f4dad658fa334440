"""Every file the project writes goes through here, so nothing the user had is destroyed.

``check_output`` looks at a target before any work starts and refuses, with one line naming the
path (exit code 2 in the commands), what must not be written: an existing folder, a path that is
one of the command's inputs (same resolved path or same inode), a missing parent folder, a
folder it cannot write in, a file name whose extension says another format. ``write_bytes`` /
``write_text`` then write what each kind of target needs:

- ``-``: standard output;
- a regular file (or a new one): a temporary file in the same folder, fsync, rename over the
  target; an existing file keeps its mode, a new one gets the mode ``open`` would give it;
- a symbolic link: written through to its target, the link itself untouched;
- a character device or FIFO (``/dev/null``, a pipe): written in place, never renamed over, so
  ``/dev/null`` discards and a full device fails with "no space left on device".

    target = check_output("trace.json", inputs=["plan.yaml"], formats=(".json",))
    write_text(target, text)
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fileio.strict import shorten

STDOUT = "-"
"""The path that means standard output."""


class OutputError(ValueError):
    """An output that must not or cannot be written; one line, the commands exit with 2."""


@dataclass(frozen=True, slots=True)
class Target:
    """A checked output: where the bytes go and how they get there."""

    name: str
    """What the user gave (for messages)."""
    path: Path | None
    """The file to write (a symlink resolved to its target); None for standard output."""
    special: bool = False
    """A character device or FIFO: written in place, never renamed over."""
    format: str = ""
    """What to write, without the dot: the extension, or the first accepted format where the
    name has none to go by (standard output, a device, a FIFO)."""

    @property
    def is_stdout(self) -> bool:
        """Whether this target is standard output."""
        return self.path is None


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_dev, info.st_ino


def check_output(
    name: str | os.PathLike[str],
    *,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    formats: Iterable[str] = (),
    option: str = "output",
) -> Target:
    """The target ``name`` after checking it can be written without destroying anything.

    ``inputs`` are the command's input files; ``formats`` the accepted extensions (``.json``;
    empty: any). ``option`` names the flag in messages. Raises ``OutputError``, also for what
    the system refuses to look at (a name too long, a loop of links).
    """
    text = os.fspath(name)
    try:
        return _check_output(text, inputs=inputs, formats=formats, option=option)
    except RuntimeError:  # pathlib's resolve() on Python < 3.13; later ones raise ELOOP
        raise OutputError(f"{option} {shorten(text)}: a loop of symbolic links") from None
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        raise OutputError(f"{option} {shorten(text)}: {reason.lower()}") from None


def _check_output(
    text: str,
    *,
    inputs: Iterable[str | os.PathLike[str] | None],
    formats: Iterable[str],
    option: str,
) -> Target:
    accepted = tuple(f".{f.lstrip('.').lower()}" for f in formats)
    default_format = accepted[0].lstrip(".") if accepted else ""
    if text == STDOUT:
        return Target(text, None, format=default_format)
    if not text:
        raise OutputError(f"{option}: empty path")
    given = Path(text)
    path = given.resolve() if given.is_symlink() else given
    if given.is_symlink() and not path.parent.is_dir():
        raise OutputError(f"{option} {text!r}: the link points into a missing folder")
    if path.is_dir():
        raise OutputError(f"{option} {text!r} is a folder; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"{option} {text!r}: the folder {str(parent)!r} does not exist")
    identity = _identity(path)
    for source in inputs:
        if source is None or os.fspath(source) == STDOUT:
            continue
        same_path = _resolved(Path(source)) == path.resolve()
        if same_path or (identity is not None and _identity(Path(source)) == identity):
            raise OutputError(f"{option} {text!r} is also an input; writing it would destroy it")
    special = False
    if identity is not None:
        mode = path.stat().st_mode
        special = stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)
        if not (special or stat.S_ISREG(mode)):
            raise OutputError(f"{option} {text!r} is neither a regular file nor a device or FIFO")
        if not os.access(path, os.W_OK):
            raise OutputError(f"{option} {text!r} is not writable")
    if special:
        return Target(text, path, special=True, format=default_format)
    if not _can_create_in(parent):
        raise OutputError(f"{option} {text!r}: cannot write in the folder {str(parent)!r}")
    suffix = path.suffix.lower()
    if accepted and suffix not in accepted:
        raise OutputError(
            f"{option} {text!r}: the extension {suffix or '(none)'!r} is not one this output "
            f"writes ({', '.join(accepted)})"
        )
    return Target(text, path, format=suffix.lstrip(".") or default_format)


def _resolved(path: Path) -> Path | None:
    """``path.resolve()``, or None for a path that cannot be resolved (a loop of links, a name
    too long): an input like that is refused by whatever reads it, not blamed on the output."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return None


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be created in ``folder``: tried, not guessed (root passes every
    permission check, and /proc or a read-only mount refuse anyway). The probe is removed."""
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".probe.", suffix=".tmp")
    except OSError:
        return False
    os.close(handle)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return True


def check_outputs(
    outputs: Mapping[str, tuple[str | os.PathLike[str] | None, Iterable[str]]],
    *,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
) -> dict[str, Target]:
    """``check_output`` for each ``{option: (name or None, formats)}``; also refuses two
    options naming the same file. Returns the targets of the options that were given."""
    sources = list(inputs)
    targets: dict[str, Target] = {}
    for option, (name, formats) in outputs.items():
        if name is None:
            continue
        target = check_output(name, inputs=sources, formats=formats, option=option)
        for other_option, other in targets.items():
            clash = target.is_stdout and other.is_stdout
            if target.path is not None and other.path is not None and not target.special:
                clash = target.path.resolve() == other.path.resolve()
            if clash:
                raise OutputError(f"{option} and {other_option} name the same file {target.name!r}")
        targets[option] = target
    return targets


def twin(
    target: Target, suffix: str, *, inputs: Iterable[str | os.PathLike[str] | None] = ()
) -> Target | None:
    """The checked file beside a regular ``target`` with another extension (a results JSON's
    CSV); None for standard output, a device or a FIFO, which get no second file."""
    if target.path is None or target.special:
        return None
    sibling = target.path.with_suffix(suffix)
    return check_output(
        sibling, inputs=inputs, formats=(suffix,), option=f"{target.name} ({suffix})"
    )


def _as_target(target: Target | str | os.PathLike[str]) -> Target:
    return target if isinstance(target, Target) else check_output(target)


def _new_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _write_in_place(target: Target, data: bytes) -> None:
    assert target.path is not None
    with open(target.path, "wb") as handle:  # a device or FIFO: O_TRUNC does nothing to it
        handle.write(data)
        handle.flush()


def _replace(target: Target, data: bytes) -> None:
    assert target.path is not None
    path = target.path
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = _new_file_mode()
    folder = path.parent if str(path.parent) else Path(".")
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_bytes(target: Target | str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a checked target (a path is checked first). Raises ``OutputError``."""
    checked = _as_target(target)
    try:
        if checked.is_stdout:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        elif checked.special:
            _write_in_place(checked, data)
        else:
            _replace(checked, data)
    except OSError as error:
        if error.errno == errno.EPIPE:
            raise
        reason = os.strerror(error.errno) if error.errno else str(error)
        raise OutputError(f"cannot write {checked.name!r}: {reason.lower()}") from None


def write_text(target: Target | str | os.PathLike[str], text: str) -> None:
    """Write ``text`` as UTF-8 to a checked target (see ``write_bytes``)."""
    write_bytes(target, text.encode("utf-8"))
