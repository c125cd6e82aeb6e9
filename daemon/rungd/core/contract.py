"""The five-part tool contract, the six description slots, and what a handler sees.

A plugin declares each tool once, as a ``Tool``. The same declaration validates inputs
(a strict pydantic model), produces the definition a model reads (``Tool.definition``), and
tells the daemon how to gate, time out, settle and cap the call. Nothing about a tool is
written twice.

    Tool
    ├── name, description (six slots)
    ├── inputs        1. a ToolInputs subclass: closed, strict, every field described
    ├── outputs       2. field name -> what it holds; cap_bytes
    ├── errors        3. the tool's own error rules, beside the core codes
    ├── side_effect   4. read | reversible | visible | irreversible (+ a stricter gate)
    ├── timing        5. deadline, commit point, settle read (one attempt: rungd never retries)
    ├── heading       the rung, what was ruled out, step down / climb, budget, session
    ├── credentials   the credential names the tool uses (the session may name only these)
    └── handler       async (CallContext, inputs) -> Result
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import re
import string
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from rungd.core import expectations
from rungd.core.envelope import DEFAULT_CAP_BYTES, Effect
from rungd.core.errors import CORE_ERRORS, BadInput, NextAction, Outcome, Retry
from rungd.core.vocabulary import DISGUISING, Gate

# The most a result may hold (``Tool.cap_bytes``), as a tool file's cap_bytes: results are kept
# in the ledger, whose lines are bounded (rungd_ledgers.MAX_LINE_BYTES).
MAX_CAP_BYTES = 1 << 20

SideEffect = Literal["read", "reversible", "visible", "irreversible"]
CommitPoint = Literal["spawn", "confirmation", "callback"]

# Longest string an input may carry when its field declares no max_length of its own.
DEFAULT_MAX_STR = 4096


@dataclasses.dataclass(frozen=True)
class Description:
    """The six slots a model reads (seed 002's template). Each is one or two sentences."""

    does: str
    use_when: str
    do_not_use_when: str
    returns: str
    on_error: str
    if_unknown: str

    SLOTS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("does", "Does"),
        ("use_when", "Use when"),
        ("do_not_use_when", "Do not use when"),
        ("returns", "Returns"),
        ("on_error", "On error"),
        ("if_unknown", "If unknown"),
    )

    def text(self) -> str:
        """The slots joined into one description, one labelled line each."""
        return "\n".join(f"{label}: {getattr(self, attr).strip()}" for attr, label in self.SLOTS)


@dataclasses.dataclass(frozen=True)
class ErrorRule:
    """One row of a tool's error table: a stable code and what a caller should do."""

    code: str
    retry: Retry
    next_action: NextAction
    hint: str = ""
    meaning: str = ""

    @classmethod
    def core(cls, code: str, hint: str = "") -> ErrorRule:
        """A row for one of the core codes, with the core retry and next_action."""
        retry, next_action, meaning = CORE_ERRORS[code]
        return cls(code, retry, next_action, hint, meaning)


@dataclasses.dataclass(frozen=True)
class SettleSpec:
    """The read that settles an unknown outcome: a tool, its inputs, and what it shows
    when the effect happened.

    ``inputs`` maps each input of the settle tool, and ``expect`` each field of its result,
    to the name of an input of this call (``"$name"``) or to a literal value. With
    ``expect``, the daemon decides by itself whether the effect happened: at once, in the
    call whose outcome became unknown (``at_once``), or later through ``reconcile``.
    """

    tool: str
    inputs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    expect: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Run the read as soon as a write's outcome is unknown, in the same call, and let it
    # decide done or not_started; False leaves the outcome unknown for reconcile.
    at_once: bool = True

    def bind(self, call_inputs: Mapping[str, Any]) -> dict[str, Any]:
        def one(value: Any) -> Any:
            return call_inputs.get(value[1:]) if isinstance(value, str) and value.startswith("$") else value

        def fill(mapping: Mapping[str, Any]) -> dict[str, Any]:
            # An expectation may be a test table ({"equals": "$name"}): its argument binds too.
            return {key: {k: one(v) for k, v in value.items()} if isinstance(value, Mapping) else one(value)
                    for key, value in mapping.items()}

        return {"tool": self.tool, "inputs": fill(self.inputs), "expect": fill(self.expect)}


# The ladder of seed 000: the surfaces an operation can be reached through, highest first.
RUNGS: dict[int, str] = {1: "API", 2: "command line", 3: "file", 4: "recorded script", 5: "structured UI",
                         6: "screen"}
