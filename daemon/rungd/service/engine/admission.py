"""Admission: which tool a request names, whether this caller may use it, and its inputs.

The first stage of every call, decided before anything is recorded or run:

    lookup       UNKNOWN_TOOL (with the closest names the caller may use), also for a tool
                 this caller may not use: it learns nothing about what it may not call
    suspended    TOOL_SUSPENDED: a step-down observation fired and the config suspends (stepdown.py)
    validate     BAD_INPUT, naming the field and a valid example
    digest       the input digest the ledger, the idempotency index and approvals share, of
                 the inputs as shown: a sensitive one is its keyed mark (rungd.service.sensitive)
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
from rungd_ledgers import input_digest

from rungd.core.contract import Caller, Tool, ToolInputs
from rungd.core.errors import BadInput, UnknownTool
from rungd.service.engine.policy import Policy
from rungd.service.plugins import RegisteredTool
from rungd.service.sensitive import Marks

if TYPE_CHECKING:
    from rungd.service.stepdown import StepDownWatch


# The logged inputs one received record may carry: far below what a ledger line may be
# (rungd_ledgers.MAX_LINE_BYTES, which every reader holds a line to), so a frame as large as
# server.max_frame_bytes allows can never write a record the daemon's own start-up refuses.
MAX_LOGGED_BYTES = 1 << 20
_json = msgspec.json.encode

@dataclasses.dataclass(frozen=True)
class Admitted:
    """A request that named a tool this caller may use, with inputs that validate.

    Attributes:
        tool: the tool.
        inputs: the validated inputs: what the handler gets, and nothing else.
        shown: the inputs as a person may see them, each sensitive one its mark: what a
            held call shows, and what the digest and the logged inputs are made of.
        digest: ``input_digest`` of ``shown``, as JSON.
        logged: the inputs the tool marks safe to write to the ledger.
        definition: the digest of what the tool was (``plugins.definition_digest``).
    """

    tool: Tool
    inputs: ToolInputs
    shown: ToolInputs
    digest: str
    logged: dict[str, Any]
    definition: str = ""


class Admission:
    """Looks tools up for callers and admits calls.

    Args:
        policy: the tools served and the access rules in force (a reload swaps them).
        marks: what stands for a sensitive input in the digest and wherever inputs show.
    """

    def __init__(self, policy: Policy, marks: Marks) -> None:
        self._policy = policy
        self._marks = marks
        # The daemon's step-down watch, once serving: it marks tools and may suspend them.
        self.step_downs: StepDownWatch | None = None

    def visible_tools(self, caller: Caller) -> list[RegisteredTool]:
        """The tools this caller may call, in name order."""
        return [reg for name, reg in sorted(self._policy.tools.items()) if self._allowed(name, caller)]

    def lookup(self, name: str, caller: Caller) -> RegisteredTool:
        """The tool called ``name``, if this caller may use it.

        Raises:
            UnknownTool: no such tool, or one the caller is not allowed (the same answer);
                the hint lists the closest names the caller may use. Nothing near is ever run.
        """
        reg = self._policy.tools.get(name)
        if reg is None or not self._allowed(name, caller):
            # One answer for a tool that does not exist and one this caller may not use: a
            # caller learns nothing about what it may not call.
            names = [r.tool.name for r in self.visible_tools(caller)]
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.4)
            hint = f"did you mean: {', '.join(close)}?" if close else "list the tools to see what you may call"
            raise UnknownTool(f"no tool named {name!r} that you may call",
                              hint=hint + "; if you need one that is not listed, ask the operator for access. "
                              "Nothing was run.")
        return reg

    def admit(self, name: str, raw: Mapping[str, Any], caller: Caller) -> Admitted:
        """Look the tool up and validate the inputs.

        Raises:
            UnknownTool: as ``lookup``.
            ToolSuspended: a step-down observation fired and the tool is suspended.
            BadInput: the inputs do not validate.
        """
        registered = self.lookup(name, caller)
        tool = registered.tool
        if self.step_downs is not None:
            self.step_downs.refuse_if_suspended(name)
        inputs = tool.validate(raw)
        # Digest and logged fields come from the validated inputs, so whatever a frame
        # carried (bytes, extension types) was refused before it reached the ledger; and
        # from the inputs as shown, so a sensitive value reaches it only as its keyed mark
        # (a plain digest of a PIN is undone by trying every PIN).
        shown = self._marks.shown(inputs)
        plain = shown.model_dump(mode="json")
        logged = {k: plain[k] for k in tool.log_fields if k in plain}
        if logged and len(_json(logged)) > MAX_LOGGED_BYTES:
            raise BadInput(f"{name} writes the inputs {', '.join(sorted(logged))} to the ledger, and these are "
                           f"longer than a ledger record may hold (over {MAX_LOGGED_BYTES} bytes as JSON); "
                           "nothing was recorded or run",
                           hint="send shorter values; a tool that needs long ones must not list them in log_fields")
        return Admitted(tool, inputs, shown, input_digest(name, plain), logged, registered.digest)

    def usable(self, name: str, caller: Caller) -> Tool | None:
        """The tool called ``name`` if this caller may use it, else None: what shapes the
        envelope of its refused call (cap, error table), never telling it apart from none."""
        reg = self._policy.tools.get(name)
        return reg.tool if reg is not None and self._allowed(name, caller) else None

    def tool(self, name: str) -> Tool | None:
        """The tool called ``name`` whoever asks, or None (for envelopes, not for access)."""
        reg = self._policy.tools.get(name)
        return reg.tool if reg is not None else None

    def _allowed(self, name: str, caller: Caller) -> bool:
        return self._policy.config.allowed(name, caller.uid, caller.groups)
