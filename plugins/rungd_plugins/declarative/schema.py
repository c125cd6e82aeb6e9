"""The shape of a tool file: one TOML file per legacy program, validated strictly.

Every key is checked; a misspelled key is an error, not a silently ignored setting. See
``rungctl new-plugin`` for a tool file with every key commented and ``plugins/README.md`` for the guide.

Every key carries its description here, and only here: the guide's key reference and the
scaffold ``rungctl new-plugin`` writes are generated from these models
(``python -m rungd_plugins.declarative.reference --write``), and a test fails when they drift.
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

    column: str = Field(description="The export column the input filters on: one of the export's columns.")
    op: Literal["eq", "ne", "lt", "le", "gt", "ge", "contains", "prefix"] = Field(
        "eq", description="How a row's value is compared with the input: eq, ne, lt, le, gt or ge; contains "
                          "and prefix compare text without regard to case.")


class ExportSpec(_Strict):
    """Rung 3: a read served from the newest complete export file a program writes."""

    folder: str = Field(description="The folder the program writes its exports to; a relative path is taken "
                                    "from the tool file's folder.")
    pattern: str = Field(description="A shell pattern for the export's file name, e.g. stock-*.csv; the newest "
                                     "complete file that matches is read.")
    format: Literal["csv", "tsv", "jsonl"] = Field(
        "csv", description="The file's format; jsonl is one JSON object per line.")
    delimiter: str = Field(",", min_length=1, max_length=1,
                           description="For csv: the one character between fields.")
    encoding: str = Field("utf-8", description="The text encoding the program writes, a Python codec name such "
                                               "as utf-8 or cp1252.")
    preamble_lines: int = Field(0, ge=0, description="How many lines come before the header (a title, an "
                                                     "\"exported at\" line); they are never read as rows.")
    columns: dict[str, Literal["string", "integer", "number", "decimal", "boolean", "date", "datetime"]] = Field(
        min_length=1, description="Every column the header must name, with its type: COLUMN = \"integer\". A "
                                  "header without one is SURFACE_CHANGED; each row is typed.")
    optional_columns: list[str] = Field([], description="Columns whose cells may be empty (then no value); the "
                                                        "header must still name them.")
    extra_columns: Literal["refuse", "ignore"] = Field(
        "refuse", description="What a column the tool does not name means: refuse (the export changed: "
                              "SURFACE_CHANGED) or ignore it.")
    max_age_s: float | None = Field(None, gt=0, description="How old the data may be, in seconds; older is "
                                                            "stale. Left out, any age is accepted.")
    stale: Literal["refuse", "flag"] = Field(
        "refuse", description="What data older than max_age_s gets: refuse (STALE_EXPORT) or flag (the rows "
                              "come back marked stale = true).")
    as_of: Literal["mtime", "name", "preamble"] = Field(
        "mtime", description="Where the data's time comes from: the file's modification time, a timestamp in its "
                             "name, or a preamble line (both of these need as_of_pattern).")
    as_of_pattern: str | None = Field(None, description="For as_of = \"name\" or \"preamble\": a regular "
                                                        "expression whose first group is the time, in ISO 8601.")
    stable_s: float = Field(1.0, ge=0, le=600, description="How long, in seconds, the file's size and mtime must "
                                                          "stay unchanged before it counts as completely written.")
    lock_names: list[str] = Field([], description="Lock files a writer keeps beside the export while writing, as "
                                                  "templates over {name} and {stem}, e.g. \"{name}.lck\"; while "
                                                  "one exists the file is not complete.")
    done_marker: str | None = Field(None, description="A file the writer creates once it has finished, as a "
                                                      "template over {name} and {stem}, e.g. \"{stem}.done\"; "
                                                      "set, a file without it is not complete.")
    max_rows: int = Field(20, ge=1, le=500, description="The most matching rows a result holds; the rest are in "
                                                        "the evidence file and the result says how to narrow.")


class TakenSpec(_Strict):
    """How to tell the program took an import file; any signal set counts."""

    gone: bool = Field(True, description="The file leaving the import folder counts as taken.")
    processed: str | None = Field(None, description="A folder the program moves taken files to, under the same "
                                                    "name; relative to the tool file's folder.")
    receipt: str | None = Field(None, description="A file the program writes once it has taken one, as a template "
                                                  "over {name} and {stem}, e.g. \"{stem}.ok\".")
    receipt_folder: str | None = Field(None, description="Where the receipt appears (left out: the import "
                                                         "folder); relative to the tool file's folder.")


class CountSpec(_Strict):
    """The read-back of an import: a read tool of this file that counts the records the
    import is about. For a tool that runs the program, ``field`` names the parsed count;
    for an export tool, the count is the rows it matches (then the program must rewrite
    its export when it takes an import, or the count after cannot move)."""

    tool: str = Field(description="The read tool of this file that counts the records, run before and after "
                                  "the import.")
    inputs: dict[str, Any] = Field({}, description="The count tool's inputs: a literal, or \"{input}\" for one of "
                                                   "this tool's inputs.")
    field: str | None = Field(None, description="For a count tool that runs its program: the integer field it "
                                                "parses as the count. Left out for an export tool.")


class ImportFileSpec(_Strict):
    """Rung 3: a write that drops a file into a folder the program imports from."""

    folder: str = Field(description="The folder the program imports from; a relative path is taken from the "
                                    "tool file's folder.")
    file_name: str = Field(description="The file's name, a template over the tool's inputs, e.g. "
                                       "orders-{batch}.csv.")
    name_pattern: str = Field(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}",
                              description="A regular expression the whole file name must match once filled in.")
    format: Literal["csv", "tsv", "jsonl"] = Field(
        "csv", description="The file's format; jsonl is one JSON object per line.")
    delimiter: str = Field(",", min_length=1, max_length=1,
                           description="For csv: the one character between fields.")
    encoding: str = Field("utf-8", description="The text encoding the program reads, a Python codec name such as "
                                               "utf-8 or cp1252.")
    bom: bool = Field(False, description="Start the file with a byte order mark, for a program that expects one "
                                         "(UTF-8 only; not for jsonl).")
    columns: dict[str, Literal["string", "integer", "number", "decimal", "boolean", "date", "datetime"]] = Field(
        min_length=1, description="The file's columns in order, each with its type: COLUMN = \"integer\". The "
                                  "model sends records keyed by them, checked before anything is written.")
    optional_columns: list[str] = Field([], description="Columns a record may leave out; they are written empty.")
    rows_input: str = Field("rows", pattern=r"^[a-z][a-z0-9_]*$",
                            description="The name of the input that carries the records; it is made from columns, "
                                        "so it is not declared under inputs.")
    rows_description: str = Field(min_length=1, description="What the records are, for the model: the rows "
                                                            "input's description.")
    rows_example: list[dict[str, Any]] = Field(min_length=1, description="An example list of records keyed by "
                                                                         "column, shown to the model.")
    max_rows: int = Field(1000, ge=1, le=100_000, description="The most records one call may send.")
    lock_file: str | None = Field(None, description="rungd's own lock file; left out, .FOLDER.rungd-lock beside "
                                                    "the import folder (never in it, where the program would see "
                                                    "it).")
    lock_targets: list[str] = Field([], description="Other files a person may have open that make an import "
                                                    "unsafe (the program's own data file): while one is held the "
                                                    "call is LOCKED. The import file itself is always checked.")
    taken: TakenSpec = Field(TakenSpec(), description="How to tell the program took the file; any signal set "
                                                      "counts.")
    count: CountSpec = Field(description="The read-back: a read tool of this file whose count of the records is "
                                         "read before and after the import.")


class InputSpec(_Strict):
    """One input the model may pass. Described, typed, with an example: it is what a model reads."""

    type: FieldType = Field("string", description="The value's type.")
    description: str = Field(min_length=1, description="What the input is, for the model: exactly as the program "
                                                       "knows it, with its unit or format.")
    example: Any = Field(description="A valid value, shown to the model.")
    required: bool = Field(True, description="Whether the caller must give it. An optional input left out drops "
                                             "the whole argv word it is in.")
    default: Any = Field(None, description="The value an optional input takes when the caller leaves it out; left "
                                           "unset, the input is absent and its argv word dropped.")
    enum: list[str] | list[int] | None = Field(None, description="The only values allowed: a closed set is an "
                                                                 "enum, not prose.")
    pattern: str | None = Field(None, description="A regular expression the whole value must match (it is "
                                                  "anchored for you); as tight as the program allows.")
    min_length: int | None = Field(None, ge=0, description="The fewest characters a string may have.")
    max_length: int | None = Field(None, ge=1, description="The most characters a string may have.")
    minimum: float | None = Field(None, description="The smallest number allowed.")
    maximum: float | None = Field(None, description="The largest number allowed.")
    allow_dash: bool = Field(False, description="Let a value start with '-'; off, such a value is refused, since "
                                                "the program would read it as an option.")
    allow_slash: bool = Field(False, description="Inside a path word (/srv/repos/{repo}): the value may hold '/' to "
                                                 "name a subfolder (group/project), never '..' or an empty part. "
                                                 "Off, it is one name in that folder.")
    allow_path: bool = Field(False, description="As a whole argument or in a word with no '/' (--config={file}): "
                                                "the value may name any file or folder. Off, it is a name unless "
                                                "held to an enum or a pattern (then '/' is the pattern's to allow; "
                                                "a '..' part is still refused).")
    multiline: bool = Field(False, description="Allow text of several lines (\\n, \\r, \\t); only for the input a "
                                               "tool feeds on stdin (stdin_input).")
    sensitive: bool = Field(False, description="A value only the program may read (a password, a PIN; a string "
                                               "without an enum): shown everywhere else as a keyed mark, and "
                                               "redacted from what the program prints.")
    filter: FilterSpec | None = Field(None, description="For an export tool: the input filters the rows on a "
                                                        "column; a caller who leaves it out gets every row.")


class DescriptionSpec(_Strict):
    does: str = Field(min_length=1, description="What the tool does, in a sentence or two; say whether it changes "
                                                "anything.")
    use_when: str = Field(min_length=1, description="When to pick this tool, in the words a user would use.")
    do_not_use_when: str = Field(min_length=1, description="The near misses, naming the tool to use instead.")
    returns: str = Field(min_length=1, description="The fields the result holds, by name.")
    on_error: str = Field(min_length=1, description="Each error code the tool may return, whether a retry helps, "
                                                    "and what to do.")
    if_unknown: str = Field(min_length=1, description="What to do when an input is not known; usually: ask the "
                                                      "user, do not guess.")


class ExitRule(_Strict):
    code: str = Field(pattern=CODE, description="The stable error code the exit status becomes, e.g. NOT_FOUND.")
    retry: Retry = Field("no", description="Whether the same call can succeed if repeated; after_check: once the "
                                           "caller has checked something.")
    next_action: NextAction = Field("stop", description="What the caller should do next; repair means fix the "
                                                        "call's inputs.")
    hint: str = Field("", description="What a correct call looks like, or what to try next; the program's own "
                                      "words are added to it.")
    meaning: str = Field("", description="What the status means, used as the error's message; left empty, the "
                                         "message names the exit status.")


class ParseSpec(_Strict):
    """How stdout becomes fields. Anything that does not parse is SURFACE_CHANGED; no output
    at all, with words on stderr and exit status 0, is the program's failure (FAILED)."""

    kind: Literal["none", "json", "key_value", "regex", "lines", "columns"] = Field(
        "none", description="How the output is read: none (not at all), json (one object), key_value (KEY "
                            "separator VALUE lines), regex (the named groups of pattern), lines (a list of lines) "
                            "or columns (a table under a header line).")
    separator: str = Field(":", description="For key_value: what separates a key from its value on a line.")
    pattern: str | None = Field(None, description="For regex: a regular expression with a named group per field, "
                                                  "searched in the whole output (^ and $ match at each line).")
    fields: dict[str, FieldType] = Field({}, description="The fields returned, each with its type: FIELD = "
                                                         "\"integer\". A missing field or a wrong type is "
                                                         "SURFACE_CHANGED. For json a name may be a dotted path; "
                                                         "for columns it is a header's name.")
    max_lines: int = Field(100, ge=1, description="For lines and columns: the most lines or rows kept; a longer "
                                                  "listing comes back cut and says so. A read a write is verified "
                                                  "by must never be cut: give it room.")
    stream: Literal["stdout", "stderr", "both"] = Field(
        "stdout", description="Where the program prints what is parsed: some (debconf tools) answer on stderr "
                              "only. both parses stdout, then stderr, as one text.")
    empty: Literal["failure_if_stderr", "answer"] = Field(
        "failure_if_stderr", description="What a lines parse of no output at all means when the program "
                                         "(exiting 0) wrote on stderr: by default FAILED quoting it; answer: an "
                                         "empty listing, the stderr words being warnings.")

    @model_validator(mode="after")
    def _empty_is_a_listing(self) -> ParseSpec:
        if self.empty == "answer" and self.kind != "lines":
            raise ValueError("empty = \"answer\" says an empty listing is an answer: only for kind = \"lines\" "
                             "(other kinds cannot parse fields out of no output)")
        return self


