"""The tools as a caller sees them: a one-line summary and the full definition.

Both the server (``list_tools``, ``describe``) and ``rungctl lint --offline`` build these
from the same ``Tool`` declarations, so what lint checks is what a caller is handed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rungd.core.contract import Tool
from rungd.protocol import ToolDefinition, ToolSummary

if TYPE_CHECKING:
    from rungd.service.stepdown import Mark


def summary(tool: Tool, plugin: str, mark: Mark | None = None) -> ToolSummary:
    """Name, side effect, the ``does`` slot, the plugin that registered it, and its
    step-down mark when an observation fired (``rungd.service.stepdown``)."""
    return ToolSummary(name=tool.name, side_effect=tool.side_effect, summary=tool.description.does, plugin=plugin,
                       step_down=mark.text() if mark else None, suspended=bool(mark and mark.suspended))


def describe(tool: Tool, plugin: str, mark: Mark | None = None) -> ToolDefinition:
    """The full definition of a tool: what a model reads plus what an operator checks (the
    heading, the credentials it declares, its step-down mark)."""
    definition = tool.definition()
    return ToolDefinition(
        name=tool.name,
        description=definition["description"],
        input_schema=definition["input_schema"],
        side_effect=tool.side_effect,
        outputs=dict(tool.outputs),
        errors=[{"code": r.code, "retry": r.retry, "next_action": r.next_action, "hint": r.hint}
                for r in tool.errors],
        deadline_s=tool.timing.deadline_s,
        commit_point=tool.timing.commit_point,
        settle=_settle(tool),
        requires_request_id=tool.requires_request_id,
        cap_bytes=tool.cap_bytes,
        plugin=plugin,
        lint_waivers=dict(tool.lint_waivers),
        heading=tool.heading.as_dict() if tool.heading else None,
        credentials=list(tool.credentials),
        step_down=mark.text() if mark else None,
        suspended=bool(mark and mark.suspended),
    )


def _settle(tool: Tool) -> dict[str, Any] | None:
    """The settle read as a definition shows it: its tool, inputs and, when it has one, what
    it expects (what a caller's reconcile and lint judge by)."""
    settle = tool.timing.settle
    if settle is None:
        return None
    shown: dict[str, Any] = {"tool": settle.tool, "inputs": dict(settle.inputs)}
    if settle.expect:
        shown["expect"] = dict(settle.expect)
    return shown
