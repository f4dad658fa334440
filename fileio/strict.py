"""Reading YAML and JSON strictly: a key given twice, an alias bomb or a runaway nesting is an
error naming where it is, and values echoed in messages stay short.

PyYAML and ``json`` keep the last of two equal keys without a word, so a plan with two
``training:`` blocks would silently lose the first. ``load_yaml`` / ``load_json`` refuse that
with the key and both line numbers; they also refuse documents nested deeper than ``MAX_DEPTH``
and YAML that expands aliases more than ``MAX_ALIASES`` times ("billion laughs"), before the
expansion can eat the memory (an alias inside the collection it names is refused too).
``read_input`` reads an input file with one-line errors and a size bound, so ``/dev/zero`` or a
FIFO nobody writes to cannot hang a command.

    data = load_yaml(read_input("plan.yaml", what="plan"), name="plan.yaml")
    raise ValueError(f"model.num_layers must be int, got {shorten(value)}")
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import os
import reprlib
import stat
from collections.abc import Iterable
from typing import Any

import yaml

MAX_DEPTH = 64
"""Deepest nesting of mappings and lists accepted (plans and calibrations need under 10)."""
MAX_ALIASES = 1000
"""Most YAML alias uses in one document (a real file has a handful)."""
MAX_VALUES = 1_000_000
"""Most values a YAML document may expand to through its aliases ("billion laughs")."""
ECHO_CHARS = 60
"""Longest echo of a user's value in a message, before ``... (N characters)``."""


MAX_INPUT_BYTES = 64 << 20
"""Largest input file read: plans, clusters and calibrations are kilobytes, measured results a
few megabytes; ``/dev/zero`` or a runaway file is refused instead of read until memory runs out."""
MAX_CONFIG_BYTES = 1 << 20
"""Largest configuration file read (a plan, a framework's config or launch script: kilobytes);
a megabyte of YAML takes PyYAML seconds, so a bigger one is refused before it is parsed."""


MAX_ERROR_CHARS = 1500
"""Longest error line the commands print; values inside are shortened already, this is the
safety net for anything that was not (long enough for every list of choices the commands
give, such as the ``parallel`` section's keys)."""


TYPO_CUTOFF = 0.9
"""The ``did_you_mean`` cutoff for a key that may be a real one nobody models (a config's
``stage3_max_reuse_distance``): only a near miss of a key that is read, a letter or two
(``zero_optimisation``), is named."""


def did_you_mean(word: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str:
    """``" (did you mean 'tp'?)"`` naming the choices closest to ``word`` (difflib's ratio of at
    least ``cutoff``, 0.6 as its ``get_close_matches``; at most three, within 0.1 of the
    closest), or ``""`` when none is close."""
    word = str(word)
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=cutoff)
    if not close:
        return ""
    best = difflib.SequenceMatcher(None, word, close[0]).ratio()
    close = [c for c in close if difflib.SequenceMatcher(None, word, c).ratio() >= best - 0.1]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)"


def cap_line(message: str) -> str:
    """``message`` cut to ``MAX_ERROR_CHARS`` characters, saying how long it was."""
    if len(message) <= MAX_ERROR_CHARS:
        return message
    return f"{message[:MAX_ERROR_CHARS]}... ({len(message):,} characters)"


def shorten(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, saying how long the value was; containers
    are abbreviated before they are printed, so a huge or self-expanding value costs nothing."""
    if isinstance(value, str | bytes):
        text = repr(value)
        size = f"{len(value):,} characters"
    else:
        text = _REPR.repr(value)
        size = f"{len(value):,} items" if isinstance(value, list | tuple | dict) else ""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({size or 'cut'})"


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 2, 4, 4, 4
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = ECHO_CHARS, ECHO_CHARS, ECHO_CHARS


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, deep nesting and alias bombs."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise ValueError(
                    f"{self.name}: more than {MAX_ALIASES} YAML aliases (line {mark.line + 1}); "
                    "a document that expands itself is refused"
                )
        depth = getattr(self, "_depth", 0)
        if depth > MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise ValueError(f"{self.name}: nested deeper than {MAX_DEPTH} (line {mark.line + 1})")
        self._depth = depth + 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth = depth

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key; the base class says so
                break
            if first is not None:
                raise ValueError(
                    f"{self.name}: key {shorten(key)} given twice (lines {first} and {line})"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def require_file(path: str | os.PathLike[str], what: str) -> None:
    """A ``FileNotFoundError`` when ``path`` does not exist, a ``ValueError`` when it is a folder
    (``what`` names the input in the one-line error: ``plan file``, ``--calibration``)."""
    name = os.fspath(path)
    if os.path.isdir(name):
        raise ValueError(f"{what} {shorten(name)} is a folder, not a file")
    if not os.path.exists(name):
        raise FileNotFoundError(f"{what} not found: {name}")


def read_input(path: str | os.PathLike[str], *, what: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of the input file ``path``; ``what`` names it in the one-line errors.

    A missing file is a ``FileNotFoundError``; a folder, a file over ``max_bytes``, one that
    cannot be read or is not UTF-8 a ``ValueError``. A pipe or device is read up to
    ``max_bytes`` (a FIFO nobody writes to reads as empty instead of blocking).
    """
    name = os.fspath(path)
    require_file(name, what)
    try:
        info = os.stat(name)
        if stat.S_ISREG(info.st_mode) and info.st_size > max_bytes:
            raise ValueError(f"{what} {shorten(name)} is larger than {max_bytes:,} bytes")
        descriptor = os.open(name, os.O_RDONLY | os.O_NONBLOCK)  # opening a FIFO must not wait
        with os.fdopen(descriptor, "rb") as handle:
            os.set_blocking(descriptor, True)
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {name}") from None
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        raise ValueError(f"{what} {shorten(name)}: {reason.lower()}") from None
    if len(data) > max_bytes:
        raise ValueError(f"{what} {shorten(name)} is larger than {max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{what} {shorten(name)} is not UTF-8 text "
            f"(byte {data[error.start]:#04x} at offset {error.start:,})"
        ) from None


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping
)