class ConfirmSpec(_Strict):
    pattern: str = Field(description="A regular expression matching the program's own \"are you sure\" "
                                     "question.")
    answer: str = Field(description="What is typed in answer, as written (never a {name} input: the gate "
                                    "decides that it is answered, not the caller); a line break is added.")
    times: int = Field(1, ge=1, le=10, description="How often the question is answered in one call.")


class CredentialPromptSpec(_Strict):
    pattern: str = Field(description="A regular expression matching the question that asks for the credential.")
    credential: str = Field(pattern=r"^[A-Za-z0-9_.-]+$",
                            description="The name of the credential in rungd's store that answers it.")
    times: int = Field(1, ge=1, le=10, description="How often this question is answered in one call; a re-ask "
                                                   "past it is AUTH_REQUIRED (\"rejected\"), so a wrong password "
                                                   "is never sent again and again (lockouts).")


class ExpectSpec(_Strict):
    """One test a read-back field must pass, instead of a literal value (exactly one key):
    ``{ present = true }``, ``{ equals = "{name}" }``, ``{ before_plus = "{n}" }``...
    The rule itself is ``rungd.core.expectations``."""

    equals: str | int | float | bool | None = Field(None, description="The field equals this value (the same as "
                                                                      "the value written alone).")
    present: bool | None = Field(None, description="true: the field is there and not empty; false: the opposite.")
    absent: bool | None = Field(None, description="true: the field is missing or empty (no line, an empty list, "
                                                  "\"\").")
    contains: str | int | None = Field(None, description="A list field has an item holding this text, or a text "
                                                          "field holds it.")
    lacks: str | int | None = Field(None, description="The opposite of contains.")
    matches: str | None = Field(None, description="The field, or an item of a list field, matches this regular "
                                                  "expression (literal: it is never filled from inputs).")
    before_plus: str | int | float | None = Field(None, description="A number, or a list's length, is the read "
                                                                    "before the act plus this.")
    greater_than_before: bool | None = Field(None, description="true: the field is greater than in the read "
                                                               "before the act.")
    less_than_before: bool | None = Field(None, description="true: the field is less than in the read before the "
                                                            "act.")
    differs_from_before: bool | None = Field(None, description="true: the field differs from the read before the "
                                                               "act.")

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

    tool: str = Field(description="The read tool of this file whose output shows the change.")
    inputs: dict[str, Any] = Field({}, description="The read tool's inputs: a literal, or \"{input}\" for one of "
                                                   "this tool's inputs.")
    expect: dict[str, Expectation] = Field({}, description="The fields the read must show after the change: each "
                                                           "a literal, \"{input}\", or a table of one test.")
    wait_s: float = Field(5.0, ge=0, le=600, description="How long, in seconds, to keep reading for the change to "
                                                         "show.")


