"""The shape of a tool file: one TOML file per legacy program, validated strictly.

Every key is checked; a misspelled key is an error, not a silently ignored setting. See
``configs/tools/`` for commented examples and ``plugins/README.md`` for the guide.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rungd.sdk import Gate, NextAction, Retry

NAME = r"^[a-z][a-z0-9]*(_[a-z0-9]+){1,5}$"
CODE = r"^[A-Z][A-Z0-9_]{2,40}$"
FieldType = Literal["string", "integer", "number", "boolean"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FilterSpec(_Strict):
    """An export tool's input that filters rows: ``filter = { column = "status", op = "eq" }``."""

    column: str
    op: Literal["eq", "ne", "lt", "le", "gt", "ge", "contains", "prefix"] = "eq"


class ExportSpec(_Strict):
    """Rung 3: a read served from the newest complete export file a program writes."""

    folder: str
    pattern: str = Field(description="a shell pattern for the file name, e.g. stock-*.csv")
    format: Literal["csv", "tsv", "jsonl"] = "csv"
    delimiter: str = Field(",", min_length=1, max_length=1)
    encoding: str = "utf-8"
    preamble_lines: int = Field(0, ge=0)
    columns: dict[str, Literal["string", "integer", "number", "decimal", "boolean", "date", "datetime"]] = Field(
        min_length=1)
    optional_columns: list[str] = []
    extra_columns: Literal["refuse", "ignore"] = "refuse"
    max_age_s: float | None = Field(None, gt=0)
    stale: Literal["refuse", "flag"] = "refuse"
    as_of: Literal["mtime", "name", "preamble"] = "mtime"
    as_of_pattern: str | None = None
    stable_s: float = Field(1.0, ge=0, le=600)
    lock_names: list[str] = []
    done_marker: str | None = None
    max_rows: int = Field(20, ge=1, le=500)


class TakenSpec(_Strict):
    """How to tell the program took an import file; any signal set counts."""

    gone: bool = True
    processed: str | None = None
    receipt: str | None = None
    receipt_folder: str | None = None


class CountSpec(_Strict):
    """The read-back of an import: a read tool of this file that counts the records the
    import is about. For a tool that runs the program, ``field`` names the parsed count;
    for an export tool, the count is the rows it matches (then the program must rewrite
    its export when it takes an import, or the count after cannot move)."""

    tool: str
    inputs: dict[str, Any] = {}
    field: str | None = None


class ImportFileSpec(_Strict):
    """Rung 3: a write that drops a file into a folder the program imports from."""

    folder: str
    file_name: str = Field(description="the file's name, a template over inputs, e.g. orders-{batch}.csv")
    name_pattern: str = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
    format: Literal["csv", "tsv", "jsonl"] = "csv"
    delimiter: str = Field(",", min_length=1, max_length=1)
    encoding: str = "utf-8"
    bom: bool = False
    columns: dict[str, Literal["string", "integer", "number", "decimal", "boolean", "date", "datetime"]] = Field(
        min_length=1)
    optional_columns: list[str] = []
    rows_input: str = Field("rows", pattern=r"^[a-z][a-z0-9_]*$")
    rows_description: str = Field(min_length=1)
    rows_example: list[dict[str, Any]] = Field(min_length=1)
    max_rows: int = Field(1000, ge=1, le=100_000)
    lock_file: str | None = None
    lock_targets: list[str] = []
    taken: TakenSpec = TakenSpec()
    count: CountSpec


class InputSpec(_Strict):
    """One input the model may pass. Described, typed, with an example: it is what a model reads."""

    type: FieldType = "string"
    description: str = Field(min_length=1)
    example: Any
    required: bool = True
    default: Any = None
    enum: list[str] | list[int] | None = None
    pattern: str | None = None
    min_length: int | None = Field(None, ge=0)
    max_length: int | None = Field(None, ge=1)
    minimum: float | None = None
    maximum: float | None = None
    allow_dash: bool = False
    # Inside a path word (/srv/repos/{repo}): may hold '/' to name a subfolder (group/project);
    # never '..' or an empty part. Off, it is one name in that folder.
    allow_slash: bool = False
    # As a whole argument or in a word with no '/' (--config={file}): may name any file or
    # folder ('/', '..'). Off, it is a name unless held to an enum or a pattern (then '/' is
    # the pattern's to allow, and a '..' part is still refused).
    allow_path: bool = False
    # Text of several lines (\n, \r, \t allowed): only for the input a tool feeds on stdin.
    multiline: bool = False
    # A value only the program may read (a password, a PIN): shown everywhere else as a
    # keyed mark, and redacted from what the program prints (rungd.service.sensitive).
    sensitive: bool = False
    filter: FilterSpec | None = None