RungTest = Literal["present", "unattended", "readable back"]
RUNG_TESTS: tuple[RungTest, ...] = ("present", "unattended", "readable back")
_CODE = re.compile(r"^[A-Z][A-Z0-9_]{2,40}$")


@dataclasses.dataclass(frozen=True)
class RuledOut:
    """A higher rung this operation does not use, and the test it fails.

    Attributes:
        rung: the rung ruled out (1 API ... 6 screen), higher than the tool's own.
        fails: ``present`` (the surface lacks the operation), ``unattended`` (it needs a
            person mid-run) or ``readable back`` (its result cannot be read back).
        why: one line of evidence, e.g. "the vendor's API has no restart call".
    """

    rung: int
    fails: RungTest
    why: str = ""

    def __post_init__(self) -> None:
        if self.rung not in RUNGS:
            raise ValueError(f"ruled out rung {self.rung}: rungs are 1 to 6 ({_rung_list()})")
        if self.fails not in RUNG_TESTS:
            raise ValueError(f"ruled out rung {self.rung}: fails {self.fails!r}; one of {', '.join(RUNG_TESTS)}")

    def text(self) -> str:
        return f"{self.rung} {RUNGS[self.rung]} fails \"{self.fails}\"" + (f": {self.why}" if self.why else "")


@dataclasses.dataclass(frozen=True)
class StepDown:
    """An observation that moves this operation to the next rung below: ``count`` results
    with one of ``codes``, either in a row (``within_s`` None: a result of any other code
    breaks the row) or within a sliding window of ``within_s`` seconds.

    The daemon watches for it in the ledger's ``finished`` records as calls finish
    (``rungd.service.stepdown``): "3 SURFACE_CHANGED in a row" is
    ``StepDown(("SURFACE_CHANGED",), count=3)``; "PROMPT_UNEXPECTED twice in 24 h" is
    ``StepDown(("PROMPT_UNEXPECTED",), count=2, within_s=86400)``; "UNEXPECTED_STATE
    once" is ``StepDown(("UNEXPECTED_STATE",))``.

    Attributes:
        codes: the error codes observed (one string is taken as a one-code tuple).
        count: how many results it takes (1 = once).
        within_s: the window, or None for "in a row".
        to: where the operation moves, for the person told, e.g. "rung 4, the dashboard's button".
    """

    codes: tuple[str, ...]
    count: int = 1
    within_s: float | None = None
    to: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.codes, str):
            object.__setattr__(self, "codes", (self.codes,))
        if not self.codes or any(not _CODE.match(code) for code in self.codes):
            raise ValueError(f"step down codes {self.codes!r}: give error codes like SURFACE_CHANGED")
        if self.count < 1:
            raise ValueError(f"step down count {self.count}: at least 1 (1 means once)")
        if self.within_s is not None and self.within_s <= 0:
            raise ValueError(f"step down window {self.within_s} s: positive, or None for 'in a row'")

    def text(self) -> str:
        """The observation in words: "SURFACE_CHANGED 3 times in a row -> rung 4, ..."."""
        times = {1: "once", 2: "twice"}.get(self.count, f"{self.count} times")
        span = "" if self.count == 1 and self.within_s is None else (
            " in a row" if self.within_s is None else f" within {span_text(self.within_s)}")
        return f"{' or '.join(self.codes)} {times}{span}" + (f" -> {self.to}" if self.to else "")


@dataclasses.dataclass(frozen=True)
class Session:
    """Who is signed in for the tool: the credentials it uses, who provides them, and what
    the tool returns when they expire.

    Attributes:
        credentials: credential names, each one the tool declares (``Tool.credentials``).
        provided_by: who provides them and where they live, e.g. "the operator, in
            /etc/rungd/credentials.toml" or "none: the daemon's own user".
        on_expiry: the error code a call returns when they expire (AUTH_REQUIRED).
    """

    provided_by: str
    credentials: tuple[str, ...] = ()
    on_expiry: str = "AUTH_REQUIRED"

    def __post_init__(self) -> None:
        object.__setattr__(self, "credentials", tuple(self.credentials))
        if not _CODE.match(self.on_expiry):
            raise ValueError(f"session on_expiry {self.on_expiry!r}: give an error code like AUTH_REQUIRED")