class SettleSpec(_Strict):
    """The read that tells, after a timeout, whether the change happened (default: verify)."""

    tool: str = Field(description="The read tool of this file that tells whether the change happened.")
    inputs: dict[str, Any] = Field({}, description="The read tool's inputs: a literal, or \"{input}\" for one of "
                                                   "this tool's inputs.")
    expect: dict[str, Expectation] = Field({}, description="The fields that show the change happened: a literal, "
                                                           "\"{input}\", or a table of one test (none of the "
                                                           "..._before tests).")
    at_once: bool = Field(True, description="Run it in the same call as soon as the outcome is unknown (false: "
                                            "leave it to rungctl reconcile).")


class PreconditionSpec(_Strict):
    """A write's expected revision: the read (a tool of this file) whose fields must still
    equal what the caller read, checked right before the act under ``lock``."""

    tool: str = Field(description="The read tool of this file whose fields must still equal what the caller "
                                  "read.")
    inputs: dict[str, Any] = Field({}, description="The read tool's inputs: a literal, or \"{input}\" for one of "
                                                   "this tool's inputs.")
    expect: dict[str, Any] = Field({}, description="The fields that must still hold: plain values or \"{input}\", "
                                                   "e.g. { count = \"{expected_count}\" }; one whose input the "
                                                   "caller left out is not checked.")
    lock: str = Field("", description="A key no other rungd call may act on meanwhile, e.g. \"stock:{item}\"; "
                                      "empty: no lock.")


