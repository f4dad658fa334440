"""Megatron-LM launch scripts read as a shell would, far enough to find the arguments: comments
and continued lines, quotes, variables (``NAME=value``, ``${NAME:-default}``) and bash arrays
(``NAME=( ... )``, ``+=``); the words after the ``.py`` script are the arguments (a file of
``--flag value`` lines is its own arguments). Control flow is not interpreted. The words then
become flag -> values as argparse keeps them (the last of repeated flags).

    words, notes = _megatron_words(read_input(path, what="Megatron arguments"), path.name)
    values, more_notes = _parse_flags(words, path.name)
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from pathlib import Path

from fileio.strict import shorten

_PUNCTUATION = "();&|\n"
_ARRAY_START = re.compile(r"([A-Za-z_]\w*)(\+?)=")
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=.*", re.DOTALL)
_REFERENCE = re.compile(r"\$\{([A-Za-z_]\w*|\d+)(\[[@*]\])?(?::?-([^}]*))?\}|\$([A-Za-z_]\w*|\d)")
_PREFIXES = {"then", "else", "do", "export", "local", "declare", "readonly", "exec", "time", "!"}
_CONTROL = {"if", "elif", "while", "until", "for", "case"}


def _megatron_words(text: str, file: str) -> tuple[list[str], list[str]]:
    """The argument words: those after the ``.py`` script (a ``pretrain*`` one preferred) in a
    launch script, else every ``--`` argument of the file."""
    statements, control = _shell_statements(_shell_items(text, file))
    notes = []
    if control:
        notes.append(
            f"{file}: shell control flow (if/case/loops) is not interpreted: every assignment "
            "was applied in file order"
        )
    scripts = [(s, i) for s in statements for i, word in enumerate(s) if word.endswith(".py")]
    preferred = [(s, i) for s, i in scripts if Path(s[i]).name.startswith("pretrain")]
    if scripts:
        statement, index = (preferred or scripts)[-1]
        return statement[index + 1 :], notes
    starts = [next((i for i, w in enumerate(s) if w.startswith("--")), len(s)) for s in statements]
    return [word for s, start in zip(statements, starts, strict=True) for word in s[start:]], notes


def _shell_items(text: str, file: str) -> list[str]:
    """Shell words of ``text`` (comments removed, continued lines joined, quotes removed), with
    ``(`` / ``)`` and ``;`` for every statement separator."""
    lexer = shlex.shlex(_uncomment(text), posix=True, punctuation_chars=_PUNCTUATION)
    lexer.whitespace, lexer.whitespace_split, lexer.commenters = " \t\r", True, ""
    try:
        tokens = list(lexer)
    except ValueError as error:  # "No closing quotation"
        raise ValueError(f"{file}: cannot be read as shell words: {error}") from None
    items: list[str] = []
    for token in tokens:
        if not token or not set(token) <= set(_PUNCTUATION):
            items.append(token)
            continue
        for char in token:
            item = char if char in "()" else ";"
            if item != ";" or items[-1:] != [";"]:
                items.append(item)
    return items


def _uncomment(text: str) -> str:
    """``text`` without ``#`` comments and with backslash-continued lines joined."""
    text, out, quote, i = text.replace("\r\n", "\n"), [], "", 0
    while i < len(text):
        char = text[i]
        if char == "\\" and quote != "'":
            out.append(" " if text[i + 1 : i + 2] == "\n" else text[i : i + 2])
            i += 2
            continue
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (not out or out[-1][-1] in " \t\n;|&()"):
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _shell_statements(items: list[str]) -> tuple[list[list[str]], bool]:
    """Commands with variables (``NAME=value``) and bash arrays (``NAME=( ... )``, ``+=``)
    expanded as a shell would, in order; and whether control flow was met."""
    variables: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    statements: list[list[str]] = []
    control = False

    def flush(words: list[str]) -> None:
        nonlocal control
        while words and words[0] in _PREFIXES | _CONTROL:
            control = control or words[0] in _CONTROL
            words = words[1:]
        if words and all(_ASSIGNMENT.fullmatch(w) for w in words):
            for word in words:
                name, value = word.split("=", 1)
                variables[name] = " ".join(_expand(value, variables, arrays))
        elif words:
            statements.append([x for w in words for x in _expand(w, variables, arrays)])

    current: list[str] = []
    i = 0
    while i < len(items):
        start = _ARRAY_START.fullmatch(items[i])
        if start and items[i + 1 : i + 2] == ["("]:
            end = items.index(")", i) if ")" in items[i:] else len(items)
            words = [w for w in items[i + 2 : end] if w not in ("(", ";")]
            elements = [x for w in words for x in _expand(w, variables, arrays)]
            name = start.group(1)
            arrays[name] = (arrays.get(name, []) if start.group(2) else []) + elements
            i = end + 1
            continue
        if items[i] == ";":
            flush(current)
            current = []
        elif items[i] not in ("(", ")"):
            current.append(items[i])
        i += 1
    flush(current)
    return statements, control


def _expand(word: str, variables: dict[str, str], arrays: dict[str, list[str]]) -> list[str]:
    """``$NAME``, ``${NAME}``, ``${NAME:-default}`` and ``${NAME[@]}`` expanded and the result
    split on whitespace (unquoted expansion); unknown variables stay as written."""
    whole = _REFERENCE.fullmatch(word)
    if whole and (whole.group(1) or whole.group(4)) in arrays:
        return list(arrays[whole.group(1) or whole.group(4)])

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(4)
        if name in variables:
            return variables[name]
        if name in arrays:
            return " ".join(arrays[name])
        return match.group(0) if match.group(3) is None else match.group(3)

    return _REFERENCE.sub(value, word).split()


def _parse_flags(words: list[str], file: str) -> tuple[dict[str, list[str]], list[str]]:
    """``--flag value...`` / ``--flag=value`` words as flag -> values (the last of repeated
    flags, as argparse keeps), with a line per repeated flag and for words before any flag."""
    values: dict[str, list[str]] = {}
    counts: Counter[str] = Counter()
    stray: list[str] = []
    current = ""
    for word in words:
        if word.startswith("-") and len(word) > 1 and not _is_number(word):
            current, equals, value = word.partition("=")
            values[current] = [value] if equals else []
            counts[current] += 1
        elif current:
            values[current].append(word)
        else:
            stray.append(word)
    notes = [
        f"{file}: {flag} given {n} times: the last is used" for flag, n in counts.items() if n > 1
    ]
    if stray:
        notes.append(f"{file}: {shorten(' '.join(stray))} before the first flag (ignored)")
    return values, notes


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True
