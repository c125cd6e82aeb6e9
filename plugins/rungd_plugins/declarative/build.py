"""Turning one validated tool file into ``Tool`` declarations with working handlers.

Everything that can be checked before a call is checked at load time, so a mistake in a
tool file stops start-up with its file and key, instead of failing a call at 3 a.m.:
placeholders name declared inputs, read-backs and settle reads name tools of the same
file, regexes compile, the program exists and is executable, writes have a read-back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import string
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import trio
from pydantic import Field
from rungd.sdk import (
    Band,
    BadInput,
    CallContext,
    Completed,
    ConfigError,
    Confirmation,
    CredentialPrompt,
    Description,
    ErrorRule,
    Heading,
    Limits,
    Precondition,
    Program,
    Read,
    Result,
    RuledOut,
    RungdError,
    Screen,
    Session,
    SettleSpec,
    Step,
    StepDown,
    SurfaceChanged,
    Timing,
    Tool,
    ToolError,
    ToolInputs,
    UnexpectedState,
    UnknownKey,
    Wait,
    check_exit,
    screen_key,
    shows,
)
from rungd.sdk import run as run_program  # the method below is called run too

from rungd_plugins.declarative import exports, imports, programs
from rungd_plugins.declarative.columns import TYPES
from rungd_plugins.declarative.parse import (
    check_pattern,
    check_patterns,
    failed_quietly,
    left_out,
    parse_off_loop,
)
from rungd_plugins.declarative.programs import Resolved
from rungd_plugins.declarative.schema import (
    RELATIVE_TESTS,
    ExpectSpec,
    InputSpec,
    ReadBackSpec,
    ScreenSpec,
    ToolFile,
    ToolSpec,
)
from rungd_plugins.declarative.templates import (
    CREDENTIAL_FILE,
    credential_files,
    inside_path,
    literal_text,
    names_no_file,
    placeholders,
    substitute,
    template_problem,
    whole,
)


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A tool file, checked: what ``rungd_register_tools`` registers from it."""

    path: Path
    tools: list[Tool]


def load_tool_file(path: Path, file: ToolFile) -> Loaded:
    """Build every tool of a validated file.

    Raises:
        ConfigError: naming ``path``, the key, and what a correct value looks like.
    """
    resolved = programs.resolve_all(path, file)
    specs = file.tools
    # Which program each tool runs, decided (and checked) before any tool is built: a
    # read-back may run another program of the file than the write it verifies.
    runs = {name: programs.program_for(path, f"tools.{name}", spec, resolved) for name, spec in specs.items()}
    # Export tools first: an import tool of the same file may count through one of them.
    export_tools = {}
    for name, spec in specs.items():
        if spec.export is not None:
            exports.check(path, f"tools.{name}", spec)
            export_tools[name] = exports.ExportTool(path, name, spec)
    built = []
    for name, spec in specs.items():
        key = f"tools.{name}"
        if spec.import_ is not None:
            imports.check(path, key, spec, specs)
        _check_tool(path, key, name, spec, specs)
        if spec.export is None and spec.import_ is None:
            user = spec.user or runs[name].spec.user
            # Credentials reach the program as environment variables too: the same names refused.
            for where, names, values in ((f"{key}.env", spec.env, True),
                                         (f"{key}.credentials", spec.credentials, False),
                                         (f"{key}.credential_files", spec.credential_files, False),
                                         (f"{runs[name].key}.env", runs[name].spec.env, True),
                                         (f"{runs[name].key}.credentials", runs[name].spec.credentials, False)):
                programs.check_env(path, where, names, user=user, values=values)
            programs.check_argv(path, key, runs[name], spec, user=user)
            if user is not None:
                programs.check_user(path, f"{key}.user" if spec.user else f"{runs[name].key}.user", user)
        extra: dict[str, Any] = {}
        commit_point = spec.commit_point
        settle: Any = spec.settle or spec.verify  # by default the read-back also settles an unknown
        if spec.export is not None:
            handler = export_tools[name].handle
        elif spec.import_ is not None:
            record = imports.record_model(name, spec.import_)
            extra[spec.import_.rows_input] = imports.rows_field(spec.import_, record)
            count = _counter(runs, specs, spec.import_.count, export_tools)
            handler = imports.ImportTool(path, name, spec, record, count).handle
            commit_point = "callback"  # the rename into the watched folder
            settle = spec.settle or spec.import_.count
        else:
            program = _ProgramRunner(runs[name], spec)
            readback = _ReadBack(runs[spec.verify.tool], specs[spec.verify.tool], spec.verify) if spec.verify else None
            # A settle read other than the read-back is read before the act too, to be judged by.
            other = spec.settle if spec.settle and spec.settle.expect and spec.settle.at_once and spec.verify and \
                (spec.settle.tool, spec.settle.inputs) != (spec.verify.tool, spec.verify.inputs) else None
            settle_read = (_ReadBack(runs[other.tool], specs[other.tool], other)  # type: ignore[arg-type]
                           if other else None)
            handler = _handler(program, readback, spec, settle_read)
        built.append(
            Tool(
                name=name,
                description=Description(**spec.description.model_dump()),
                inputs=_inputs_model(name, spec.inputs, extra, multiline=spec.stdin_input),
                outputs=spec.outputs or _default_outputs(spec),
                handler=handler,
                side_effect=spec.side_effect,
                errors=_errors(spec),
                timing=Timing(
                    deadline_s=spec.deadline_s,
                    commit_point=commit_point,
                    settle=SettleSpec(
                        settle.tool,
                        {k: _as_reference(v) for k, v in settle.inputs.items()},
                        {k: _as_reference(_plain(v)) for k, v in getattr(settle, "expect", {}).items()},
                        at_once=getattr(settle, "at_once", True),
                    ) if settle else None,
                ),
                precondition=Precondition(
                    spec.precondition.tool,
                    {k: _as_reference(v) for k, v in spec.precondition.inputs.items()},
                    {k: _as_reference(v) for k, v in spec.precondition.expect.items()},
                    lock=spec.precondition.lock,
                ) if spec.precondition else None,
                cap_bytes=spec.cap_bytes,
                concurrency=spec.concurrency,
                gate=spec.gate,
                log_fields=tuple(spec.log_fields),
                lint_waivers=spec.lint_waivers,
                heading=_heading(path, key, spec),
                credentials=_credentials(file, spec),
                provenance=_provenance(name, specs, runs),
                plan=_screen_plan(spec.screen) if spec.screen is not None else None,
            )
        )
    return Loaded(path, built)