class LimitsSpec(_Strict):
    cpu_s: int | None = Field(None, ge=1, description="The CPU seconds the program may use.")
    address_space_bytes: int | None = Field(None, ge=1 << 20, description="The address space the program may "
                                                                           "reserve (RLIMIT_AS), in bytes; JVMs "
                                                                           "and threaded programs reserve far more "
                                                                           "than they use.")
    open_files: int | None = Field(None, ge=8, description="The most files the program may hold open.")
    processes: int | None = Field(None, ge=1, description="The most processes of the program's user (RLIMIT_NPROC "
                                                          "counts them all; root is exempt).")
    file_size_bytes: int | None = Field(None, ge=0, description="The largest file the program may write, in "
                                                                "bytes.")


class RuledOutSpec(_Strict):
    """A higher rung and the test it fails: ``{ rung = 1, fails = "present", why = "no API" }``."""

    rung: int = Field(ge=1, le=6, description="The higher rung not used: 1 API, 2 command line, 3 file, 4 "
                                              "recorded script, 5 structured UI, 6 screen.")
    fails: Literal["present", "unattended", "readable back"] = Field(
        description="The test it fails: present (it lacks the operation), unattended (it needs a person "
                    "mid-run) or readable back (its result cannot be read back).")
    why: str = Field("", description="One line of evidence, e.g. \"the vendor's API has no restart call\".")