@dataclasses.dataclass(frozen=True)
class Heading:
    """The heading of seed 000's WRAPPER CONTRACT: the rung the operation is reached
    through, the higher rungs ruled out, the observations that move it down and back up,
    the attempt budget, and the session.

    For operators and auditors: ``describe`` and the exports carry it beside the
    definition; it never enters the description a model reads.

    Attributes:
        rung: 1 API, 2 command line, 3 file, 4 recorded script, 5 structured UI, 6 screen.
        ruled_out: each higher rung and the test it fails.
        step_down: the observations that move the operation down a rung; the daemon
            watches for them and tells a person (and may suspend the tool).
        climb: the observation that moves it back up, in words.
        attempts: the most attempts a caller should spend on one request (rungd itself
            never retries: a call is one attempt).
        session: who is signed in, or None for a tool that uses no credential.
    """

    rung: int
    ruled_out: tuple[RuledOut, ...] = ()
    step_down: tuple[StepDown, ...] = ()
    climb: str = ""
    attempts: int = 1
    session: Session | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ruled_out", tuple(self.ruled_out))
        object.__setattr__(self, "step_down", tuple(self.step_down))
        if self.rung not in RUNGS:
            raise ValueError(f"rung {self.rung}: rungs are 1 to 6 ({_rung_list()})")
        for out in self.ruled_out:
            if out.rung >= self.rung:
                raise ValueError(f"ruled out rung {out.rung}: only rungs above rung {self.rung} are ruled out")
        if self.attempts < 1:
            raise ValueError(f"attempts {self.attempts}: at least 1")

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``describe`` and the exports, with each observation's words."""
        return {
            "rung": self.rung,
            "rung_name": RUNGS[self.rung],
            "ruled_out": [{"rung": r.rung, "fails": r.fails, "why": r.why} for r in self.ruled_out],
            "step_down": [{"codes": list(s.codes), "count": s.count, "within_s": s.within_s, "to": s.to,
                           "text": s.text()} for s in self.step_down],
            "climb": self.climb,
            "attempts": self.attempts,
            "session": None if self.session is None else {
                "credentials": list(self.session.credentials), "provided_by": self.session.provided_by,
                "on_expiry": self.session.on_expiry},
        }


def span_text(seconds: float) -> str:
    """A window in the units a person says it in: 90 -> "90s", 3600 -> "1h", 86400 -> "24h"."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0 and not (unit == "d" and seconds < 7 * 86400):
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _rung_list() -> str:
    return ", ".join(f"{n} {name}" for n, name in RUNGS.items())


@dataclasses.dataclass(frozen=True)
class Precondition:
    """What a write needs to still be true when it acts (an expected revision, seed 003).

    Right before the handler runs, the daemon runs the read ``tool`` with ``inputs`` and
    compares its fields with ``expect``, both bound like a settle read (``"$name"`` is an
    input of this call). An expectation bound to an input the caller left out (None) is
    not checked, so ``expected_count`` can be optional. When the read shows something else
    the call ends CONFLICT, outcome not_started, with the current fields; nothing ran.

    ``lock`` (``"item:{item}"``, filled from the inputs) is held from the check to the end
    of the call, so no other rungd call with the same key can act in between. A lock with
    no precondition just serialises calls on one resource.
    """

    tool: str = ""
    inputs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    expect: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    lock: str = ""

    def bind(self, call_inputs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The read's inputs and the expectations to check, for one call's inputs."""
        def value(v: Any) -> Any:
            return call_inputs.get(v[1:]) if isinstance(v, str) and v.startswith("$") else v

        expect = {k: value(v) for k, v in self.expect.items()}
        return {k: value(v) for k, v in self.inputs.items()}, {k: v for k, v in expect.items() if v is not None}

    def lock_key(self, call_inputs: Mapping[str, Any]) -> str | None:
        """The lock's name for one call, or None without a lock."""
        return self.lock.format_map({k: str(v) for k, v in call_inputs.items()}) if self.lock else None


def shows(fields: Mapping[str, Any], expect: Mapping[str, Any],
          before: Mapping[str, Any] | None = None) -> bool | None:
    """Whether a read's fields show every expected value: a literal (compared as text, since
    a parsed "7" and an input 7 mean the same) or a test table such as ``{"present": True}``
    or ``{"before_plus": 1}`` (``rungd.core.expectations`` lists them). The one rule read-backs
    and reconcile both judge by.

    Args:
        before: the same read made before the act, for tests that compare with it.

    Returns:
        None when the read cannot say: an expected field is missing, an expectation is
        unbound, or a test needs the read before and there is none (a settle read).
    """
    return expectations.judge(fields, expect, before)


