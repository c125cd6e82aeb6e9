"""Deliberately bad tools, for ``rungctl lint``'s tests. Never copy these.

Each tool carries mistakes seed 002 and issue 6 name, the kind a plugin author makes when
wrapping a program in a hurry; ``tests/authoring/test_lint.py`` expects a finding, by code, for each.

    run                    a one-word name with a vague verb; a permanent write with empty
                           description slots, an untyped and undescribed input, a closed
                           set as a free string, no outputs, no error table, no settle read
    doStuff                camelCase; a one-line description that restates the name; a
                           write settled by a tool that does not exist; TIMEOUT marked
                           retry=yes on a write; an own error code without a hint
    billing_customers_get  a visible write named like a read, one letter away from
                           billing_customer_get
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from rungd.sdk import (
    Description,
    ErrorRule,
    Result,
    SettleSpec,
    Timing,
    Tool,
    ToolInputs,
    hookimpl,
)


class OneLine(Description):
    """A description that bypasses the six slots: only its first one is ever shown."""

    def text(self) -> str:
        return self.does


class RunInputs(ToolInputs):
    target: Any = None  # no type, no description, no example
    mode: str = "fast"  # a closed set (fast or slow) left as a free string


class CustomerInputs(ToolInputs):
    customer: Annotated[str, Field(pattern=r"^C[0-9]{4}$", description="The customer's id, from the CRM.",
                                   examples=["C1042"])]


async def handler(ctx: Any, inputs: Any) -> Result:  # pragma: no cover - the linter never calls
    return Result()


GOOD_ENOUGH = Description(
    does="Reads one customer's billing record: plan, balance and payment method. Changes nothing.",
    use_when="you need a customer's current balance or plan.",
    do_not_use_when="you want to change the plan; no tool here does that.",
    returns="customer, plan, balance_cents.",
    on_error="NOT_FOUND when there is no such customer (check the id; do not retry).",
    if_unknown="if you do not know the customer id, ask the user; do not guess.",
)
NOT_FOUND = ErrorRule("NOT_FOUND", "no", "repair", "check the customer id; ids look like C1042")


def tools() -> list[Tool]:
    run = Tool(
        name="run",
        description=Description("Runs.", "", "", "", "", ""),
        inputs=RunInputs,
        outputs={},
        handler=handler,
        side_effect="irreversible",
    )
    do_stuff = Tool(
        name="doStuff",
        description=OneLine("Does stuff.", "", "", "", "", ""),
        inputs=RunInputs,
        outputs={"result": "what happened"},
        handler=handler,
        side_effect="reversible",
        errors=(ErrorRule("TIMEOUT", "yes", "retry_later"), ErrorRule("oops", "no", "stop")),
        timing=Timing(settle=SettleSpec("stuff_status_show", {"target": "$target"})),
    )
    customer = Tool(
        name="billing_customer_get",
        description=GOOD_ENOUGH,
        inputs=CustomerInputs,
        outputs={"customer": "the id", "plan": "plan name", "balance_cents": "balance in cents"},
        handler=handler,
        errors=(NOT_FOUND, ErrorRule.core("SURFACE_CHANGED"), ErrorRule.core("TIMEOUT")),
    )
    customers = Tool(
        name="billing_customers_get",
        description=GOOD_ENOUGH,
        inputs=CustomerInputs,
        outputs={"customer": "the id", "plan": "plan name", "balance_cents": "balance in cents"},
        handler=handler,
        side_effect="visible",
        errors=(NOT_FOUND, ErrorRule.core("SURFACE_CHANGED"), ErrorRule.core("TIMEOUT")),
        timing=Timing(settle=SettleSpec("billing_customer_get", {"customer": "$customer"})),
    )
    return [run, do_stuff, customer, customers]


@hookimpl
def rungd_register_tools(register: Any) -> None:
    for tool in tools():
        register(tool)