class StepDownSpec(_Strict):
    """An observation that moves the operation a rung down:
    ``{ codes = ["SURFACE_CHANGED"], count = 3 }`` (3 in a row), or with
    ``within = "24h"`` (that many within a sliding window)."""

    codes: list[Annotated[str, Field(pattern=CODE)]] = Field(min_length=1, description="The error codes "
                                                                                      "observed.")
    count: int = Field(1, ge=1, le=1000, description="How many results with one of the codes it takes; 1 is "
                                                     "once.")
    within: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)?(s|m|h|d)$",
                               description="The window the results must fall in, such as 30m, 24h or 7d; left out, "
                                           "they must come in a row.")
    to: str = Field("", description="Where the operation moves, for the person told, e.g. \"stop: a person does "
                                    "it by hand\".")


class SessionSpec(_Strict):
    """Who is signed in: credential names (each declared by the tool), who provides them,
    and the code a call returns when they expire."""

    provided_by: str = Field(min_length=1, description="Who provides the credentials and where they live, e.g. "
                                                       "\"the operator, in /etc/rungd/credentials.toml\".")
    credentials: list[str] = Field([], description="The credential names the session uses, each one the tool "
                                                   "declares.")
    on_expiry: str = Field("AUTH_REQUIRED", pattern=CODE, description="The error code a call returns when they "
                                                                      "expire.")


class HeadingSpec(_Strict):
    """The WRAPPER CONTRACT's heading: ``[tools.NAME.heading]``."""

    rung: int = Field(ge=1, le=6, description="The rung the operation is reached through: 1 API, 2 command line, "
                                              "3 file, 4 recorded script, 5 structured UI, 6 screen.")
    ruled_out: list[RuledOutSpec] = Field([], description="Each higher rung, and the test it fails.")
    step_down: list[StepDownSpec] = Field([], description="What moves the operation a rung down: rungd watches "
                                                          "the ledger for it, warns and marks the tool. rungctl "
                                                          "lint asks every write for one.")
    climb: str = Field("", description="What would move the operation back up a rung, in words.")
    attempts: int = Field(1, ge=1, le=100, description="The most attempts a caller should spend on one request; "
                                                       "rungd itself never retries.")
    session: SessionSpec | None = Field(None, description="Who is signed in, for a tool that uses credentials.")


Row = Annotated[int, Field(ge=0, le=99)]
# A cell attribute a screen's wait or read names: one pyte keeps, or a colour (fg:red, bg:blue).
ATTRIBUTE = r"^(reverse|bold|underscore|italics|blink|(fg|bg):[a-z0-9]+)$"


class _Where(_Strict):
    row: Row | None = Field(None, description="The row it is on, 0 being the top; left out (and no rows), any "
                                              "row.")
    rows: tuple[Row, Row] | None = Field(None, description="The band of rows it may be on, first and last "
                                                           "included, e.g. [3, 10].")
    column: int | None = Field(None, ge=0, le=299, description="The column it starts at, 0 being the left edge.")

    @model_validator(mode="after")
    def _one_place(self) -> _Where:
        if self.row is not None and self.rows is not None:
            raise ValueError("give row or rows, not both")
        if self.rows is not None and self.rows[0] > self.rows[1]:
            raise ValueError(f"rows = {list(self.rows)}: the first row comes before the last")
        return self