def _construct_int(loader: _StrictLoader, node: yaml.ScalarNode) -> int:
    """YAML 1.1's integers, but for the two forms nobody writes on purpose in a config: a
    leading 0 (``016`` is octal, 14) and base 60 (``1:30`` is 90), refused naming the value."""
    text = str(node.value).replace("_", "").lstrip("+-")
    if ":" in text or (len(text) > 1 and text[0] == "0" and text[1].isdigit()):
        line = node.start_mark.line + 1
        value = int(loader.construct_yaml_int(node))
        raise ValueError(
            f"{loader.name}: {shorten(node.value)} (line {line}) reads as {value} in YAML (a "
            "leading 0 is octal, a colon base 60): write the number without them, or quote it "
            "for text"
        )
    return int(loader.construct_yaml_int(node))


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _construct_float(loader: _StrictLoader, node: yaml.ScalarNode) -> float:
    """YAML 1.1's floats, but for base 60 (``1:30.5`` is 90.5), refused as ``_construct_int``."""
    if ":" in str(node.value):
        line = node.start_mark.line + 1
        raise ValueError(
            f"{loader.name}: {shorten(node.value)} (line {line}) reads as "
            f"{loader.construct_yaml_float(node)} in YAML (a colon is base 60): write the number "
            "without it, or quote it for text"
        )
    return float(loader.construct_yaml_float(node))


_StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def load_yaml(text: str, *, name: str = "<input>") -> Any:
    """Parse one YAML document strictly (see the module docstring). Raises ``ValueError`` or
    ``yaml.YAMLError`` (syntax).

    The last few documents parsed are remembered (a command reads its plan file more than once:
    which configs it imports, then the plan), and each call gets its own copy."""
    return copy.deepcopy(_parse_yaml(text, name))


@functools.lru_cache(maxsize=8)
def _parse_yaml(text: str, name: str) -> Any:
    """``load_yaml`` without the copy (errors are not remembered)."""
    loader = _StrictLoader(text)
    loader.name = name
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, name) > MAX_VALUES:
            raise ValueError(
                f"{name}: its aliases expand to more than {MAX_VALUES:,} values; refused"
            )
        return loader.construct_document(node)
    except RecursionError:
        raise ValueError(f"{name}: nested too deeply to read") from None
    finally:
        loader.dispose()


def _expanded_size(root: yaml.Node, name: str) -> int:
    """Values in the document once every alias is expanded (a shared node counts each time);
    ValueError for an alias inside the collection it names, which would expand forever."""
    sizes: dict[int, int] = {}
    pending: set[int] = set()  # collections whose children are still being counted
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if children_done or not children:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            pending.discard(id(node))
            continue
        if id(node) in pending:  # met again below itself: an alias to an enclosing collection
            raise ValueError(
                f"{name}: a YAML alias refers to a collection that contains it "
                f"(line {node.start_mark.line + 1}); a document that contains itself is refused"
            )
        pending.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _refuse_duplicates(name: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"{name}: key {shorten(key)} given twice in one JSON object")
            out[key] = value
        return out

    return hook


def _depth(value: Any, limit: int) -> bool:
    """Whether ``value`` nests at most ``limit`` levels (iterative: no recursion to blow)."""
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if level > limit:
            return False
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return True


def load_json(text: str, *, name: str = "<input>") -> Any:
    """Parse JSON strictly: duplicate keys, NaN/Infinity literals and deep nesting are errors.
    Raises ``ValueError`` (``json.JSONDecodeError`` for syntax)."""

    def no_constant(token: str) -> Any:
        raise ValueError(f"{name}: {token} is not a JSON number")

    try:
        data = json.loads(
            text, object_pairs_hook=_refuse_duplicates(name), parse_constant=no_constant
        )
    except RecursionError:
        raise ValueError(f"{name}: nested too deeply to read") from None
    if not _depth(data, MAX_DEPTH):
        raise ValueError(f"{name}: nested deeper than {MAX_DEPTH}")
    return data
