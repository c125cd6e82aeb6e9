"""What a read must show for an effect to count as happened: the one rule read-backs, the
settle read and reconcile judge by (``rungd.core.contract.shows`` delegates here).

An expectation maps a field of the read to either a literal (the field equals it, compared
as text, since a parsed "7" and an input 7 mean the same) or a one-key table naming a test:

======================  ========================================================================
``{equals = V}``         the field equals V (the same as the literal V)
``{present = true}``     the field is there and not empty (``present = false``: the opposite)
``{absent = true}``      the field is missing or empty (no line, an empty list, "")
``{contains = V}``       a list field has an item containing V as text; a text field contains V
``{lacks = V}``          the opposite of ``contains``
``{matches = RE}``       the field (or an item of a list field) matches the regular expression
``{before_plus = N}``    a number (or a list's length) is the read before plus N
``{greater_than_before = true}`` / ``{less_than_before = true}`` / ``{differs_from_before = true}``
======================  ========================================================================

The last four compare with the read made before the act. A settle read after a timeout or a
crash has no such read, so they make it answer "cannot say" (None), never a guess: the
outcome then stays unknown for reconcile, or for an explicit settle with absolute tests.
Everything here is plain data (it is kept in the ledger with the envelope's settle).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# The tests an expectation table may name; "before" ones need the read before the act.
# How much of a field a ``matches`` test reads: fields are short values, and a longer one is
# cut rather than handed whole to a pattern on the event loop.
MATCH_CHARS = 8192

ABSOLUTE = frozenset({"equals", "present", "absent", "contains", "lacks", "matches"})
RELATIVE = frozenset({"before_plus", "greater_than_before", "less_than_before", "differs_from_before"})
TESTS = ABSOLUTE | RELATIVE


def test_of(value: Any) -> tuple[str, Any] | None:
    """The (test, argument) an expectation names, or None for a literal value.

    A mapping of exactly one known test is a test; any other value is a literal, so every
    expectation written before tests existed means what it meant.
    """
    if isinstance(value, Mapping) and len(value) == 1:
        (name, arg), = value.items()
        if name in TESTS:
            return name, arg
    return None


def is_relative(value: Any) -> bool:
    """Whether an expectation compares with the read before the act."""
    test = test_of(value)
    return test is not None and test[0] in RELATIVE


def judge(fields: Mapping[str, Any], expect: Mapping[str, Any],
          before: Mapping[str, Any] | None = None) -> bool | None:
    """Whether ``fields`` show every expectation of ``expect``.

    Args:
        fields: what the read found.
        expect: field -> literal or test table (see the module docstring), already bound to
            the call's inputs.
        before: the same read made before the act; None when there was none (a settle read).

    Returns:
        True or False; None when the read cannot say: a field a test needs is missing, an
        expectation is unbound (None), or a test needs the read before and there is none.
    """
    verdicts = [_one(fields, name, value, before) for name, value in expect.items()]
    if any(v is None for v in verdicts):
        return None
    return all(verdicts)


def _one(fields: Mapping[str, Any], name: str, value: Any, before: Mapping[str, Any] | None) -> bool | None:
    test = test_of(value)
    op, arg = test if test is not None else ("equals", value)
    if arg is None:
        return None  # an input the call left out: nothing to compare with
    found = fields.get(name)
    if op in ("present", "absent"):
        there = name in fields and not _empty(found)
        return there == (bool(arg) if op == "present" else not arg)
    if name not in fields:
        return None
    if op == "equals":
        return str(found) == str(arg)
    if op in ("contains", "lacks"):
        items = found if isinstance(found, list) else [found]
        has = any(str(arg) in str(item) for item in items)
        return has if op == "contains" else not has
    if op == "matches":
        # On the loop: the pattern was checked at load against catastrophic backtracking, and
        # the text is bounded, so a merely polynomial pattern stays short too.
        items = found if isinstance(found, list) else [found]
        return any(re.search(str(arg), str(item)[:MATCH_CHARS]) for item in items)
    if before is None or name not in before:
        return None
    if op == "differs_from_before":
        return bool(arg) == (str(found) != str(before[name]))
    now, then, step = _number(found), _number(before[name]), _number(arg)
    if now is None or then is None:
        return None
    if op == "before_plus":
        return None if step is None else now == then + step
    if op == "greater_than_before":
        return bool(arg) == (now > then)
    return bool(arg) == (now < then)  # less_than_before


def _empty(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, (list, dict)) and not value)


def _number(value: Any) -> float | None:
    """A field as a number: a list counts its items; text must read as a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (list, dict)):
        return float(len(value))
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