def _provenance(name: str, specs: dict[str, ToolSpec], runs: dict[str, Resolved]) -> str:
    """What a tool runs, for its definition digest: its table, the tables of the reads it
    names (read-back, settle, precondition), and each program's table with the identity of
    its file now (path, size, time, inode: an upgraded program is another definition)."""
    spec = specs[name]
    named = [name, *(read.tool for read in (spec.verify, spec.settle, spec.precondition) if read is not None)]
    seen = {}
    for tool in dict.fromkeys(named):
        if tool not in specs:
            continue
        program = runs.get(tool)
        identity = None
        if program is not None:
            try:
                info = program.command.stat()
                identity = [str(program.command), info.st_size, info.st_mtime_ns, info.st_ino]
            except OSError:
                identity = [str(program.command)]
        seen[tool] = {"tool": specs[tool].model_dump(mode="json", by_alias=True),
                      "program": program.spec.model_dump(mode="json") if program is not None else None,
                      "file": identity}
    return json.dumps(seen, sort_keys=True)


_SPAN_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _heading(path: Path, key: str, spec: ToolSpec) -> Heading | None:
    """The tool's heading as the contract holds it; a rung ruled out at or below the
    tool's own is a mistake in the file."""
    h = spec.heading
    if h is None:
        return None
    try:
        return Heading(
            rung=h.rung,
            ruled_out=tuple(RuledOut(r.rung, r.fails, r.why) for r in h.ruled_out),
            step_down=tuple(StepDown(tuple(s.codes), s.count,
                                     float(s.within[:-1]) * _SPAN_S[s.within[-1]] if s.within else None, s.to)
                            for s in h.step_down),
            climb=h.climb,
            attempts=h.attempts,
            session=Session(h.session.provided_by, tuple(h.session.credentials), h.session.on_expiry)
            if h.session else None,
        )
    except ValueError as exc:
        raise ConfigError(f"{path}: key {key}.heading: {exc}") from None


def _credentials(file: ToolFile, spec: ToolSpec) -> tuple[str, ...]:
    """Every credential name the tool may obtain: environment, files, prompts, askpass."""
    # The tool's own program: [programs.NAME] when it names one, else [program] (or the only one).
    program = file.programs.get(spec.program or "") or file.program or next(iter(file.programs.values()))
    names = {*program.credentials.values(), *spec.credentials.values(), *spec.credential_files.values(),
             *(c.credential for c in spec.credential_prompt), *(c.credential for c in spec.askpass),
             *(step.credential for step in (spec.screen.steps if spec.screen else ()) if step.credential)}
    return tuple(sorted(names))


def _counter(runs: dict[str, Resolved], specs: dict[str, ToolSpec], count: Any,
             export_tools: dict[str, exports.ExportTool]) -> imports.Count:
    """The count an import reads back: rows an export tool matches, or a parsed field."""
    if count.tool in export_tools:
        return export_tools[count.tool].count
    program = _ProgramRunner(runs[count.tool], specs[count.tool])

    async def parsed(ctx: CallContext, values: dict[str, Any]) -> int:
        fields, _ = await program.run(ctx, values, commits=False)
        return int(fields[count.field])

    return parsed


def _default_outputs(spec: ToolSpec) -> dict[str, str]:
    if spec.export is not None:
        return _EXPORT_OUTPUTS
    if spec.import_ is not None:
        return _IMPORT_OUTPUTS
    if spec.screen is not None:
        return {name: f"{name}, read off the screen" for name in _parsed_fields(spec)}
    return {k: k for k in spec.parse.fields}


def _plain(value: Any) -> Any:
    """An expectation as the engine keeps it: a literal, or ``{"test": argument}``."""
    return value.plain() if isinstance(value, ExpectSpec) else value


def _as_reference(value: Any) -> Any:
    """``"{item}"`` in a tool file is ``"$item"`` in a SettleSpec: the call's own input,
    also as the argument of a test (``{"equals": "$item"}``), never of ``matches``: a
    caller's input must not become a regular expression run on the daemon's loop."""
    if isinstance(value, dict):
        return {k: v if k == "matches" else _as_reference(v) for k, v in value.items()}
    name = whole(value)
    return value if name is None else "$" + name