class WaitSpec(_Where):
    """A screen state a step waits for: ``{ text = "Main menu", row = 0 }``, ``{ pattern =
    "Save .*\\?", rows = [5, 20] }``, ``{ text = "Quit", attribute = "reverse" }``."""

    text: str | None = Field(None, min_length=1, description="Text that must be on the screen (at column, when "
                                                             "given): a literal, where \"{input}\" puts in one of "
                                                             "the tool's inputs (a menu item the caller chose).")
    pattern: str | None = Field(None, description="A regular expression searched in each row (matched at column, "
                                                  "when given).")
    attribute: str | None = Field(None, pattern=ATTRIBUTE,
                                  description="An attribute its first cell must have: reverse, bold, underscore, "
                                              "italics, blink, or a colour as fg:NAME / bg:NAME (a current menu "
                                              "item may be marked by colour only).")
    absent: bool = Field(False, description="The state is that it is not there (a dialog gone, an item no longer "
                                            "current).")

    @model_validator(mode="after")
    def _one_test(self) -> WaitSpec:
        if (self.text is None) == (self.pattern is None):
            raise ValueError("a wait names text or pattern, exactly one")
        return self


class ReadSpec(_Where):
    """A field read off the screen: ``{ row = 3, column = 12, width = 30 }``, or ``{ rows = [3,
    9], pattern = "Status: (\\S+)" }`` (its first group)."""

    width: int | None = Field(None, ge=1, le=500, description="How many characters from column (left out: to the "
                                                              "row's end); spaces around the value are dropped.")
    pattern: str | None = Field(None, description="A regular expression searched from column in each row of the "
                                                  "band; the field is its first group (or the whole match).")
    attribute: str | None = Field(None, pattern=ATTRIBUTE,
                                  description="Read the first run of cells with this attribute in the band, e.g. "
                                              "the current item of a menu (reverse, or a colour as bg:NAME).")
    type: FieldType = Field("string", description="The field's type; text that is not one is SURFACE_CHANGED.")

    @model_validator(mode="after")
    def _a_place(self) -> ReadSpec:
        if self.pattern is None and self.attribute is None and self.row is None and self.rows is None:
            raise ValueError("a field read at a fixed place names its row (with column and width)")
        if sum(x is not None for x in (self.pattern, self.width, self.attribute)) > 1:
            raise ValueError("give width (a fixed place), pattern or attribute, one of them")
        return self


class StepSpec(_Strict):
    """One step of a screen session: wait, read, type, press keys; in that order."""

    wait: WaitSpec | None = Field(None, description="The screen state to wait for before anything else.")
    timeout_s: float = Field(5.0, gt=0, le=600, description="How long, in seconds, the step may wait for its "
                                                            "state; then the call is SURFACE_CHANGED, quoting the "
                                                            "screen.")
    read: dict[str, ReadSpec] = Field({}, description="Fields read off the screen into the result, one table each: "
                                                      "FIELD = { row = 3, column = 12, width = 30 }.")
    type: str | None = Field(None, description="Text typed into the field the step waited for: a literal, or "
                                               "\"{input}\" for one of the tool's inputs.")
    credential: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$",
                                   description="A secret field: typed from this credential in rungd's store, never "
                                               "recorded.")
    keys: list[str] = Field([], description="Keys pressed after the text: Enter, Tab, BackTab, Escape, Space, Up, "
                                            "Down, Left, Right, Home, End, PageUp, PageDown, Insert, Delete, "
                                            "Backspace, F1-F12, Ctrl-A to Ctrl-Z, Alt-A to Alt-Z (and Alt-a, Alt-0...); "
                                            "sent as the tool's term does.")
    commit: bool = Field(False, description="This step's keys commit the change (Enter on the confirm button): "
                                            "the commit point of a tool with commit_point = \"confirmation\". "
                                            "One step at most.")


