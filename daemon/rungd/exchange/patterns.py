"""Regular expressions an operator writes, refused when they can backtrack catastrophically.

Python's ``re`` backtracks: ``(a+)+$`` against thirty ``a`` and a ``!`` tries about 2^30
ways before it fails, holding a thread (or the event loop) for a minute. Such patterns
are found statically, at load time, from the parsed pattern (``re._parser``, the parser
``re.compile`` itself uses):

* a repeat inside another repeat, where one iteration of the inner one can end in more
  than one place: what the inner repeat matches overlaps with what may follow it in the
  same iteration, or (wrapping around) with how the next iteration starts. ``(a+)+``,
  ``(.*)*``, ``(\\w+\\s?)*``, ``(a|a)*`` and ``(a|ab)*`` are refused; ``(\\d+\\.){3}`` and
  ``(?:\\s+\\w+)*`` are not, since a delimiter decides where each iteration ends;
* branches of an alternation inside a repeat that can start with the same character;
* a repeated body that can match the empty string.

Possessive quantifiers (``a++``) and atomic groups (``(?>...)``) never give back what
they matched, so nothing inside them is ambiguous; the error's hint suggests them.

    reason = catastrophic(r"(a+)+$")      # "a repeat inside a repeat ... (a+)"; None if safe

Character classes are compared on a sample alphabet (ASCII, Latin-1 and a few others), so
the check is a sound filter for the common shapes, not a proof; patterns that pass are
still matched off the event loop with a time bound.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from re import _constants as C  # noqa: N812 - the names re._parser itself uses
from re import _parser

# The characters classes are compared on: every ASCII and Latin-1 one, and a few others
# that categories treat specially (non-ASCII digits, letters and line separators).
ALPHABET = frozenset(chr(i) for i in range(256)) | frozenset("\u0663\u4e2d\u00df\u2028\u2029\u3000\u0430")
_CATEGORY = {
    C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_SPACE: r"\s", C.CATEGORY_NOT_SPACE: r"\S",
    C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W",
}
_REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT)


def catastrophic(pattern: str) -> str | None:
    """Why ``pattern`` can backtrack catastrophically, or None when no known shape is found.

    Raises:
        re.error: the pattern does not compile.
    """
    return _check(_parser.parse(pattern), None)


def polynomial(pattern: str) -> str | None:
    """Why ``pattern`` may take time growing as a power of its text's length, or None: two
    unbounded repeats that can take the same characters with nothing required between them
    (``\\s*\\s*\\S`` on a blank row tries every split of it, then fails). Not
    catastrophic, but too slow for a pattern matched in the event loop (a screen's waits,
    on every redraw); a filter for the common shape, like :func:`catastrophic`.

    Raises:
        re.error: the pattern does not compile.
    """
    carried: frozenset[str] | None = None  # what the unbounded repeats since the last required item take
    for op, av in _flat(_parser.parse(pattern)):
        if op in _REPEATS:
            low, high, body = av
            chars, _ = _first(body)
            if high == C.MAXREPEAT:
                if carried is not None and carried & chars:
                    return f"two repeats one after the other can take the same characters: {_show(op, av)}"
                carried = chars if carried is None else carried | chars
                continue
            if low == 0:
                continue  # optional: whatever was carried is carried past it
        elif op in (C.POSSESSIVE_REPEAT, C.ATOMIC_GROUP):
            carried = None  # gives nothing back
            continue
        if not _first([(op, av)])[1]:
            carried = None  # a required item: the repeats on each side of it are split by it
    return None


def _flat(seq: Sequence[Any]) -> list[Any]:
    """``seq`` with its groups' contents in line."""
    items: list[Any] = []
    for op, av in seq:
        if op == C.SUBPATTERN:
            items += _flat(av[3])
        else:
            items.append((op, av))
    return items


@functools.lru_cache(maxsize=512)
def refused_in_loop(pattern: str) -> str | None:
    """Why ``pattern`` is too slow to match in the event loop, remembered per pattern:
    polynomial or catastrophic (an invalid one is refused too)."""
    try:
        return polynomial(pattern) or catastrophic(pattern)
    except re.error as exc:
        return f"not a valid regular expression: {exc}"


@functools.lru_cache(maxsize=512)
def refused(pattern: str) -> str | None:
    """``catastrophic`` remembered per pattern (for checks repeated at run time); an invalid
    pattern is refused too."""
    try:
        return catastrophic(pattern)
    except re.error as exc:
        return f"not a valid regular expression: {exc}"


def refuse(found: dict[str, str | None], owner: str) -> None:
    """Raise ValueError for the first of ``found`` (name -> pattern) that is refused.

    For the specs a plugin builds at start-up: a bad pattern stops the plugin loading,
    with the field named, before any call can run it.
    """
    for name, pattern in found.items():
        if pattern and (reason := refused(pattern)):
            raise ValueError(f"{owner}.{name} {pattern!r} is refused: {reason}; hint: {HINT}")


HINT = ("rewrite it so each part has one way to match: make inner repeats possessive (a++, \\w*+) or atomic "
        "((?>...)), or separate repeats by a character they cannot match")