def _check_tool(path: Path, key: str, name: str, spec: ToolSpec, specs: dict[str, ToolSpec]) -> None:
    def fail(where: str, problem: str) -> ConfigError:
        return ConfigError(f"{path}: key {key}.{where}: {problem}")

    if not re.match(r"^[a-z][a-z0-9]*(_[a-z0-9]+){1,5}$", name):
        raise ConfigError(f"{path}: key {key}: tool names look like <system>_<object>_<verb>, e.g. inventory_item_show")
    if CREDENTIAL_FILE in spec.inputs:
        raise fail(f"inputs.{CREDENTIAL_FILE}", "the name is taken: {credential_file:NAME} in argv names a "
                   "credential file; call the input something else")
    for i, arg in enumerate(spec.argv):
        if problem := template_problem(arg):
            raise fail(f"argv[{i}]", problem)
        for ref in placeholders(arg):
            if ref not in spec.inputs:
                raise fail(f"argv[{i}]", f"{{{ref}}} is not one of its inputs ({', '.join(spec.inputs) or 'none'})")
    for field in spec.log_fields:
        if field not in spec.inputs:
            raise fail("log_fields", f"{field!r} is not one of its inputs")
    if spec.stdin_input is not None and spec.stdin_input not in spec.inputs:
        raise fail("stdin_input", f"{spec.stdin_input!r} is not one of its inputs")
    if spec.stdin_eof and spec.stdin_input is None:
        raise fail("stdin_eof", "it closes stdin after the stdin_input data; without data, say stdin = \"eof\"")
    if spec.stdin == "eof" and spec.stdin_input is not None:
        # stdin = "eof" closes stdin at once: the input's data could never be sent, and the
        # call would wait for a program that never gets it (it loaded, then hung).
        raise fail("stdin", "stdin = \"eof\" closes stdin before any data; to send stdin_input and then close "
                   "stdin, leave stdin out and say stdin_eof = true")
    for field, inp in spec.inputs.items():
        if inp.multiline and field != spec.stdin_input:
            raise fail(f"inputs.{field}.multiline", "only the input fed on stdin (stdin_input) may hold several "
                                                   "lines: in an argument, a line break could forge output the tool parses")
    _check_sensitive(fail, spec)
    for code in spec.exit:
        if not code.lstrip("-").isdigit():
            raise fail(f"exit.{code}", "keys are exit statuses, e.g. [tools.x.exit.3]")
    # Every pattern compiles, and none can backtrack catastrophically on what a program prints.
    check_patterns(path, key, spec)
    if spec.parse.kind == "regex" and not spec.parse.pattern:
        raise fail("parse.pattern", "a regex parser needs a pattern with named groups")
    if spec.side_effect == "read" and spec.confirm:
        # A read runs ungated and without a request_id: an answer that lets its program act
        # would be a write no gate, ledger key or read-back stands behind.
        raise fail("confirm", "a read tool answers no confirmation: answering one lets the program act. "
                              "Hint: if the program changes something, declare the tool a write "
                              "(side_effect = \"reversible\", \"visible\" or \"irreversible\") with a "
                              "[tools.NAME.verify] read-back; otherwise drop the confirm entry")
    for at, confirm in enumerate(spec.confirm):
        try:
            named = placeholders(confirm.answer) or credential_files(confirm.answer)
        except ValueError:  # a lone brace ("y}"): no placeholder, typed as written like the rest
            named = ()
        if named:
            # Typed as written: a caller's input here would let the model answer the program's
            # "are you sure", which the gate answers. A real-program trial typed "{max_days}".
            raise fail(f"confirm[{at}].answer", f"{confirm.answer!r} is typed as written: a confirmation's answer "
                       "is fixed in the tool file, never an input. Hint: pass the value in argv (chage -M "
                       "{max_days}) or on stdin (stdin_input), or, for a credential, declare a "
                       "[[tools.NAME.credential_prompt]] entry")
    _check_screen(fail, spec)
    if spec.commit_point == "confirmation" and not spec.confirm and spec.screen is None:
        raise fail("commit_point", "'confirmation' needs a [[...confirm]] entry to answer")
    if spec.side_effect != "read" and spec.verify is None and spec.import_ is None:
        raise fail("verify", "a tool that changes something needs a read-back: "
                             "[tools.NAME.verify] tool = \"<a read tool of this file>\"")
    _check_precondition(path, key, fail, spec, specs)
    for where, ref in (("verify.tool", spec.verify.tool if spec.verify else None),
                       ("settle.tool", spec.settle.tool if spec.settle else None)):
        if ref is None:
            continue
        if ref not in specs or specs[ref].side_effect != "read":
            raise fail(where, f"{ref!r} must be a read tool of this same file")
    if spec.verify and spec.side_effect != "read" and not spec.verify.expect:
        raise fail("verify.expect", "a read-back proves a change only by what it expects to see, e.g. "
                                    "expect = { count = \"{count}\" }")
    for where, mapping in (("verify", spec.verify), ("settle", spec.settle)):
        for field, value in (getattr(mapping, "expect", {}) | getattr(mapping, "inputs", {})).items() if mapping else ():
            _check_expectation(path, f"{key}.{where}.{field}", value, spec.inputs, settle=where == "settle")
    for where, mapping in (("verify", spec.verify), ("settle", spec.settle)):
        if mapping is None:
            continue
        parsed = _parsed_fields(specs[mapping.tool])
        for field in mapping.expect:
            if field not in parsed:
                raise fail(f"{where}.expect.{field}", f"{mapping.tool} does not parse a field {field!r} "
                                                      f"(it parses {', '.join(parsed) or 'nothing'})")