class ScreenSpec(_Strict):
    """A screen program (``terminal = "screen"``): its terminal and the steps that drive it."""

    rows: int = Field(24, ge=10, le=100, description="The terminal's height.")
    columns: int = Field(80, ge=20, le=300, description="The terminal's width.")
    term: Literal["xterm-256color", "vt100"] = Field(
        "xterm-256color", description="The terminal type (TERM) the program draws for; keys are sent as its "
                                      "terminfo entry says.")
    end: Literal["exit", "kill"] = Field(
        "exit", description="After the last step: exit waits for the program to exit by itself (its status is "
                            "judged); kill stops it, for a read that has its fields.")
    steps: list[StepSpec] = Field(min_length=1, description="The steps, in order: [[tools.NAME.screen.steps]].")
    output_fd: int | None = Field(None, ge=3, le=9, description="A descriptor the program writes its answer to, "
                                                                "e.g. 3 for dialog --output-fd 3: a pipe rungd "
                                                                "reads, which [tools.NAME.parse] parses as a line "
                                                                "program's stdout.")


class ToolSpec(_Strict):
    description: DescriptionSpec = Field(description="The six slots a model reads to choose and call the tool; "
                                                     "every one is required.")
    side_effect: Literal["read", "reversible", "visible", "irreversible"] = Field(
        "read", description="What a call changes: read changes nothing. Every other class needs a verify "
                            "read-back, and the operator's config sets its gate.")
    argv: list[str] = Field([], description="The program's arguments, one word each, no shell: {name} puts in an "
                                            "input, a literal brace is doubled ({{}} is {}), and "
                                            "{credential_file:NAME} names a credential file.")
    inputs: dict[str, InputSpec] = Field({}, description="What a model may pass, one table per input.")
    outputs: dict[str, str] = Field({}, description="What each field of the result holds, for the model: FIELD = "
                                                    "\"words\". Left out, the parsed fields are listed by name.")
    parse: ParseSpec = Field(ParseSpec(), description="How the program's output becomes fields.")
    exit: dict[str, ExitRule] = Field({}, description="One table per exit status the program documents, with the "
                                                      "error code it becomes; a status neither here nor in ok_exit "
                                                      "is FAILED.")
    ok_exit: list[int] = Field([0], description="The exit statuses that are an answer, e.g. [0, 1] when 1 means "
                                                "\"no such file\" for a read a write is verified by.")
    stdin: Literal["none", "eof"] = Field("none", description="none: stdin stays open and silent, so a program "
                                                              "that reads it is caught asking; eof: closed at "
                                                              "once, only where end-of-file is a safe answer.")
    stdin_input: str | None = Field(None, description="The input sent on stdin, with a line break at its end "
                                                      "(which keeps it out of ps).")
    stdin_eof: bool = Field(False, description="Close stdin after the stdin_input data is sent: an end the author "
                                               "declared, for programs that read to end-of-file (bc, chpasswd, "
                                               "sort).")
    terminal: Literal["line", "none", "screen"] = Field(
        "line", description="line: the program's /dev/tty is a terminal rungd holds (its stdin, stdout and stderr "
                            "stay pipes), so a question it asks there is seen whole, a secret one by its echo, and "
                            "answered only as declared; none: it has no terminal (opening /dev/tty fails), for a "
                            "program that behaves worse with one; screen: a full-screen program, its stdio on that "
                            "terminal, driven by [tools.NAME.screen].")
    screen: ScreenSpec | None = Field(None, description="For terminal = \"screen\": the terminal's size and type "
                                                        "and the steps that drive the program.")
    program: str | None = Field(None, pattern=r"^[a-z][a-z0-9_]*$",
                                description="Which of the file's programs this tool runs: a key of "
                                            "[programs.NAME] (default: [program]).")
    user: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_.-]{0,31}$",
                             description="The account the program runs as (the daemon must be root or hold "
                                         "CAP_SETUID).")
    confirm: list[ConfirmSpec] = Field([], description="The program's own \"are you sure\" questions, answered "
                                                       "only for a call that passed its gate; a read has none.")
    credential_prompt: list[CredentialPromptSpec] = Field(
        [], description="Credential questions the program asks, each answered with a credential from rungd's "
                        "store.")
    askpass: list[CredentialPromptSpec] = Field(
        [], description="GIT_ASKPASS, SSH_ASKPASS and SUDO_ASKPASS questions, each answered with a credential "
                        "from rungd's store.")
    env: dict[str, str] = Field({}, description="Variables added to the program's environment: fixed values, "
                                                "never an input. The guide's Environment section says which are "
                                                "refused.")
    credentials: dict[str, str] = Field({}, description="Credentials put in the program's environment: ENV_VAR = "
                                                        "\"credential name\" in rungd's store.")
    credential_files: dict[str, str] = Field({}, description="Credentials handed over as sealed in-memory files: "
                                                             "ENV_VAR = \"credential name\"; ENV_VAR holds the "
                                                             "file's /dev/fd/N.")
    deadline_s: float = Field(30.0, gt=0, le=3600, description="Seconds a call may take; at the deadline the "
                                                               "whole process tree dies and the call is TIMEOUT.")
    commit_point: Literal["spawn", "confirmation"] = Field(
        "spawn", description="When the effect may have begun: when the program starts, or when a confirm "
                             "question is answered.")
    export: ExportSpec | None = Field(None, description="Answer from the newest complete export file the program "
                                                        "writes instead of running it (no argv, no parse).")
    import_: ImportFileSpec | None = Field(None, alias="import",
                                           description="Drop a file into a folder the program imports from "
                                                       "instead of running it (no argv, parse or verify).")
    verify: ReadBackSpec | None = Field(None, description="The read-back every write needs: a read tool of this "
                                                          "file and the fields it shows after the change.")
    settle: SettleSpec | None = Field(None, description="The read that tells, after a timeout or a crash, whether "
                                                        "the change happened; left out, the verify read.")
    precondition: PreconditionSpec | None = Field(None, description="A write's expected revision: a read that "
                                                                    "must still show what the caller read, right "
                                                                    "before the act; otherwise CONFLICT.")
    cap_bytes: int = Field(4096, ge=256, le=1 << 20, description="The most bytes of result the model gets; a "
                                                                 "longer one is cut and says so.")
    concurrency: int | None = Field(None, ge=1, description="How many calls of this tool may run at once; one "
                                                            "more is BUSY. 1 for a program that must not run twice "
                                                            "at once.")
    gate: Gate | None = Field(None, description="A stricter gate than the operator's config gives the tool's "
                                                "class (review: an operator approves); never a looser one.")
    log_fields: list[str] = Field([], description="Inputs safe to record in the ledger in clear.")
    lint_waivers: dict[str, str] = Field({}, description="rungctl lint codes this tool answers for, each with the "
                                                         "reason a reviewer reads: CODE = \"why\".")
    limits: LimitsSpec | None = Field(None, description="Resource limits for the program; each one set wins over "
                                                        "the config's [limits].")
    heading: HeadingSpec | None = Field(None, description="The contract's heading (seed 000), for operators: the "
                                                          "rung, the higher rungs ruled out, what moves it down or "
                                                          "back up, the attempts and the session.")
    errors: list[Literal["AUTH_REQUIRED", "PROMPT_UNEXPECTED", "SURFACE_CHANGED", "TIMEOUT", "UNEXPECTED_STATE",
                         "BUSY", "LOCKED"]] = Field([], description="Core error codes the tool may return beyond "
                                                                    "those rungd lists by itself, added to its "
                                                                    "error table.")


