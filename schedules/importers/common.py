"""What every importer shares: ``Imported`` (the sections read from one file and a warning line
for each key not carried over), typed reads of a config mapping that name the file and key in
their ``ValueError`` (``_Fields``, ``_read``), and ``merge_sections``, which lays imported
sections over a base plan, later sources winning key by key.

    raw, warnings = merge_sections({"cluster": {"node": "dgx-h100"}}, model, titan)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fileio.strict import MAX_CONFIG_BYTES, TYPO_CUTOFF, did_you_mean, read_input, shorten


@dataclass(frozen=True, slots=True, kw_only=True)
class Imported:
    """The plan sections read from one file, and a line for everything not carried over."""

    sections: dict[str, dict[str, Any]]
    """Plan sections with the plan's keys, e.g. ``{"parallel": {...}, "training": {...}}``."""
    file: str = ""
    """The file read (its name, as every warning line starts)."""
    warnings: tuple[str, ...]
    """One line per key not understood, not modelled or left out, naming the file and key."""
    ignored: tuple[str, ...] = ()
    """Keys read and set aside because they change nothing a step costs (token ids, norm
    epsilons, logging): counted in ``summary``, not listed."""
    asks: Mapping[str, str] = field(default_factory=dict)
    """Warning line -> the plan key (``section.key``) it asks the user to give: a plan that
    gives that key answers the line, and ``summary`` leaves it out."""

    def summary(self, given: Collection[str] = ()) -> str | None:
        """The warnings as one line naming the file once: the notes that change the result
        first, then the Hugging Face Trainer's ``"auto"`` values with the plan keys to set, the
        keys not modelled, and a count of the ignored ones. A line asking for a key in ``given``
        (``section.key`` names the plan sets itself) is left out. None: nothing to say."""
        prefix = f"{self.file}: " if self.file else ""
        lines = [w.removeprefix(prefix) for w in self.warnings if self.asks.get(w) not in given]
        autos = [w.split(_AUTO_MARK)[0] for w in lines if _AUTO_MARK in w]
        unknown = [w.removesuffix(f" {NOT_MODELLED}") for w in lines if w.endswith(NOT_MODELLED)]
        parts = [w for w in lines if _AUTO_MARK not in w and not w.endswith(NOT_MODELLED)]
        if autos:
            keys = dict.fromkeys(
                self.asks[w] for w in self.warnings if _AUTO_MARK in w and self.asks[w] not in given
            )
            parts.append(
                f"{', '.join(autos)} 'auto' (the Hugging Face Trainer fills them in): set "
                + ", ".join(keys)
            )
        if unknown:
            parts.append(f"not modelled (ignored): {', '.join(unknown)}")
        if self.ignored:
            one = len(self.ignored) == 1
            parts.append(
                f"{len(self.ignored)} key{'' if one else 's'} ignored that "
                f"change{'s' if one else ''} nothing a step costs"
            )
        return prefix + "; ".join(parts) if parts else None


NOT_MODELLED = "is not modelled (ignored)"
"""How a warning line for a key no read asked for ends (``_Fields.left``)."""
_MISSING: Any = object()
_AUTO = "auto"
_AUTO_MARK = " is 'auto'"
"""How a line for an HF Trainer ``"auto"`` value names it (``deepspeed._auto_note``)."""
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

    def __init__(
        self, file: str, data: Any, prefix: str = "", *, noise: Collection[str] = (),
        ignored: list[str] | None = None, asks: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        if not isinstance(data, Mapping):
            where = prefix.rstrip(".") or "the file"
            raise ValueError(f"{file}: {where} must be a mapping, got {shorten(data)}")
        self.file, self.data, self.prefix = file, data, prefix
        self.read: set[str] = set()
        self.noise = noise
        """Dotted keys that change nothing a step costs: ``left`` counts them in ``ignored``."""
        self.ignored: list[str] = [] if ignored is None else ignored  # shared with sub-mappings
        self.asks: dict[str, str] = {} if asks is None else asks

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
        prefix = f"{self.prefix}{key}."
        return _Fields(
            self.file, self.data.get(key, {}), prefix, noise=self.noise, ignored=self.ignored,
            asks=self.asks,
        )  # fmt: skip

    def note(self, key: str, why: str) -> str:
        self.read.add(key)
        return f"{self.file}: {self.prefix}{key} {why}"

    def left(self) -> list[str]:
        """A line per key no read asked for; the noise keys go to ``ignored`` instead."""
        unread = [f"{self.prefix}{key}" for key in self.data if key not in self.read]
        self.ignored.extend(name for name in unread if name in self.noise)
        known = [f"{self.prefix}{key}" for key in self.read]  # a typo of one is named
        return [
            f"{self.file}: {name}{did_you_mean(name, known, cutoff=TYPO_CUTOFF)} {NOT_MODELLED}"
            for name in unread
            if name not in self.noise
        ]

    def ask(self, line: str, plan_key: str) -> str:
        """``line``, recorded as answered by a plan that gives ``plan_key`` itself."""
        self.asks[line] = plan_key
        return line

    def imported(self, sections: dict[str, dict[str, Any]], notes: list[str]) -> Imported:
        """``Imported`` of this file: ``notes``, then the keys no read asked for."""
        warnings = (*notes, *self.left())
        return Imported(
            sections=sections, file=self.file, warnings=warnings, ignored=tuple(self.ignored),
            asks=dict(self.asks),
        )  # fmt: skip


def _read(
    path: Path, what: str, parse: Callable[[str, str], Any], noise: Collection[str] = ()
) -> _Fields:
    file = Path(path).name
    text = read_input(path, what=what, max_bytes=MAX_CONFIG_BYTES)
    try:
        data = parse(text, file)
    except ValueError as error:  # json.JSONDecodeError and tomllib.TOMLDecodeError included
        message = str(error).splitlines()[0]
        raise ValueError(message if message.startswith(file) else f"{file}: {message}") from None
    return _Fields(file, data, noise=noise)


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