def _check_screen(fail: Callable[[str, str], ConfigError], spec: ToolSpec) -> None:
    """A screen tool: its steps are the whole dialogue with the program, so nothing else
    talks to it (stdin, prompts, a parse of output it draws), and its keys exist."""
    if (spec.terminal == "screen") != (spec.screen is not None):
        raise fail("screen", "terminal = \"screen\" and a [tools.NAME.screen] table with its steps go together")
    if spec.screen is None:
        return
    for key, bad in (("parse", spec.parse.kind != "none" and spec.screen.output_fd is None),
                     ("stdin", spec.stdin != "none"),
                     ("stdin_input", spec.stdin_input is not None), ("confirm", bool(spec.confirm)),
                     ("credential_prompt", bool(spec.credential_prompt)), ("askpass", bool(spec.askpass))):
        if bad:
            raise fail(key, "a screen tool talks to its program through its steps only: its fields come from "
                            "steps' read tables (or, with screen.output_fd, a parse of what it writes there), "
                            "what it answers from their type, credential and keys")
    commits = [i for i, step in enumerate(spec.screen.steps) if step.commit]
    if len(commits) > 1:
        raise fail(f"screen.steps[{commits[1]}].commit", "one step commits the change; mark only the one whose keys "
                                                          "do (Enter on the confirm button)")
    if commits and spec.side_effect == "read":
        raise fail(f"screen.steps[{commits[0]}].commit", "a read tool commits nothing: declare the tool a write "
                                                          "with a verify read-back, or drop commit")
    if spec.commit_point == "confirmation" and not commits:
        raise fail("commit_point", "'confirmation' on a screen tool needs the step that commits: commit = true")
    seen: set[str] = set()
    height, width = spec.screen.rows, spec.screen.columns
    for i, step in enumerate(spec.screen.steps):
        where = f"screen.steps[{i}]"
        for place, name in ([(step.wait, "wait")] if step.wait else []) + [(r, f"read.{n}") for n, r in step.read.items()]:
            last_row = place.row if place.row is not None else place.rows[1] if place.rows is not None else 0
            if last_row >= height or (place.column or 0) >= width:
                raise fail(f"{where}.{name}", f"it looks past the screen ({height} rows, {width} columns, counted from "
                                              "0): a read there is always empty, a wait for something to go passes at "
                                              "once; give rows and columns on the screen, or a bigger screen")
        if step.wait is not None and step.wait.text is not None:
            if problem := template_problem(step.wait.text):
                raise fail(f"{where}.wait.text", problem)
            for ref in placeholders(step.wait.text):
                if ref not in spec.inputs:
                    raise fail(f"{where}.wait.text", f"{{{ref}}} is not one of its inputs "
                                                     f"({', '.join(spec.inputs) or 'none'})")
                if spec.inputs[ref].sensitive:
                    raise fail(f"{where}.wait.text", f"{{{ref}}} is sensitive: a wait is quoted in errors and shown "
                                                     "to approvers; type a sensitive input, never wait for it")
        if step.type is not None:
            if problem := template_problem(step.type):
                raise fail(f"{where}.type", problem)
            for ref in placeholders(step.type):
                if ref not in spec.inputs:
                    raise fail(f"{where}.type", f"{{{ref}}} is not one of its inputs ({', '.join(spec.inputs) or 'none'})")
        if step.type is not None and step.credential is not None:
            raise fail(f"{where}.credential", "a step types text or a credential, not both")
        for name in step.keys:
            try:
                screen_key(spec.screen.term, name)
            except UnknownKey as exc:
                raise fail(f"{where}.keys", str(exc)) from None
        for name in step.read:
            if name in seen or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise fail(f"{where}.read.{name}", "each field is read once, named in lower case (hostname, "
                                                   "free_space)")
            seen.add(name)


def _screen(spec: ScreenSpec, values: dict[str, Any]) -> Screen:
    """The runner's screen for a call with ``values``: each step's text filled in."""
    def band(where: Any) -> Band:
        if where.rows is not None:
            return Band(*where.rows)
        return Band(where.row, where.row) if where.row is not None else Band()

    steps = []
    for step in spec.steps:
        wait = None
        if step.wait is not None:
            w = step.wait
            text = substitute(w.text, values) if w.text is not None else None
            wait = Wait(text=None if text is None else str(text), pattern=re.compile(w.pattern) if w.pattern else None,
                        band=band(w), column=w.column, attribute=w.attribute, absent=w.absent)
        reads = tuple(Read(name, band(r), column=r.column or 0, width=r.width,
                           pattern=re.compile(r.pattern) if r.pattern else None, attribute=r.attribute)
                      for name, r in step.read.items())
        text = substitute(step.type, values) if step.type is not None else None
        steps.append(Step(wait=wait, timeout_s=step.timeout_s, read=reads,
                          text=None if text is None else str(text).lower() if isinstance(text, bool) else str(text),
                          credential=step.credential, keys=tuple(step.keys), commit=step.commit))
    return Screen(steps=tuple(steps), rows=spec.rows, columns=spec.columns, term=spec.term, end=spec.end,
                  output_fd=spec.output_fd)


def _screen_plan(spec: ScreenSpec) -> Callable[[Mapping[str, Any]], tuple[str, ...]]:
    """What a screen call will do with its inputs, step by step, for the operator deciding it
    (``Tool.plan``): each wait, what each step types (a sensitive input as its mark, a
    secret field by its credential's name only) and presses, and which step commits."""
    def plan(shown: Mapping[str, Any]) -> tuple[str, ...]:
        lines = []
        for number, (step, filled) in enumerate(zip(spec.steps, _screen(spec, dict(shown)).steps), 1):
            said = [f"wait for {filled.wait.said()}"] if filled.wait is not None else []
            if step.read:
                said.append("read " + ", ".join(step.read))
            if filled.text is not None:
                source = ", ".join(placeholders(step.type or ""))
                said.append(f"type {filled.text!r}" + (f" ({source})" if source else ""))
            if step.credential is not None:
                said.append(f"type the credential {step.credential} (a secret field, never shown)")
            if step.keys:
                said.append("press " + " ".join(step.keys))
            lines.append(f"step {number}{' (commits)' if step.commit else ''}: {'; '.join(said) or 'nothing'}")
        return tuple(lines)

    return plan


def _screen_fields(spec: ScreenSpec, drawn: dict[str, Any]) -> dict[str, Any]:
    """The fields read off the screen, typed as the tool declares.

    Raises:
        SurfaceChanged: a field's text is not of its type (the screen changed).
    """
    types = {name: read.type for step in spec.steps for name, read in step.read.items()}
    typed: dict[str, Any] = {}
    for name, text in drawn.items():
        kind = types.get(name, "string")
        try:
            if kind == "integer":
                typed[name] = int(text.replace(",", "").replace("_", ""))
            elif kind == "number":
                typed[name] = float(text.replace(",", ""))
            elif kind == "boolean":
                typed[name] = {"true": True, "yes": True, "on": True, "[x]": True, "[*]": True, "false": False,
                               "no": False, "off": False, "[ ]": False}[text.lower()]
            else:
                typed[name] = text
        except (ValueError, KeyError):
            raise SurfaceChanged(f"the screen shows {text!r} where the field {name} should be a {kind}",
                                 hint="the program's screen changed; the tool's author must check the step's read "
                                 "(rungctl probe --screen shows the screens)") from None
    return typed