@dataclasses.dataclass(frozen=True)
class Timing:
    """Part 5 of the contract: deadline, commit point, settle read.

    There is one attempt per call: rungd never retries a program by itself; the caller
    decides from the envelope's ``retry`` and ``next_action``.

    ``commit_point`` is the moment after which the effect may have begun: ``spawn`` (the
    program started), ``confirmation`` (the daemon answered its confirmation prompt), or
    ``callback`` (the handler calls ``CallContext.mark_committed``). A timeout before it is
    ``not_started``; after it, ``unknown`` with the settle read in the envelope.
    """

    deadline_s: float = 30.0
    commit_point: CommitPoint = "spawn"
    settle: SettleSpec | None = None


class ToolInputs(BaseModel):
    """Base for every tool's inputs: closed, strict, and safe to pass as whole arguments.

    Beyond the field's own constraints, every string (also inside lists) is refused when it
    holds a NUL byte, when it is longer than ``DEFAULT_MAX_STR`` and the field sets no
    ``max_length``, or when it starts with ``-`` (it would read as an option to the legacy
    program) unless the field allows that with ``json_schema_extra={"allow_dash": True}``.
    Line breaks (``\n``, ``\r``, U+0085, U+2028, U+2029), tabs and every other control
    character are refused too: a program that echoes an input would otherwise print fields
    of its own choosing (``x\nrole=admin``) into output the tool parses. A field that takes
    text of several lines says so with ``json_schema_extra={"allow_multiline": True}``,
    which lets ``\n``, ``\r`` and ``\t`` through, and nothing else.

    A text field nobody but the program may read (a new account's initial password, a PIN)
    says so with ``json_schema_extra={"sensitive": True}``: the handler gets the value, and
    everywhere else (pending, the ledger, errors, the envelope) shows its keyed mark
    (``rungd.service.sensitive``), and the value is redacted from what the program prints.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @classmethod
    # Asked at every call; a class's fields never change. Bounded: each reload makes new classes.
    @functools.lru_cache(maxsize=4096)
    def sensitive_fields(cls) -> frozenset[str]:
        """The names of the fields marked ``json_schema_extra={"sensitive": True}``."""
        return frozenset(name for name, field in cls.model_fields.items()
                         if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("sensitive"))

    def __repr_args__(self) -> Any:
        # A handler that logs its inputs, or an error that formats them, shows no secret.
        hidden = self.sensitive_fields()
        for name, value in super().__repr_args__():
            yield name, "<sensitive>" if name in hidden and value is not None else value

    @field_validator("*", mode="after")
    @classmethod
    def _inert_strings(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        extra = field.json_schema_extra if field and isinstance(field.json_schema_extra, dict) else {}
        has_max = field is not None and any(
            getattr(m, "max_length", None) is not None for m in field.metadata
        )
        multiline = bool(extra.get("allow_multiline"))
        for text in _strings_in(value):
            if "\x00" in text:
                raise ValueError("must not contain a NUL byte")
            if (disguise := _DISGUISING.search(text)) is not None:
                raise ValueError(f"must not contain U+{ord(disguise.group()):04X}, an invisible character that "
                                 "changes how text shows (refused in every input: what runs is what a person sees)")
            bad = _control_character(text, multiline)
            if bad is not None:
                raise ValueError(f"must not contain the control character U+{ord(bad):04X} "
                                 "(line breaks and control characters are refused in one-line inputs)")
            if not has_max and len(text) > DEFAULT_MAX_STR:
                raise ValueError(f"must be at most {DEFAULT_MAX_STR} characters")
            if text.startswith("-") and not extra.get("allow_dash"):
                raise ValueError("must not start with '-' (it would be read as an option)")
        return value


# Characters that break a line or steer a terminal: C0 and C1 controls, and the Unicode
# line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_MULTILINE_OK = frozenset("\n\r\t")
_DISGUISING = re.compile(f"[{DISGUISING}]")


def _control_character(text: str, multiline: bool) -> str | None:
    """The first control character of ``text`` that the field does not allow, or None."""
    for match in _CONTROL.finditer(text):
        if not (multiline and match.group() in _MULTILINE_OK):
            return match.group()
    return None


def _strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings_in(v)]
    return []


class NoInputs(ToolInputs):
    """For tools that take nothing."""


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who is calling, as the kernel reports the socket peer (SO_PEERCRED)."""

    uid: int
    gid: int
    pid: int
    groups: frozenset[int] = frozenset()