class ProgramSpec(_Strict):
    name: str | None = Field(None, pattern=r"^[a-z][a-z0-9_]*$",
                             description="The program's short name. Required in [program]; a [programs.NAME] "
                                         "table is named by its key.")
    command: str = Field(min_length=1, description="The program: an absolute path, a name on PATH, or ./relative "
                                                   "to this file. Shells, interpreters and exec wrappers are "
                                                   "refused.")
    env: dict[str, str] = Field({}, description="Variables added to the environment of every tool of this program: "
                                                "fixed values, never an input.")
    credentials: dict[str, str] = Field({}, description="Credentials put in the environment of every tool of this "
                                                        "program: ENV_VAR = \"credential name\" in rungd's store.")
    user: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_.-]{0,31}$",
                             description="The account every tool of this program runs as, unless the tool names "
                                         "its own.")


class ToolFile(_Strict):
    """A tool file: one program in ``[program]``, or several in ``[programs.NAME]`` (a write
    and the program its read-back needs: rm and stat, useradd and getent), or both."""

    program: ProgramSpec | None = Field(None, description="The program the tools run (with [programs.NAME]: the "
                                                          "one a tool runs when it names none).")
    programs: dict[str, ProgramSpec] = Field({}, description="More programs, one table each, e.g. the one a "
                                                             "write's read-back needs; a tool picks one with "
                                                             "program = \"NAME\".")
    tools: dict[str, ToolSpec] = Field(min_length=1, description="The tools, one table each, named after the "
                                                                 "system, the object and the verb, e.g. "
                                                                 "accounts_user_show.")