def _check_sensitive(fail: Callable[[str, str], ConfigError], spec: ToolSpec) -> None:
    """A sensitive input is free text a program gets, in argv or on stdin, and no read that
    is shown or kept for later takes it (``Tool`` refuses the same; here it is said by key)."""
    sensitive = sorted(name for name, inp in spec.inputs.items() if inp.sensitive)
    if not sensitive:
        return
    for name in sensitive:
        if spec.inputs[name].type != "string" or spec.inputs[name].enum:
            raise fail(f"inputs.{name}.sensitive", "a sensitive input is text the caller chooses (a password, "
                                                   "a PIN): type = \"string\", without an enum")
    if spec.export is not None or spec.import_ is not None:
        raise fail(f"inputs.{sensitive[0]}.sensitive", "only a tool that runs a program takes a sensitive input "
                                                       "(in argv or on stdin): an export or an import keeps its "
                                                       "inputs in rows and file names")
    # The read-back settles an unknown outcome too, unless the file names another settle read.
    settle, where = (spec.settle, "settle") if spec.settle else (spec.verify, "verify")
    named = [(f"{where}.{part}.{field}", ref) for part in ("inputs", "expect")
             for field, value in (getattr(settle, part, None) or {}).items() for ref in _references(value)]
    if (pre := spec.precondition) is not None:
        named += [(f"precondition.{part}.{field}", ref) for part in ("inputs", "expect")
                  for field, value in getattr(pre, part).items() for ref in _references(value)]
        named += [("precondition.lock", ref) for _, ref, _, _ in string.Formatter().parse(pre.lock) if ref]
    for at, ref in named:
        if ref in sensitive:
            hint = ("; the read-back settles an unknown outcome too: name a settle read that does not need it "
                    "([tools.NAME.settle])" if where == "verify" and at.startswith("verify.") else "")
            raise fail(at, f"{{{ref}}} is sensitive, and a settle read is shown in the envelope and kept in the "
                           "ledger for reconcile, a precondition read is a call of its own: neither may take it"
                           + hint)


def _references(value: Any) -> list[str]:
    """The inputs a read-back value or expectation names: ``"{name}"``, or a test's argument
    (never a ``matches`` pattern, which is literal)."""
    if isinstance(value, ExpectSpec):
        (test, value), = value.plain().items()
        if test == "matches":
            return []
    if isinstance(value, dict):
        return [ref for test, v in value.items() if test != "matches" for ref in _references(v)]
    return placeholders(value) if isinstance(value, str) else []


def _check_precondition(path: Path, key: str, fail: Callable[[str, str], ConfigError], spec: ToolSpec,
                        specs: dict[str, ToolSpec]) -> None:
    """A precondition guards a write, reads with a read tool of this file, expects fields that
    tool parses, and names only the tool's inputs (in its values and its lock)."""
    pre = spec.precondition
    if pre is None:
        return
    if spec.side_effect == "read":
        raise fail("precondition", "a read changes nothing: only a write has a precondition")
    if pre.tool not in specs or specs[pre.tool].side_effect != "read":
        raise fail("precondition.tool", f"{pre.tool!r} must be a read tool of this same file")
    parsed = _parsed_fields(specs[pre.tool])
    for field, value in pre.expect.items():
        if isinstance(value, dict) and "matches" in value:
            check_pattern(path, f"{key}.precondition.expect.{field}.matches", str(value["matches"]))
    for field in pre.expect:
        if field not in parsed:
            raise fail(f"precondition.expect.{field}", f"{pre.tool} does not parse a field {field!r} "
                                                       f"(it parses {', '.join(parsed) or 'nothing'})")
    for where, value in (*((f"inputs.{k}", v) for k, v in pre.inputs.items()),
                         *((f"expect.{k}", v) for k, v in pre.expect.items())):
        name = whole(value) if isinstance(value, str) else None
        if name is not None and name not in spec.inputs:
            raise fail(f"precondition.{where}", f"{{{name}}} is not an input of this tool")
    for _, name, _, _ in string.Formatter().parse(pre.lock):
        if name is not None and name not in spec.inputs:
            raise fail("precondition.lock", f"{{{name}}} is not an input of this tool; e.g. lock = \"item:{{item}}\"")


def _parsed_fields(spec: ToolSpec) -> list[str]:
    if spec.screen is not None:
        read = [name for step in spec.screen.steps for name in step.read]
        if spec.screen.output_fd is None:
            return read
        return read + [name for name in _plain_parsed(spec) if name not in read]
    return _plain_parsed(spec)


def _plain_parsed(spec: ToolSpec) -> list[str]:
    """The fields a read tool's output parses into, which a read-back may expect."""
    if spec.parse.kind == "lines":
        return ["lines", "lines_shown", "lines_total"]
    if spec.parse.kind == "columns":
        return ["rows", "rows_shown", "row_count"]
    return list(spec.parse.fields)