class DescriptionSpec(_Strict):
    does: str = Field(min_length=1)
    use_when: str = Field(min_length=1)
    do_not_use_when: str = Field(min_length=1)
    returns: str = Field(min_length=1)
    on_error: str = Field(min_length=1)
    if_unknown: str = Field(min_length=1)


class ExitRule(_Strict):
    code: str = Field(pattern=CODE)
    retry: Retry = "no"
    next_action: NextAction = "stop"
    hint: str = ""
    meaning: str = ""


class ParseSpec(_Strict):
    """How stdout becomes fields. Anything that does not parse is SURFACE_CHANGED; no output
    at all, with words on stderr and exit status 0, is the program's failure (FAILED)."""

    kind: Literal["none", "json", "key_value", "regex", "lines", "columns"] = "none"
    separator: str = ":"
    pattern: str | None = None
    fields: dict[str, FieldType] = {}
    max_lines: int = Field(100, ge=1)
    # Where the program prints what is parsed: some (debconf tools) answer on stderr only.
    # "both" parses stdout, then stderr, as one text.
    stream: Literal["stdout", "stderr", "both"] = "stdout"
    # What a lines parse of no output at all means when the program (exiting 0) wrote on
    # stderr: by default FAILED quoting it (bc on 1/0 says "Divide by zero" and exits 0);
    # "answer": an empty listing, the stderr words being warnings.
    empty: Literal["failure_if_stderr", "answer"] = "failure_if_stderr"

    @model_validator(mode="after")
    def _empty_is_a_listing(self) -> ParseSpec:
        if self.empty == "answer" and self.kind != "lines":
            raise ValueError("empty = \"answer\" says an empty listing is an answer: only for kind = \"lines\" "
                             "(other kinds cannot parse fields out of no output)")
        return self


class ConfirmSpec(_Strict):
    pattern: str
    answer: str
    times: int = Field(1, ge=1, le=10)


class CredentialPromptSpec(_Strict):
    pattern: str
    credential: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    # How often this question is answered in one call; a re-ask past it is AUTH_REQUIRED
    # ("rejected"), so a wrong password is never sent again and again (lockouts).
    times: int = Field(1, ge=1, le=10)


class ExpectSpec(_Strict):
    """One test a read-back field must pass, instead of a literal value (exactly one key):
    ``{ present = true }``, ``{ equals = "{name}" }``, ``{ before_plus = "{n}" }``...
    The rule itself is ``rungd.core.expectations``."""

    equals: str | int | float | bool | None = None
    present: bool | None = None
    absent: bool | None = None
    contains: str | int | None = None
    lacks: str | int | None = None
    matches: str | None = None
    before_plus: str | int | float | None = None
    greater_than_before: bool | None = None
    less_than_before: bool | None = None
    differs_from_before: bool | None = None

    @model_validator(mode="after")
    def _one_test(self) -> ExpectSpec:
        named = [k for k, v in self.model_dump().items() if v is not None]
        if len(named) != 1:
            raise ValueError("an expectation table names exactly one test, e.g. { present = true } "
                             f"or {{ before_plus = 1 }}; this one names {', '.join(named) or 'none'}")
        return self

    def plain(self) -> dict[str, Any]:
        """The test as the engine keeps it: ``{"present": True}``."""
        return self.model_dump(exclude_none=True)


# Tests that compare with the read made before the act (rungd.core.expectations.RELATIVE).
RELATIVE_TESTS = frozenset({"before_plus", "greater_than_before", "less_than_before", "differs_from_before"})
# A read-back field's expectation: a literal (or "{input}"), or one test.
Expectation = str | int | float | bool | ExpectSpec


class ReadBackSpec(_Strict):
    """A read (another tool of this file) and the fields it must show after the change."""

    tool: str
    inputs: dict[str, Any] = {}
    expect: dict[str, Expectation] = {}
    wait_s: float = Field(5.0, ge=0, le=600)


class SettleSpec(_Strict):
    """The read that tells, after a timeout, whether the change happened (default: verify)."""

    tool: str
    inputs: dict[str, Any] = {}
    expect: dict[str, Expectation] = {}
    # Run it in the same call as soon as the outcome is unknown (false: leave it to reconcile).
    at_once: bool = True


class PreconditionSpec(_Strict):
    """A write's expected revision: the read (a tool of this file) whose fields must still
    equal what the caller read, checked right before the act under ``lock``."""

    tool: str
    inputs: dict[str, Any] = {}
    expect: dict[str, Any] = {}          # plain values or "{input}", e.g. { count = "{expected_count}" }
    lock: str = ""                       # e.g. "stock:{item}": no other rungd call on it meanwhile