def _check(seq: Sequence[Any], wrap: frozenset[str] | None) -> str | None:
    """Walk ``seq``; ``wrap`` is the first characters of the enclosing repeat's body (None
    outside any repeat): what may follow the end of ``seq`` in the next iteration."""
    items = list(seq)
    for i, (op, av) in enumerate(items):
        follow = _follow(items[i + 1:], wrap)
        if op in _REPEATS:
            low, high, body = av
            if wrap is not None and low != high:
                chars, empty = _first(body)
                if empty:
                    return f"a repeat inside a repeat can match nothing: {_show(op, av)}"
                if follow is not None and chars & follow:
                    return f"a repeat inside a repeat can end in more than one place: {_show(op, av)}"
            if high > 1:
                chars, empty = _first(body)
                if empty and high == C.MAXREPEAT:
                    return f"a repeated part can match nothing: {_show(op, av)}"
                inner = _check(body, chars | (follow or frozenset()) if wrap is not None else chars)
            else:
                inner = _check(body, follow if wrap is not None else None)
            if inner:
                return inner
        elif op in (C.POSSESSIVE_REPEAT, C.ATOMIC_GROUP):
            continue  # gives nothing back: no ambiguity inside matters
        elif op == C.SUBPATTERN:
            if reason := _check(list(av[3]) + items[i + 1:], wrap):
                return reason
            return None  # the rest was checked with the group
        elif op == C.BRANCH:
            if reason := _branches(av[1], items[i + 1:], wrap):
                return reason
            return None
        elif op in (C.ASSERT, C.ASSERT_NOT):
            if reason := _check(av[1], None):
                return reason
    return None


def _branches(branches: Sequence[Any], rest: list[Any], wrap: frozenset[str] | None) -> str | None:
    if wrap is not None:
        # A branch that can match nothing starts with whatever follows the alternation.
        follow = _follow(rest, wrap) or frozenset()
        seen: frozenset[str] = frozenset()
        empties = 0
        for branch in branches:
            chars, empty = _first(branch)
            empties += empty
            chars |= follow if empty else frozenset()
            if chars & seen or empties > 1:
                return "branches of an alternation inside a repeat can match alike: " + _sample(chars & seen)
            seen |= chars
    for branch in branches:
        if reason := _check(list(branch) + rest, wrap):
            return reason
    return None


def _follow(rest: Sequence[Any], wrap: frozenset[str] | None) -> frozenset[str] | None:
    """What can come right after a position: the rest of the sequence's first characters,
    plus ``wrap`` when the rest can match nothing."""
    chars, empty = _first(rest)
    if empty:
        return chars | wrap if wrap is not None else None
    return chars


def _first(seq: Sequence[Any]) -> tuple[frozenset[str], bool]:
    """The characters a match of ``seq`` can start with, and whether it can be empty."""
    found: frozenset[str] = frozenset()
    for op, av in seq:
        chars, empty = _first_item(op, av)
        found |= chars
        if not empty:
            return found, False
    return found, True


def _first_item(op: Any, av: Any) -> tuple[frozenset[str], bool]:
    if op == C.LITERAL:
        return frozenset(chr(av)), False
    if op == C.NOT_LITERAL:
        return ALPHABET - {chr(av)}, False
    if op == C.ANY:
        return ALPHABET, False
    if op == C.IN:
        return _class(av), False
    if op == C.SUBPATTERN:
        return _first(av[3])
    if op == C.ATOMIC_GROUP:
        return _first(av)
    if op == C.BRANCH:
        parts = [_first(b) for b in av[1]]
        return frozenset().union(*(c for c, _ in parts)), any(e for _, e in parts)
    if op in (*_REPEATS, C.POSSESSIVE_REPEAT):
        chars, empty = _first(av[2])
        return chars, empty or av[0] == 0
    if op in (C.GROUPREF, C.GROUPREF_EXISTS):
        return ALPHABET, True
    return frozenset(), True  # anchors and lookarounds match no character


def _class(items: Sequence[Any]) -> frozenset[str]:
    chars: set[str] = set()
    negate = False
    for op, av in items:
        if op == C.NEGATE:
            negate = True
        elif op == C.LITERAL:
            chars.add(chr(av))
        elif op == C.RANGE:
            chars.update(c for c in ALPHABET if av[0] <= ord(c) <= av[1])
        elif op == C.CATEGORY and av in _CATEGORY:
            category = re.compile(_CATEGORY[av])
            chars.update(c for c in ALPHABET if category.fullmatch(c))
        else:
            chars.update(ALPHABET)  # anything unusual: assume it can match anything
    return ALPHABET - chars if negate else frozenset(chars)


def _show(op: Any, av: Any) -> str:
    low, high, _ = av
    bound = "*" if (low, high) == (0, C.MAXREPEAT) else "+" if (low, high) == (1, C.MAXREPEAT) else (
        f"{{{low},{'' if high == C.MAXREPEAT else high}}}")
    return f"a part repeated {bound}"


def _sample(chars: frozenset[str]) -> str:
    return repr("".join(sorted(chars)[:5]))