def _check_expectation(path: Path, key: str, value: Any, inputs: dict[str, InputSpec], *, settle: bool) -> None:
    """Refuse a read-back value or expectation that could not be rebuilt or judged.

    Args:
        key: the full key, e.g. ``tools.x_item_add.verify.expect.count``.

    Raises:
        ConfigError: ``<file>: key <key>: <why>``.
    """
    def fail(problem: str) -> ConfigError:
        return ConfigError(f"{path}: key {key}: {problem}")

    if isinstance(value, ExpectSpec):
        (test, arg), = value.plain().items()
        if settle and test in RELATIVE_TESTS:
            raise fail(f"{test} compares with the read before the act, which a settle read after a timeout "
                       "or crash does not have; use an absolute test (equals, present, absent, contains, "
                       "lacks, matches)")
        if test == "matches":
            check_pattern(path, f"{key}.matches", str(arg))
            return  # a regular expression is literal: its braces are not placeholders
        value = arg
    if not isinstance(value, str):
        return
    if problem := template_problem(value):
        raise fail(problem)
    if placeholders(value) and whole(value) is None:
        raise fail(f"{value!r}: a read-back value is one whole input (\"{{name}}\") "
                   "or a literal, so a settle read after a crash can be rebuilt exactly")
    for ref in placeholders(value):
        if ref not in inputs:
            raise fail(f"{{{ref}}} is not one of the tool's inputs ({', '.join(inputs) or 'none'})")


_FLAGS = re.compile(r"\(\?[a-zA-Z]+\)")


def whole_match(pattern: str | None) -> str | None:
    """An input's pattern, held to the whole value: pydantic searches a pattern anywhere in it,
    so "[a-z0-9._-]+" would let "/etc/shadow" through on its letters."""
    if pattern is None:
        return None
    flags = _FLAGS.match(pattern)
    head, body = (flags.group(0), pattern[flags.end():]) if flags else ("", pattern)
    if body.startswith("^") and body.endswith("$") and not body.endswith("\\$") and "|" not in body:
        return pattern  # already whole, as written: the schema and errors show the author's pattern
    return f"{head}^(?:{body})$"


def _inputs_model(name: str, inputs: dict[str, InputSpec], more: dict[str, Any] | None = None, *,
                  multiline: str | None = None) -> type[ToolInputs]:
    fields: dict[str, Any] = dict(more or {})
    for field_name, spec in inputs.items():
        kind: Any = Literal[tuple(spec.enum)] if spec.enum else TYPES[spec.type]
        extra = {"allow_dash": True} if spec.allow_dash else {}
        if spec.multiline and field_name == multiline:
            extra["allow_multiline"] = True  # checked at load: only the input fed on stdin
        if spec.sensitive:
            extra["sensitive"] = True
        extra = extra or None
        info = Field(
            description=spec.description,
            examples=[spec.example],
            pattern=whole_match(spec.pattern),
            min_length=spec.min_length,
            max_length=spec.max_length,
            ge=spec.minimum,
            le=spec.maximum,
            json_schema_extra=extra,
        )
        if spec.required:
            fields[field_name] = (Annotated[kind, info], ...)
        else:
            fields[field_name] = (Annotated[kind | None, info], spec.default)
    model_name = "".join(part.title() for part in name.split("_")) + "Inputs"
    try:
        return pydantic.create_model(model_name, __base__=ToolInputs, **fields)
    except (TypeError, ValueError, pydantic.PydanticUserError) as exc:
        raise ConfigError(f"tool {name}: its inputs cannot form a schema: {exc}") from None


_IMPORT_OUTPUTS = {"file": "the file written", "written": "records written", "count_before": "the count before",
                   "count_after": "the count after, read back", "taken_by": "how the program took the file"}
_EXPORT_OUTPUTS = {"rows": "the matching rows, at most max_rows", "matched": "how many rows matched",
                   "scanned": "rows read", "bad_rows": "rows that did not fit the columns' types",
                   "export": "the file read"}


def _errors(spec: ToolSpec) -> tuple[ErrorRule, ...]:
    if spec.export is not None:
        return exports.ERRORS
    if spec.import_ is not None:
        return imports.ERRORS
    rules = [ErrorRule(r.code, r.retry, r.next_action, r.hint, r.meaning) for r in spec.exit.values()]
    # Its own output, or its read-back's, can stop parsing.
    core = ["TIMEOUT", "SURFACE_CHANGED"] if spec.parse.kind != "none" or spec.verify or spec.screen else ["TIMEOUT"]
    core.append("AUTH_REQUIRED")  # any program may ask through askpass, or need a terminal to
    if spec.verify:
        core.append("UNEXPECTED_STATE")
    for code in [*core, *spec.errors]:
        if code not in {r.code for r in rules}:
            rules.append(ErrorRule.core(code))
    if spec.parse.kind not in ("none", "lines") or spec.verify:
        rules.append(ErrorRule("OUTPUT_TOO_LARGE", "no", "repair", "narrow the request",
                               "the output was too large to parse whole"))
    return tuple(rules)


