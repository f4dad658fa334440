"""Selecting records with a small expression language (``--holdout`` and ``--only``).

Terms joined by ``&`` (all must hold); each term is ``KEY=V1,V2`` (one of the values),
``KEY!=V1,V2`` or ``KEY<V``, ``<=``, ``>``, ``>=`` for numbers. Keys: ``op``, ``algo`` (our names
or NCCL's), ``nodes``, ``world``, ``size`` (binary K/M/G suffixes allowed), ``placement``
(``in``/``out``). Several selectors: a record matches if any does.

    op=all_gather,reduce_scatter      nodes=8      size<1M      op=all_reduce & nodes>=2

    held = [parse_selector("nodes=8")]; train = [r for r in records if not any_matches(held, r)]
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vocab.records import NCCL_ALGO_NAMES, Record
from vocab.sizes import parse_size

_COMPARATORS: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le, ">=": operator.ge, "!=": operator.ne, "<": operator.lt, ">": operator.gt,
    "=": operator.eq,
}  # fmt: skip
_TERM = re.compile(r"^\s*(\w+)\s*(<=|>=|!=|<|>|=)\s*(.+?)\s*$")
_KEYS = ("op", "algo", "nodes", "world", "size", "placement")


@dataclass(frozen=True, slots=True, kw_only=True)
class Term:
    """One condition on a record field."""

    key: str
    """Field: op, algo, nodes, world, size or placement."""
    comparator: str
    """One of = != < <= > >=."""
    values: tuple[Any, ...]
    """Allowed values (= and !=) or the one bound."""

    def matches(self, record: Record) -> bool:
        """Whether ``record`` satisfies this condition."""
        value = _field(record, self.key)
        if self.comparator == "=":
            return value in self.values
        if self.comparator == "!=":
            return value not in self.values
        return bool(_COMPARATORS[self.comparator](value, self.values[0]))

    def __str__(self) -> str:
        values = ",".join(_format_value(self.key, v) for v in self.values)
        return f"{self.key}{self.comparator}{values}"

    def negated(self) -> Term:
        """The term that holds exactly where this one does not (``op=a`` -> ``op!=a``)."""
        return Term(key=self.key, comparator=_NEGATIONS[self.comparator], values=self.values)


_NEGATIONS = {"=": "!=", "!=": "=", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}


def _format_value(key: str, value: Any) -> str:
    """A selector value as typed: sizes with the largest binary suffix that divides them."""
    if key != "size":
        return str(value)
    for suffix, shift in (("G", 30), ("M", 20), ("K", 10)):
        if value and value % (1 << shift) == 0:
            return f"{value >> shift}{suffix}"
    return str(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Selector:
    """Terms that must all hold; the text it was parsed from."""

    text: str
    """The expression as given."""
    terms: tuple[Term, ...]
    """Conditions, AND-ed."""

    def matches(self, record: Record) -> bool:
        """Whether every term holds for ``record``."""
        return all(term.matches(record) for term in self.terms)


def _field(record: Record, key: str) -> Any:
    if key == "op":
        return record.op
    if key == "algo":
        return NCCL_ALGO_NAMES.get((record.algo or "").lower(), record.algo)
    if key == "nodes":
        return record.num_nodes
    if key == "world":
        return record.world_size
    if key == "size":
        return record.size_bytes
    return "in" if record.in_place else "out"


def parse_selector(text: str) -> Selector:
    """Parse ``op=all_gather & size>=1M`` (see the module docstring); ValueError if malformed."""
    terms = []
    for part in text.split("&"):
        match = _TERM.match(part)
        if match is None or match.group(1) not in _KEYS:
            raise ValueError(
                f"bad selector term {part.strip()!r} in {text!r}; use KEY=V1,V2 or KEY<V with KEY "
                f"in {', '.join(_KEYS)} (e.g. op=all_gather, nodes=8, size<1M)"
            )
        key, comparator, raw = match.groups()
        values = tuple(_value(key, v.strip()) for v in raw.split(","))
        if comparator not in ("=", "!=") and (len(values) != 1 or isinstance(values[0], str)):
            raise ValueError(f"{key}{comparator}{raw}: ordering needs one number")
        terms.append(Term(key=key, comparator=comparator, values=values))
    return Selector(text=text, terms=tuple(terms))


def _value(key: str, text: str) -> Any:
    if key in ("nodes", "world"):
        if not text.isdigit():
            raise ValueError(f"{key} takes an integer, got {text!r}")
        return int(text)
    if key == "size":
        return parse_size(text)
    return text


def any_matches(selectors: Sequence[Selector], record: Record) -> bool:
    """Whether ``record`` matches at least one selector."""
    return any(s.matches(record) for s in selectors)


def describe_holdout(selectors: Sequence[Selector]) -> str:
    """How a hold-out split reads, naming both sides without a double negation.

    >>> describe_holdout([parse_selector("op!=all_reduce,all_gather")])
    'fitted on op=all_reduce,all_gather, scored on op!=all_reduce,all_gather'
    >>> describe_holdout([parse_selector("size<1M & nodes=1")])
    'fitted on size>=1M | nodes!=1, scored on size<1M & nodes=1'
    """
    held = " | ".join(" & ".join(map(str, s.terms)) for s in selectors)
    if len(selectors) == 1:
        fitted = " | ".join(str(t.negated()) for t in selectors[0].terms)
    elif all(len(s.terms) == 1 for s in selectors):
        fitted = " & ".join(str(s.terms[0].negated()) for s in selectors)
    else:
        fitted = "the other records"
    return f"fitted on {fitted}, scored on {held}"