@dataclasses.dataclass
class Result:
    """What a handler returns when the call worked. Failures are raised, never returned.

    ``effect`` must be ``changed`` only after a read-back, named in ``verified_by``.
    """

    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    effect: Effect = "none"
    verified_by: str | None = None
    as_of: str | None = None
    truncated: bool = False
    narrow: str | None = None
    evidence: list[str] = dataclasses.field(default_factory=list)
    outcome: Outcome = "done"


@dataclasses.dataclass
class CallContext:
    """What a handler knows about its call. Built by the daemon, one per call.

    ``deadline`` is a ``trio.current_time()`` value; the daemon cancels the handler at that
    moment, and the runner kills the program's tree on that cancellation.
    """

    call_id: str
    tool: Tool
    caller: Caller
    request_id: str | None
    deadline: float
    work_dir: Path
    evidence_dir: Path
    committed: bool = False
    spawned: bool = False
    credentials: Callable[[str], str | None] = lambda name: None
    evidence: list[str] = dataclasses.field(default_factory=list)
    # The values this call must not show: its sensitive inputs, and the credentials it
    # obtained through ``credentials``. Redacted from the program's output and evidence, and
    # from the result's fields and errors (a parser may decode an escaped form the output
    # redaction missed; a handler may quote an input in its error).
    secrets: list[str] = dataclasses.field(default_factory=list)
    # What the runner answered on the call's behalf (a confirmation, a credential by name):
    # the daemon writes one ``answered`` ledger record for each.
    answered: list[str] = dataclasses.field(default_factory=list)
    # The daemon's reaper of adopted orphans; the runner registers the children it spawns
    # with it so their exit statuses are left for Trio. None outside a daemon.
    reaper: Any = None
    # The daemon's askpass endpoint (rungd.runner.askpass_server.AskpassEndpoint), or None
    # outside a daemon: then each call makes its own.
    askpass: Any = None
    # Reads the handler made before acting: (read tool, its inputs, its fields). The settle
    # read judges by the one with its own tool and inputs (``read_before``).
    reads_before: list[tuple[str, dict[str, Any], dict[str, Any]]] = dataclasses.field(default_factory=list)
    # The throw-away daemon of ``rungctl check`` or eval's dry run only (``Daemon(stand_in=)``,
    # rungd.authoring.plugin_check): what every program of the call runs instead,
    # ``stand_in.program(ctx, program) -> Program``. None under ``rungd serve``: nothing on
    # the wire or in a file can set it.
    stand_in: Any = None

    def mark_committed(self) -> None:
        """Record that the effect may have begun: a timeout from now on is ``unknown``."""
        self.committed = True

    def mark_spawned(self) -> None:
        """Record that a program of the call started (the runner calls it at spawn).

        The commit point may shorten the work, never decide the truth alone: once a write's
        program ran, its error is ``unknown`` until a read says whether anything moved.
        """
        self.spawned = True

    def may_have_acted(self) -> bool:
        """Whether the effect may have begun: past the commit point, or, for a write, once
        its program ran at all (a program may act before the question it is stopped at)."""
        return self.committed or (self.spawned and self.tool.side_effect != "read")

    def note_read_before(self, tool: str, inputs: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
        """Record a read the handler made before acting, as the read tool ``tool`` with
        ``inputs`` would answer it (the same fields).

        When the call's outcome becomes unknown, its settle read is judged against this
        read: a state the read before already showed is not credited to this call.
        """
        self.reads_before.append((tool, dict(inputs), dict(fields)))

    def read_before(self, tool: str, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
        """The fields of the last read noted before the act as ``tool`` with ``inputs``, or None."""
        for noted_tool, noted_inputs, fields in reversed(self.reads_before):
            if noted_tool == tool and noted_inputs == dict(inputs):
                return fields
        return None

    def evidence_path(self, label: str) -> tuple[str, Path]:
        """A fresh evidence file for this call: its id (for the envelope) and path."""
        evidence_id = f"{self.call_id}.{len(self.evidence) + 1}.{label}"
        self.evidence.append(evidence_id)
        return evidence_id, self.evidence_dir / evidence_id


Handler = Callable[[CallContext, Any], Awaitable[Result]]


@dataclasses.dataclass(frozen=True)
class Tool:
    """One task-shaped tool: the whole five-part contract and its handler."""

    name: str
    description: Description
    inputs: type[ToolInputs]
    outputs: Mapping[str, str]
    handler: Handler
    side_effect: SideEffect = "read"
    errors: tuple[ErrorRule, ...] = ()
    timing: Timing = Timing()
    cap_bytes: int = DEFAULT_CAP_BYTES
    concurrency: int | None = None
    gate: Gate | None = None
    log_fields: tuple[str, ...] = ()
    # rungctl lint codes this tool answers for, each with the reason a reviewer reads.
    lint_waivers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # A write's expected revision and resource lock (see Precondition).
    precondition: Precondition | None = None
    # The contract's heading (rung, step down, session); None until its author writes one.
    heading: Heading | None = None
    # The credential names the tool may obtain (``CallContext.credentials``, a Program's
    # env, file, prompt or askpass credentials); the heading's session names only these.
    credentials: tuple[str, ...] = ()
    # What the tool runs, as its plugin knows it (a tool file: its program's and its tool's
    # tables, as JSON): part of the tool's digest in the ledger. Left empty, the digest takes
    # the source file of the handler's module instead.
    provenance: str = ""
    # What a call will do with these inputs (as shown: a sensitive one is its mark), one line
    # per step, for the operator deciding a held call (a screen tool's steps and what each
    # types). Left None, an approver sees the inputs alone.
    plan: Callable[[Mapping[str, Any]], tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "credentials", tuple(self.credentials))
        if not issubclass(self.inputs, ToolInputs):
            raise TypeError(f"tool {self.name}: inputs must subclass rungd.core.contract.ToolInputs")
        unknown = set(self.log_fields) - set(self.inputs.model_fields)
        if unknown:
            raise TypeError(f"tool {self.name}: log_fields names unknown inputs {sorted(unknown)}")
        if self.precondition is not None:
            _check_precondition(self)
        _check_sensitive(self)
        if self.cap_bytes > MAX_CAP_BYTES:
            # The result is kept whole in the ledger, to answer a repeat: a ledger line is bounded.
            raise TypeError(f"tool {self.name}: cap_bytes {self.cap_bytes} is over the {MAX_CAP_BYTES} a result may "
                            "hold; long output belongs in evidence")

    @property
    def requires_request_id(self) -> bool:
        return self.side_effect != "read"

    def input_schema(self) -> dict[str, Any]:
        """The JSON schema a model reads, generated from the model that validates."""
        schema = self.inputs.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
            prop.pop("allow_dash", None)
            prop.pop("allow_multiline", None)
            prop.pop("sensitive", None)  # the daemon's business: the model sends it like any other
        schema.setdefault("properties", {})
        schema.setdefault("required", [])
        schema["additionalProperties"] = False
        return schema

    def definition(self) -> dict[str, Any]:
        """Name, description (six slots joined) and input schema: what a model is handed."""
        return {
            "name": self.name,
            "description": self.description.text(),
            "input_schema": self.input_schema(),
        }

    def error_rule(self, code: str) -> ErrorRule | None:
        for rule in self.errors:
            if rule.code == code:
                return rule
        if code in CORE_ERRORS:
            return ErrorRule.core(code)
        return None

    def validate(self, raw: Mapping[str, Any]) -> ToolInputs:
        """Validate raw inputs, or raise BadInput naming the field and a valid example.

        Names the tool does not have are refused before validation: its cost grows with
        every error it describes, and a frame can hold tens of thousands of names.
        """
        unknown = raw.keys() - self.inputs.model_fields.keys()
        if unknown:  # an input published under its alias is no stranger
            unknown -= {field.alias for field in self.inputs.model_fields.values() if field.alias}
        if unknown:
            some = unknown if len(unknown) <= 100 else itertools.islice(unknown, 100)
            named = sorted(map(repr, some))[:3]
            what = (f"{named[0]} is not an input" if len(unknown) == 1 else
                    f"{', '.join(named)}{f' (and {len(unknown) - 3} more)' if len(unknown) > 3 else ''} are not inputs")
            names = ", ".join(sorted(self.inputs.model_fields)) or "none"
            raise BadInput(f"invalid inputs: {what} of {self.name}",
                           hint=f"its inputs are {names}. {self._valid_call()}")
        try:
            return self.inputs.model_validate(dict(raw))
        except pydantic.ValidationError as exc:
            # Each error becomes a dict: ask once, without copies of the inputs.
            errors = exc.errors(include_url=False, include_context=False, include_input=False)
            raise BadInput(_describe_validation(errors, exc.error_count()), hint=self._example_hint(errors)) from None

    def example_inputs(self) -> dict[str, Any]:
        """A valid call's inputs, from the first example of every field; a field that may be
        left out (its default is None, like an ``expected_*`` check) is left out."""
        example = {}
        for name, field in self.inputs.model_fields.items():
            if not field.is_required() and field.default is None:
                continue
            if field.examples:
                example[name] = field.examples[0]
            elif field.is_required():
                example[name] = "<" + name + ">"
        return example

    def _example_hint(self, errors: list[Any]) -> str:
        names = sorted(self.inputs.model_fields)
        parts = []
        for err in errors[:3]:
            field = str(err["loc"][0]) if err["loc"] else ""
            info = self.inputs.model_fields.get(field)
            if info is None and err["type"] == "extra_forbidden":
                parts.append(f"'{field}' is not an input of {self.name}; its inputs are {', '.join(names) or 'none'}")
            elif info is not None and info.description:
                parts.append(f"{field}: {info.description.rstrip('.')}")
        parts.append(self._valid_call())
        return ". ".join(parts)

    def _valid_call(self) -> str:
        example = json.dumps(self.example_inputs(), ensure_ascii=False)
        key = " with a request_id unique to this change" if self.requires_request_id else ""
        return f"a valid call: {self.name} {example}{key}"


def _check_precondition(tool: Tool) -> None:
    """A precondition guards a write, and names only inputs the tool has."""
    pre = tool.precondition
    assert pre is not None
    if tool.side_effect == "read":
        raise TypeError(f"tool {tool.name}: a read has no precondition; it changes nothing")
    named = {v[1:] for v in (*pre.inputs.values(), *pre.expect.values()) if isinstance(v, str) and v.startswith("$")}
    named |= {field for _, field, _, _ in string.Formatter().parse(pre.lock) if field}
    unknown = named - set(tool.inputs.model_fields)
    if unknown:
        raise TypeError(f"tool {tool.name}: the precondition names unknown inputs {sorted(unknown)}")
    if pre.expect and not pre.tool:
        raise TypeError(f"tool {tool.name}: the precondition expects fields but names no read tool")


def _check_sensitive(tool: Tool) -> None:
    """A sensitive input is text, and no read the daemon shows or keeps for later takes it.

    The settle read is echoed in the envelope and kept in the ledger for ``reconcile`` to run
    later, and a precondition read is a call of its own, with its own records: a value bound
    into either is shown, or lost (its mark is no password), so neither may name one.
    """
    sensitive = tool.inputs.sensitive_fields()
    if not sensitive:
        return
    for name in sorted(sensitive):
        if tool.inputs.model_fields[name].annotation not in (str, str | None):
            raise TypeError(f"tool {tool.name}: the sensitive input {name} must be a str (or str | None): "
                            "a value the program reads as text, which the daemon can mark and redact")
    bound = [value for spec in (tool.timing.settle, tool.precondition) if spec is not None
             for value in _bound_values(spec.inputs, spec.expect)]
    named = {v[1:] for v in bound if isinstance(v, str) and v.startswith("$")}
    if tool.precondition is not None:
        named |= {field for _, field, _, _ in string.Formatter().parse(tool.precondition.lock) if field}
    if named & sensitive:
        raise TypeError(f"tool {tool.name}: its settle read or precondition names the sensitive inputs "
                        f"{sorted(named & sensitive)}; settle and precondition reads are shown and kept, so they "
                        "may take only inputs that may be shown")


def _bound_values(*mappings: Mapping[str, Any]) -> list[Any]:
    """Every value of ``mappings``, and the argument of each test table among them."""
    found: list[Any] = []
    for mapping in mappings:
        for value in mapping.values():
            found.extend(value.values() if isinstance(value, Mapping) else [value])
    return found


def _describe_validation(errors: list[Any], count: int) -> str:
    problems = []
    for err in errors[:3]:
        where = ".".join(str(p) for p in err["loc"]) or "inputs"
        problems.append(f"{where}: {err['msg']}")
    more = count - len(problems)
    tail = f" (and {more} more)" if more > 0 else ""
    return "invalid inputs: " + "; ".join(problems) + tail