class _ProgramRunner:
    """Runs one of the file's programs with one tool's argv, stdin, prompts, limits and user."""

    def __init__(self, program: Resolved, spec: ToolSpec) -> None:
        self.command = program.command
        self.env = program.spec.env
        self.credentials = program.spec.credentials
        self.user = spec.user or program.spec.user
        self.spec = spec
        self.slashed = frozenset(name for name, inp in spec.inputs.items() if inp.allow_slash)
        self.exit_table = {int(code): ErrorRule(r.code, r.retry, r.next_action, r.hint, r.meaning)
                           for code, r in spec.exit.items()}
        self.fixed_paths = tuple(fixed for _, fixed in programs.fixed_paths(spec.argv))

    def _check_word(self, template: str, word: str, values: dict[str, Any]) -> None:
        """Refuse inputs that would make ``word`` name what the tool file did not mean: a file
        out of its folder (a path word), any file (a name), a '..' two inputs make together,
        or a value the program reads as more than data (programs.refused_value).

        Raises:
            BadInput: naming the input; nothing ran.
        """
        names = placeholders(template)
        if not names:
            return
        inputs, literal = self.spec.inputs, literal_text(template)
        if whole(template) is None:
            inside_path(template, values, self.slashed)
        if "/" not in literal:
            for used in names:
                names_no_file(used, values.get(used), allow_path=inputs[used].allow_path,
                              constrained=bool(inputs[used].enum or inputs[used].pattern))
        if len(names) > 1 and ".." in word.split("/") and ".." not in literal.split("/") \
                and not any(inputs[used].allow_path for used in names):
            # Each input passed on its own, and together they climb: {a}{b} with "x/." and "./y".
            raise BadInput(f"{', '.join(names)}: together they make {word!r}, which climbs out by '..'",
                           hint="give values that do not end or begin with '.' next to each other")
        for used in names:
            value = values.get(used)
            if value is not None and (why := programs.refused_value(self.command, str(value))) is not None:
                raise BadInput(f"{used}: {str(value)!r} is refused for {self.command.name}: {why}",
                               hint=f"give {used} as a plain name")

    def program(self, values: dict[str, Any]) -> Program:
        spec = self.spec
        words = []
        files: dict[int, str] = {}  # argv index -> credential named there as a file
        for template in spec.argv:
            for credential in credential_files(template):
                files[len(words) + 1] = credential  # argv[0] is the command
            value = substitute(template, values)
            if value is None:
                continue  # an optional input left out drops its whole argument
            word = str(value).lower() if isinstance(value, bool) else str(value)
            if isinstance(template, str):
                self._check_word(template, word, values)
            name = whole(template)
            if name is not None and word.startswith("-") and not spec.inputs[name].allow_dash:
                # A number (-5) would read as an option as much as a string would; strings are
                # refused at validation, every other type here.
                raise BadInput(f"{name}: {word!r} would reach the program as an option",
                               hint=f"{name} must not start with '-'; give a value the program reads as data")
            words.append(word)
        stdin: Any = spec.stdin
        data = values.get(spec.stdin_input) if spec.stdin_input is not None else None
        if data is not None:
            text = str(data)
            # One line or many, the data ends with a line break, as a person's typing would.
            stdin = (text if text.endswith("\n") else text + "\n").encode()
        elif spec.stdin_eof:
            stdin = b""  # an optional input left out: nothing to send, and the declared end
        return Program(
            argv=(str(self.command), *words),
            env={**self.env, **spec.env},
            env_credentials={**self.credentials, **spec.credentials},
            file_credentials=spec.credential_files,
            argv_file_credentials=files,
            fixed_paths=self.fixed_paths,
            stdin=stdin,
            confirmations=tuple(Confirmation(re.compile(c.pattern), c.answer, c.times) for c in spec.confirm),
            credential_prompts=tuple(CredentialPrompt(re.compile(c.pattern), c.credential, c.times)
                                     for c in spec.credential_prompt),
            askpass=tuple(CredentialPrompt(re.compile(c.pattern), c.credential, c.times) for c in spec.askpass),
            limits=Limits(**spec.limits.model_dump()) if spec.limits else None,
            stdin_eof=spec.stdin_eof,
            user=self.user,
            terminal=spec.terminal,
            screen=_screen(spec.screen, values) if spec.screen is not None else None,
        )

    async def run(self, ctx: CallContext, values: dict[str, Any], *,
                  commits: bool = True) -> tuple[dict[str, Any], Completed]:
        done = await run_program(ctx, dataclasses.replace(self.program(values), commits=commits))
        if self.spec.screen is not None:
            if not done.stopped:  # else its exit is rungd's stop after the last step
                check_exit(done, self.exit_table, ok=tuple(self.spec.ok_exit))
            fields = _screen_fields(self.spec.screen, done.fields)
            if self.spec.screen.output_fd is not None and self.spec.parse.kind != "none":
                fields.update(await self._parsed(done))
            return fields, done
        check_exit(done, self.exit_table, ok=tuple(self.spec.ok_exit))
        return await self._parsed(done), done

    async def _parsed(self, done: Completed) -> dict[str, Any]:
        failed_quietly(self.spec.parse, done)  # before the size: a flood on stderr is still its words
        if _cut(done, self.spec.parse.stream) and self.spec.parse.kind not in ("none", "lines"):
            # Parsing the kept head and tail would call a healthy program "changed".
            raise ToolError(
                "OUTPUT_TOO_LARGE",
                f"the program printed {done.stdout_bytes} bytes, more than the tool keeps to parse",
                hint=f"narrow the request; {_kept(done)}",
            )
        # Off the loop and bounded: a pattern can hold the interpreter lock while it backtracks.
        return await parse_off_loop(self.spec.parse, _parsed_text(self.spec.parse.stream, done),
                                    whole=not _cut(done, self.spec.parse.stream))


def _cut(done: Completed, stream: str) -> bool:
    """Whether the output a tool parses (``stream``) was cut to its kept head and tail."""
    return {"stdout": done.stdout_cut, "stderr": done.stderr_cut}.get(stream, done.truncated)


def _parsed_text(stream: str, done: Completed) -> str:
    """The output a tool parses: stdout, stderr (debconf tools answer there), or both."""
    if stream == "stderr":
        return done.stderr
    if stream == "both":
        return done.stdout + ("" if not done.stdout or done.stdout.endswith("\n") else "\n") + done.stderr
    return done.stdout