class LimitsSpec(_Strict):
    cpu_s: int | None = Field(None, ge=1)
    address_space_bytes: int | None = Field(None, ge=1 << 20)
    open_files: int | None = Field(None, ge=8)
    processes: int | None = Field(None, ge=1)
    file_size_bytes: int | None = Field(None, ge=0)


class RuledOutSpec(_Strict):
    """A higher rung and the test it fails: ``{ rung = 1, fails = "present", why = "no API" }``."""

    rung: int = Field(ge=1, le=6)
    fails: Literal["present", "unattended", "readable back"]
    why: str = ""


class StepDownSpec(_Strict):
    """An observation that moves the operation a rung down:
    ``{ codes = ["SURFACE_CHANGED"], count = 3 }`` (3 in a row), or with
    ``within = "24h"`` (that many within a sliding window)."""

    codes: list[Annotated[str, Field(pattern=CODE)]] = Field(min_length=1)
    count: int = Field(1, ge=1, le=1000)
    within: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)?(s|m|h|d)$",
                               description="a window such as 30m, 24h, 7d; left out: in a row")
    to: str = ""


class SessionSpec(_Strict):
    """Who is signed in: credential names (each declared by the tool), who provides them,
    and the code a call returns when they expire."""

    provided_by: str = Field(min_length=1)
    credentials: list[str] = []
    on_expiry: str = Field("AUTH_REQUIRED", pattern=CODE)


class HeadingSpec(_Strict):
    """The WRAPPER CONTRACT's heading: ``[tools.NAME.heading]``."""

    rung: int = Field(ge=1, le=6)
    ruled_out: list[RuledOutSpec] = []
    step_down: list[StepDownSpec] = []
    climb: str = ""
    attempts: int = Field(1, ge=1, le=100)
    session: SessionSpec | None = None


class ToolSpec(_Strict):
    description: DescriptionSpec
    side_effect: Literal["read", "reversible", "visible", "irreversible"] = "read"
    argv: list[str] = []
    inputs: dict[str, InputSpec] = {}
    outputs: dict[str, str] = {}
    parse: ParseSpec = ParseSpec()
    exit: dict[str, ExitRule] = {}
    ok_exit: list[int] = [0]
    stdin: Literal["none", "eof"] = "none"
    stdin_input: str | None = None
    # Close stdin after the stdin_input data is sent: an end the author declared, for
    # programs that read to end-of-file (bc, chpasswd, sort).
    stdin_eof: bool = False
    # Which of the file's programs this tool runs: a key of [programs.NAME] (default: [program]).
    program: str | None = Field(None, pattern=r"^[a-z][a-z0-9_]*$")
    # The account the program runs as (the daemon must be root or hold CAP_SETUID).
    user: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")
    confirm: list[ConfirmSpec] = []
    credential_prompt: list[CredentialPromptSpec] = []
    askpass: list[CredentialPromptSpec] = []
    env: dict[str, str] = {}
    credentials: dict[str, str] = {}
    credential_files: dict[str, str] = {}
    deadline_s: float = Field(30.0, gt=0, le=3600)
    commit_point: Literal["spawn", "confirmation"] = "spawn"
    export: ExportSpec | None = None
    import_: ImportFileSpec | None = Field(None, alias="import")
    verify: ReadBackSpec | None = None
    settle: SettleSpec | None = None
    precondition: PreconditionSpec | None = None
    cap_bytes: int = Field(4096, ge=256, le=1 << 20)
    concurrency: int | None = Field(None, ge=1)
    gate: Gate | None = None
    log_fields: list[str] = []
    lint_waivers: dict[str, str] = {}
    limits: LimitsSpec | None = None
    heading: HeadingSpec | None = None
    errors: list[Literal["AUTH_REQUIRED", "PROMPT_UNEXPECTED", "SURFACE_CHANGED", "TIMEOUT", "UNEXPECTED_STATE",
                         "BUSY", "LOCKED"]] = []


class ProgramSpec(_Strict):
    # Required in [program]; a [programs.NAME] table is named by its key.
    name: str | None = Field(None, pattern=r"^[a-z][a-z0-9_]*$")
    command: str = Field(min_length=1)
    env: dict[str, str] = {}
    credentials: dict[str, str] = {}
    # The account every tool of this program runs as, unless the tool names its own.
    user: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")


class ToolFile(_Strict):
    """A tool file: one program in ``[program]``, or several in ``[programs.NAME]`` (a write
    and the program its read-back needs: rm and stat, useradd and getent), or both."""

    program: ProgramSpec | None = None
    programs: dict[str, ProgramSpec] = {}
    tools: dict[str, ToolSpec] = Field(min_length=1)
