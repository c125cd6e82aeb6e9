"""The one exception tree of rungd, and the table of stable error codes.

Every failure a caller can see has a stable code. The code decides whether a retry can help
(``retry``) and what the caller should do next (``next_action``); the message says what
happened and the hint says what a correct call looks like or what to try next.

    RungdError                      base: code, message, hint, outcome, settle
    ├── BadInput                    BAD_INPUT
    ├── UnknownTool                 UNKNOWN_TOOL
    ├── Denied                      DENIED
    ├── GateDenied                  GATE_DENIED
    ├── ApprovalExpired             APPROVAL_EXPIRED
    ├── AuthRequired                AUTH_REQUIRED
    ├── PromptUnexpected            PROMPT_UNEXPECTED
    ├── SurfaceChanged              SURFACE_CHANGED
    ├── ToolTimeout                 TIMEOUT
    ├── ReconcileRequired           RECONCILE_REQUIRED
    ├── IdempotencyMismatch         IDEMPOTENCY_MISMATCH
    ├── Locked                      LOCKED
    ├── StaleExport                 STALE_EXPORT
    ├── ImportPartial               IMPORT_PARTIAL
    ├── Busy                        BUSY
    ├── UnexpectedState             UNEXPECTED_STATE
    ├── Interrupted                 INTERRUPTED
    ├── LedgerUnavailable           LEDGER_UNAVAILABLE
    ├── Failed                      FAILED
    ├── Conflict                    CONFLICT
    ├── ToolSuspended               TOOL_SUSPENDED (a step-down fired; an operator resumes it)
    ├── ToolError                   any code a tool declares in its own error table
    ├── UnknownCall                 UNKNOWN_CALL (a protocol error: no call to put it in)
    ├── UnknownEvidence             UNKNOWN_EVIDENCE (a protocol error, as UnknownCall)
    └── EvidenceGone                EVIDENCE_GONE (a protocol error: pruned, and when and why)

Exactly one boundary (``rungd.service.engine.outcomes``) turns these into result envelopes and
protocol errors. Code that raises them never builds an envelope itself, and nothing changes
an exception after it is raised.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

Retry = Literal["yes", "no", "after_check"]
NextAction = Literal[
    "continue",
    "repair",
    "reconcile",
    "wait_approval",
    "request_authority",
    "retry_later",
    "stop",
]
Outcome = Literal["done", "not_started", "unknown"]

# code -> (retry, next_action, meaning). The meaning column is what `rungctl lint` and the
# README print; it is the DESIGN.md table, word for word where it fits.
CORE_ERRORS: dict[str, tuple[Retry, NextAction, str]] = {
    "BAD_INPUT": ("no", "repair", "inputs failed validation; hint names the field and a valid example"),
    "UNKNOWN_TOOL": ("no", "repair", "no such tool; hint lists the closest names; never runs a near match"),
    "DENIED": ("no", "request_authority", "this caller may not use this tool"),
    "GATE_DENIED": ("no", "stop", "a person refused the call; outcome not_started"),
    "APPROVAL_EXPIRED": ("no", "stop", "nobody approved in time; outcome not_started"),
    "AUTH_REQUIRED": ("no", "request_authority", "the program asked for a credential the daemon does not hold"),
    "PROMPT_UNEXPECTED": ("no", "stop", "the program asked a question nobody declared; hint quotes it"),
    "SURFACE_CHANGED": ("no", "stop", "output or export no longer parses / header differs; hint shows the diff"),
    "TIMEOUT": ("after_check", "reconcile", "deadline passed; tree killed; outcome not_started or unknown"),
    "RECONCILE_REQUIRED": ("after_check", "reconcile", "a repeat of a request whose outcome is unknown"),
    "IDEMPOTENCY_MISMATCH": ("no", "repair", "same request_id, different inputs"),
    "LOCKED": ("yes", "retry_later", "a person or another program holds the file or resource"),
    "STALE_EXPORT": ("no", "stop", "the export is older than the tool allows"),
    "IMPORT_PARTIAL": ("no", "stop", "the import took fewer records than were written"),
    "BUSY": ("yes", "retry_later", "the tool's concurrency limit is reached; nothing started"),
    "UNEXPECTED_STATE": ("no", "stop", "the read-back moved somewhere the tool did not expect"),
    "INTERRUPTED": ("after_check", "reconcile", "the daemon stopped mid-call; outcome unknown"),
    "LEDGER_UNAVAILABLE": ("yes", "retry_later", "the ledger cannot be written; nothing dispatched"),
    "FAILED": ("no", "stop", "an exit status no table names, or exit 0 with nothing on stdout and words on "
               "stderr; hint is the stderr tail, redacted"),
    "CONFLICT": ("no", "repair", "a write's precondition failed: what the caller read is no longer true; "
                 "outcome not_started; fields carry the current value"),
    "TOOL_SUSPENDED": ("no", "stop", "the program's surface changed (a step-down observation fired); an operator "
                                     "was told and must resume the tool; nothing was run"),
}


class RungdError(Exception):
    """Base of every error a caller can see.

    Args:
        message: what happened, in words a caller can branch on.
        hint: what a correct call looks like, or what to try next.
        outcome: whether the effect may have begun, when the raiser knows (``not_started``:
            refused before acting; ``done``: it read the state back). Left out, the daemon
            decides from the call's commit point: ``not_started`` before it; after it
            ``unknown`` for a write and ``done`` for a read.
        settle: ``{"tool": ..., "inputs": {...}}``, the read that tells what happened when
            the outcome is unknown.
        fields: output fields worth returning even on failure (a quoted prompt, counts).
        effect: what changed although the call failed (an import taken in part, a service
            restarted that did not come back): ``changed`` only after a read-back.
    """

    code: ClassVar[str] = "FAILED"

    def __init__(
        self,
        message: str,
        *,
        hint: str = "",
        outcome: Outcome | None = None,
        settle: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
        retry: Retry | None = None,
        next_action: NextAction | None = None,
        effect: Literal["changed", "no_change", "none"] = "none",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.effect = effect
        self.hint = hint
        # Left out, the outcome is decided at the boundary from the call's commit point:
        # code deep in a runner or parser rarely knows whether the effect had begun.
        self.outcome: Outcome = outcome or "not_started"
        self.outcome_declared = outcome is not None
        self.settle = settle
        self.fields = fields or {}
        default_retry, default_next, _ = CORE_ERRORS.get(self.code, ("no", "stop", ""))
        self.retry: Retry = retry or default_retry
        self.next_action: NextAction = next_action or default_next


class BadInput(RungdError):
    code = "BAD_INPUT"


class UnknownTool(RungdError):
    code = "UNKNOWN_TOOL"


class Denied(RungdError):
    code = "DENIED"


class GateDenied(RungdError):
    code = "GATE_DENIED"


class ApprovalExpired(RungdError):
    code = "APPROVAL_EXPIRED"


class AuthRequired(RungdError):
    code = "AUTH_REQUIRED"


class PromptUnexpected(RungdError):
    code = "PROMPT_UNEXPECTED"


class SurfaceChanged(RungdError):
    code = "SURFACE_CHANGED"


class ToolTimeout(RungdError):
    code = "TIMEOUT"


class ReconcileRequired(RungdError):
    code = "RECONCILE_REQUIRED"


class IdempotencyMismatch(RungdError):
    code = "IDEMPOTENCY_MISMATCH"


class Locked(RungdError):
    code = "LOCKED"


class StaleExport(RungdError):
    code = "STALE_EXPORT"


class ImportPartial(RungdError):
    code = "IMPORT_PARTIAL"


class Busy(RungdError):
    code = "BUSY"


class UnexpectedState(RungdError):
    code = "UNEXPECTED_STATE"


class Interrupted(RungdError):
    code = "INTERRUPTED"


class LedgerUnavailable(RungdError):
    code = "LEDGER_UNAVAILABLE"


class Failed(RungdError):
    code = "FAILED"


class Conflict(RungdError):
    """What the caller read (an ``expected_*`` input) is no longer true; nothing was done.

    Repeating the same stale request cannot resolve it: the caller re-reads, then decides.
    """

    code = "CONFLICT"


class ToolSuspended(RungdError):
    """The tool is suspended: a step-down observation fired and the operator's
    configuration suspends such tools until someone runs ``rungctl resume TOOL``."""

    code = "TOOL_SUSPENDED"


class ToolError(RungdError):
    """An error code from a tool's own error table (NOT_FOUND, UNHEALTHY_AFTER_RESTART, ...).

    The tool's declaration supplies retry and next_action for its codes;
    ``rungd.service.engine.outcomes`` fills them in from the table when the raiser did not.
    """

    def __init__(self, code: str, message: str, **kwargs: Any) -> None:
        self.code = code  # type: ignore[misc]  # per-instance code is the point of this class
        super().__init__(message, **kwargs)


class UnknownCall(RungdError, KeyError):
    """No call (or request) with that id is known to this caller.

    Also a ``KeyError``: it is a failed lookup, and code that looks calls up by id reads so.
    """

    code = "UNKNOWN_CALL"

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class UnknownEvidence(RungdError, KeyError):
    """No evidence with that id is known to this caller: never written, or another caller's.

    The two read the same, so evidence ids of others cannot be probed.
    """

    code = "UNKNOWN_EVIDENCE"

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class EvidenceGone(RungdError):
    """The evidence existed and was pruned; the message says when and why."""

    code = "EVIDENCE_GONE"


class ConfigError(Exception):
    """The configuration or a tool file is wrong. Raised at start-up, never to a caller.

    The message names the file, the key and a valid example.
    """


class PluginError(Exception):
    """A plugin failed to load or registered something invalid. Raised at start-up."""