class _ReadBack:
    """The read a write is verified by: another tool of the same file (any of its programs),
    run in this call."""

    def __init__(self, program: Resolved, target: ToolSpec, spec: ReadBackSpec) -> None:
        self.runner = _ProgramRunner(program, target)
        self.spec = spec
        self.name = spec.tool

    async def read_before(self, ctx: CallContext, values: dict[str, Any]) -> dict[str, Any]:
        """The read-back's fields before the act, noted on the call: its settle read, when the
        outcome becomes unknown, is the same read and is judged against them."""
        fields = await self.read(ctx, values)
        ctx.note_read_before(self.name, self.inputs(values), fields)
        return fields

    def inputs(self, values: dict[str, Any]) -> dict[str, Any]:
        """The read tool's inputs for a call with ``values``."""
        return {k: substitute(v, values) for k, v in self.spec.inputs.items()}

    async def read(self, ctx: CallContext, values: dict[str, Any]) -> dict[str, Any]:
        """The read-back's fields.

        Raises:
            ToolError: OUTPUT_TOO_LARGE when its output was cut, at the byte cap or past
                ``max_lines``: a partial listing cannot show that something is absent, nor
                is it the read a change is judged by.
        """
        try:
            fields, done = await self.runner.run(ctx, self.inputs(values), commits=False)
        except RungdError as exc:
            # Said as the read's, not the write's: "the field is not on the screen" of which run?
            if not exc.message.startswith("the read-back "):
                exc.message = f"the read-back {self.name}: {exc.message}"
                exc.args = (exc.message,)
            raise
        if _cut(done, self.runner.spec.parse.stream):
            raise ToolError("OUTPUT_TOO_LARGE", f"the read-back {self.name} printed more than the tool keeps, "
                            "so it cannot show whether the change happened",
                            hint=f"narrow the read-back; {_kept(done)}")
        if (cut := left_out(self.runner.spec.parse, fields)) is not None:
            raise ToolError("OUTPUT_TOO_LARGE", f"the read-back {self.name} is too cut to decide whether the "
                            f"change happened: {cut}",
                            hint=f"the operator must raise max_lines of {self.name} in the tool file or narrow "
                            f"its inputs; {_kept(done)}")
        return fields

    def expected(self, values: dict[str, Any]) -> dict[str, Any]:
        """The expectations bound to the call's inputs; a ``matches`` pattern stays literal."""
        bound: dict[str, Any] = {}
        for field, value in self.spec.expect.items():
            if isinstance(value, ExpectSpec):
                (test, arg), = value.plain().items()
                bound[field] = {test: arg if test == "matches" else substitute(arg, values)}
            else:
                bound[field] = substitute(value, values)
        return bound


def _evidence_of(done: Completed) -> str:
    """The evidence a hint points at: the stdout the parse read (stderr's may come first)."""
    for evidence_id in done.evidence:
        if evidence_id.endswith(".stdout"):
            return evidence_id
    return done.evidence[0] if done.evidence else "(none: the state folder could not hold it)"


def _kept(done: Completed) -> str:
    """Where the whole output is, said as far as it is true: evidence has a cap too."""
    if done.evidence_cut:
        return f"its output is in evidence {_evidence_of(done)} up to the evidence cap (the rest was not kept)"
    return f"its full output is in evidence {_evidence_of(done)}"


def _matches(fields: dict[str, Any], expected: dict[str, Any], before: dict[str, Any] | None = None) -> bool:
    return shows(fields, expected, before) is True


def _handler(program: _ProgramRunner, readback: _ReadBack | None, spec: ToolSpec,
             settle: _ReadBack | None = None) -> Any:
    async def handle(ctx: CallContext, inputs: ToolInputs) -> Result:
        values = inputs.model_dump()
        if readback is None:
            fields, done = await program.run(ctx, values)
            cut, clipped = left_out(spec.parse, fields), _cut(done, spec.parse.stream)
            narrow = None
            if clipped or cut:
                why = [cut] if cut else []
                if clipped:
                    why.append("the output was cut at the byte cap the tool keeps"
                               + (" (how many lines it had is unknown)" if spec.parse.kind == "lines" else ""))
                narrow = f"{'; '.join(why)}; ask for less (a narrower input), or read it: {_kept(done)}"
            verified = "read off the screen" if spec.screen is not None and fields else \
                f"parsed {spec.parse.kind} output" if spec.parse.kind != "none" else None
            return Result(fields=fields, truncated=clipped or cut is not None, narrow=narrow, verified_by=verified)
        return await _act_and_verify(ctx, program, readback, values, settle)

    return handle


async def _act_and_verify(
    ctx: CallContext, program: _ProgramRunner, readback: _ReadBack, values: dict[str, Any],
    settle: _ReadBack | None = None,
) -> Result:
    """Read before, act, poll the read until it shows the expected state, report honestly.

    The read before is noted on the call (and so is the settle read's, when the tool names
    another one), so a settle read after an error credits the call only with what moved.
    """
    expected = readback.expected(values)
    before = await readback.read_before(ctx, values)
    if settle is not None:
        # Only for judging a settle after an error: a settle read that cannot answer now (a
        # listing cut at max_lines, a failure) must not stop the write it would judge.
        with contextlib.suppress(RungdError):
            await settle.read_before(ctx, values)
    try:
        output, _ = await program.run(ctx, values)
    except SurfaceChanged:
        # The program ran; whether it did its work is for the read-back to say, not its
        # chatter. The outcome is left to the boundary: unknown after the commit point.
        raise
    give_up = trio.current_time() + readback.spec.wait_s
    after = await readback.read(ctx, values)
    while not _matches(after, expected, before) and trio.current_time() < give_up:
        await trio.sleep(0.2)
        after = await readback.read(ctx, values)
    fields = {**output, "before": before, "after": after}
    verified = f"{readback.name} after the change (rung 2)"
    if _matches(after, expected, before):
        # changed only when the read after differs from the read before in the expected
        # way: a state the read before already showed is no_change, whatever the exit said.
        already = _matches(before, expected, before) or after == before
        return Result(fields=fields, effect="no_change" if already else "changed", verified_by=verified)
    if after == before:
        raise UnexpectedState(
            "the program reported success, but the read-back shows nothing changed",
            hint=f"expected {expected}, still {after}; something blocks the change: ask the operator",
            outcome="done", fields=fields,
        )
    raise UnexpectedState(
        f"the read-back moved somewhere unexpected: expected {expected}, found {after}",
        hint="someone else may be changing this; read it again before deciding",
        outcome="unknown", fields=fields,
    )
