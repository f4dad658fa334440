"""What every importer shares: ``Imported`` (the sections read from one file and a warning line
for each key not carried over), typed reads of a config mapping that name the file and key in
their ``ValueError`` (``_Fields``, ``_read``), and ``merge_sections``, which lays imported
sections over a base plan, later sources winning key by key.

    raw, warnings = merge_sections({"cluster": {"node": "dgx-h100"}}, model, titan)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fileio.strict import read_input, shorten


@dataclass(frozen=True, slots=True, kw_only=True)
class Imported:
    """The plan sections read from one file, and a line for everything not carried over."""

    sections: dict[str, dict[str, Any]]
    """Plan sections with the plan's keys, e.g. ``{"parallel": {...}, "training": {...}}``."""
    warnings: tuple[str, ...]
    """One line per key not understood, not modelled or left out, naming the file and key."""


_MISSING: Any = object()
_AUTO = "auto"
_CONTAINERS = ((str, str), (list, list), (dict, Mapping))
_KIND_NAMES = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
    type(None): "null",
}


def _typed(file: str, key: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    """``value`` checked against ``kind``; JSON's ``5e8`` is an integer, ints are numbers."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if value is None and type(None) in kinds:
        return None
    if isinstance(value, bool):
        if bool in kinds:
            return value
    elif int in kinds and isinstance(value, int):
        return value
    elif int in kinds and isinstance(value, float) and value.is_integer():
        return int(value)
    elif float in kinds and isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    elif any(k in kinds and isinstance(value, c) for k, c in _CONTAINERS):
        return value
    names = " or ".join(_KIND_NAMES[k] for k in kinds)
    raise ValueError(f"{file}: {key} must be {names}, got {shorten(value)}")


class _Fields:
    """One mapping of a config file: typed reads that name the file and key, and the keys
    no read asked for (``left``), in file order."""

    def __init__(self, file: str, data: Any, prefix: str = "") -> None:
        if not isinstance(data, Mapping):
            where = prefix.rstrip(".") or "the file"
            raise ValueError(f"{file}: {where} must be a mapping, got {shorten(data)}")
        self.file, self.data, self.prefix = file, data, prefix
        self.read: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> Any:
        self.read.add(key)
        return self.data.get(key)

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        self.read.add(key)
        if key not in self.data:
            if default is _MISSING:
                raise ValueError(f"{self.file}: missing key {self.prefix}{key}")
            return default
        return _typed(self.file, self.prefix + key, self.data[key], kind)

    def count(self, key: str, default: Any = _MISSING, *, nullable: bool = False) -> Any:
        """A positive integer (a model dimension), or None where ``nullable``."""
        value = self.get(key, (int, type(None)) if nullable else int, default)
        if value is not None and value < 1:
            raise ValueError(f"{self.file}: {self.prefix}{key} must be >= 1, got {value}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.get(key, str, default)
        if value not in choices:
            raise ValueError(
                f"{self.file}: {self.prefix}{key} must be one of {', '.join(choices)}, "
                f"got {shorten(value)}"
            )
        return value

    def sub(self, key: str) -> _Fields:
        """The mapping under ``key`` (empty when absent, so its defaults apply)."""
        self.read.add(key)
        return _Fields(self.file, self.data.get(key, {}), f"{self.prefix}{key}.")

    def note(self, key: str, why: str) -> str:
        self.read.add(key)
        return f"{self.file}: {self.prefix}{key} {why}"

    def left(self) -> list[str]:
        return [
            f"{self.file}: {self.prefix}{key} is not modelled (ignored)"
            for key in self.data
            if key not in self.read
        ]


def _read(path: Path, what: str, parse: Callable[[str, str], Any]) -> _Fields:
    file = Path(path).name
    text = read_input(path, what=what)
    try:
        data = parse(text, file)
    except ValueError as error:  # json.JSONDecodeError and tomllib.TOMLDecodeError included
        message = str(error).splitlines()[0]
        raise ValueError(message if message.startswith(file) else f"{file}: {message}") from None
    return _Fields(file, data)


def merge_sections(
    base: Mapping[str, Any], *imported: Imported
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``base`` (a plan mapping) with the imported sections laid over it in order, the later
    value winning key by key; the warnings of every import, then a line per replaced value.

    A ``model: <preset>`` string in ``base`` becomes ``{"preset": ...}`` so keys can join it.
    """
    if not isinstance(base, Mapping):
        raise ValueError(f"the base plan must be a mapping, got {shorten(base)}")
    merged: dict[str, Any] = dict(base)
    if isinstance(merged.get("model"), str):
        merged["model"] = {"preset": merged["model"]}
    warnings = [w for item in imported for w in item.warnings]
    for index, item in enumerate(imported, 1):
        for section, keys in item.sections.items():
            target = merged.get(section, {})
            if not isinstance(target, Mapping):
                raise ValueError(f"base plan section '{section}' must be a mapping")
            target = merged[section] = dict(target)
            for key, value in keys.items():
                if key in target and target[key] != value:
                    warnings.append(
                        f"merge: {section}.{key}={shorten(target[key])} replaced by "
                        f"{shorten(value)} (import {index})"
                    )
                target[key] = value
    return merged, tuple(warnings)
