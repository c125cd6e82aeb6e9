"""The rule read-backs, settle reads and reconcile judge "it happened" by: literals as
before, and the test tables (present, absent, contains, before_plus...)."""

from __future__ import annotations

import pytest

from rungd.core.contract import SettleSpec, shows


@pytest.mark.parametrize(("fields", "expect", "before", "verdict"), [
    ({"n": "7"}, {"n": 7}, None, True),                        # a literal, compared as text
    ({"n": "7"}, {"n": 8}, None, False),
    ({}, {"n": 7}, None, None),                                # a missing field cannot say
    ({"n": 7}, {"n": None}, None, None),                       # an unbound input cannot either
    ({"lines": ["a"]}, {"lines": {"present": True}}, None, True),
    ({"lines": []}, {"lines": {"present": True}}, None, False),
    ({"lines": []}, {"lines": {"absent": True}}, None, True),
    ({}, {"lines": {"absent": True}}, None, True),
    ({"lines": ["17 3 * * * job"]}, {"lines": {"contains": "job"}}, None, True),
    ({"lines": ["a.tmp"]}, {"lines": {"lacks": ".tmp"}}, None, False),
    ({"v": "x: OK"}, {"v": {"matches": r":\s+OK$"}}, None, True),
    ({"n": 3}, {"n": {"before_plus": 2}}, {"n": 1}, True),
    ({"n": 4}, {"n": {"before_plus": 2}}, {"n": 1}, False),
    ({"n": 3}, {"n": {"before_plus": 2}}, None, None),          # a settle read has no before
    ({"lines": ["a", "b"]}, {"lines": {"before_plus": 1}}, {"lines": ["a"]}, True),  # a list counts
    ({"n": 2}, {"n": {"greater_than_before": True}}, {"n": 1}, True),
    ({"n": 1}, {"n": {"less_than_before": True}}, {"n": 1}, False),
    ({"s": "b"}, {"s": {"differs_from_before": True}}, {"s": "a"}, True),
    ({"n": "x"}, {"n": {"greater_than_before": True}}, {"n": 1}, None),  # not a number: cannot say
])
def test_shows_judges_literals_and_tests(fields, expect, before, verdict) -> None:
    assert shows(fields, expect, before) is verdict


def test_a_settle_spec_binds_the_argument_of_a_test_to_the_calls_input() -> None:
    spec = SettleSpec("x_item_show", {"item": "$item"}, {"owner": {"equals": "$who"}, "n": 3})
    assert spec.bind({"item": "a", "who": "bob"}) == {
        "tool": "x_item_show", "inputs": {"item": "a"}, "expect": {"owner": {"equals": "bob"}, "n": 3}}
