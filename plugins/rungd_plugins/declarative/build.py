"""Turning one validated tool file into ``Tool`` declarations with working handlers.

Everything that can be checked before a call is checked at load time, so a mistake in a
tool file stops start-up with its file and key, instead of failing a call at 3 a.m.:
placeholders name declared inputs, read-backs and settle reads name tools of the same
file, regexes compile, the program exists and is executable, writes have a read-back.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import trio
from pydantic import Field
from rungd.sdk import (
    CallContext,
    Completed,
    ConfigError,
    Confirmation,
    CredentialPrompt,
    Description,
    ErrorRule,
    Heading,
    Limits,
    Program,
    Result,
    RuledOut,
    Session,
    SettleSpec,
    StepDown,
    SurfaceChanged,
    Timing,
    Tool,
    ToolError,
    ToolInputs,
    UnexpectedState,
    check_exit,
    shows,
)
from rungd.sdk import run as run_program  # the method below is called run too

from rungd_plugins.declarative import exports, imports
from rungd_plugins.declarative.columns import TYPES
from rungd_plugins.declarative.parse import parse_output
from rungd_plugins.declarative.schema import InputSpec, ReadBackSpec, ToolFile, ToolSpec
from rungd_plugins.declarative.templates import placeholders, substitute, whole

# Programs that would read their arguments as code: never a tool file's program.
SHELLS = r"(ba|da|z|k|c|tc|fi|mk|a)?sh|busybox|env|python[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node|nodejs|php[0-9.]*|lua[0-9.]*|tclsh[0-9.]*|wish[0-9.]*|awk|gawk|mawk|xargs"


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
    command = _resolve_command(path, file.program.command)
    specs = file.tools
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
        extra: dict[str, Any] = {}
        commit_point = spec.commit_point
        settle: Any = spec.settle or spec.verify  # by default the read-back also settles an unknown
        if spec.export is not None:
            handler = export_tools[name].handle
        elif spec.import_ is not None:
            record = imports.record_model(name, spec.import_)
            extra[spec.import_.rows_input] = imports.rows_field(spec.import_, record)
            count = _counter(command, file, specs, spec.import_.count, export_tools)
            handler = imports.ImportTool(path, name, spec, record, count).handle
            commit_point = "callback"  # the rename into the watched folder
            settle = spec.settle or spec.import_.count
        else:
            program = _ProgramRunner(command, file.program.env, file.program.credentials, spec)
            readback = _ReadBack(command, file.program, specs[spec.verify.tool], spec.verify) if spec.verify else None
            handler = _handler(program, readback, spec)
        built.append(
            Tool(
                name=name,
                description=Description(**spec.description.model_dump()),
                inputs=_inputs_model(name, spec.inputs, extra),
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
                        {k: _as_reference(v) for k, v in getattr(settle, "expect", {}).items()},
                        at_once=getattr(settle, "at_once", True),
                    ) if settle else None,
                ),
                cap_bytes=spec.cap_bytes,
                concurrency=spec.concurrency,
                gate=spec.gate,
                log_fields=tuple(spec.log_fields),
                lint_waivers=spec.lint_waivers,
                heading=_heading(path, key, spec),
                credentials=_credentials(file, spec),
            )
        )
    return Loaded(path, built)


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
    names = {*file.program.credentials.values(), *spec.credentials.values(), *spec.credential_files.values(),
             *(c.credential for c in spec.credential_prompt), *(c.credential for c in spec.askpass)}
    return tuple(sorted(names))


def _counter(command: Path, file: ToolFile, specs: dict[str, ToolSpec], count: Any,
             export_tools: dict[str, exports.ExportTool]) -> imports.Count:
    """The count an import reads back: rows an export tool matches, or a parsed field."""
    if count.tool in export_tools:
        return export_tools[count.tool].count
    program = _ProgramRunner(command, file.program.env, file.program.credentials, specs[count.tool])

    async def parsed(ctx: CallContext, values: dict[str, Any]) -> int:
        fields, _ = await program.run(ctx, values, commits=False)
        return int(fields[count.field])

    return parsed


def _default_outputs(spec: ToolSpec) -> dict[str, str]:
    if spec.export is not None:
        return _EXPORT_OUTPUTS
    if spec.import_ is not None:
        return _IMPORT_OUTPUTS
    return {k: k for k in spec.parse.fields}


def _as_reference(value: Any) -> Any:
    """``"{item}"`` in a tool file is ``"$item"`` in a SettleSpec: the call's own input."""
    name = whole(value)
    return value if name is None else "$" + name


def _resolve_command(path: Path, command: str) -> Path:
    if "/" in command:
        resolved = Path(command) if os.path.isabs(command) else (path.parent / command).resolve()
    else:
        found = shutil.which(command)
        if found is None:
            raise ConfigError(f"{path}: key program.command: {command!r} is not on PATH; "
                              "hint: install it or give its absolute path, e.g. command = \"/usr/bin/df\"")
        resolved = Path(found)
    if not (resolved.is_file() and os.access(resolved, os.X_OK)):
        raise ConfigError(f"{path}: key program.command: {resolved} is not an executable file")
    if re.fullmatch(SHELLS, resolved.name) or re.fullmatch(SHELLS, Path(os.path.realpath(resolved)).name):
        raise ConfigError(f"{path}: key program.command: {resolved.name} is a shell or script interpreter; "
                          "rungd never runs one, since it would read inputs as code: wrap the program itself")
    return resolved


def _check_tool(path: Path, key: str, name: str, spec: ToolSpec, specs: dict[str, ToolSpec]) -> None:
    def fail(where: str, problem: str) -> ConfigError:
        return ConfigError(f"{path}: key {key}.{where}: {problem}")

    if not re.match(r"^[a-z][a-z0-9]*(_[a-z0-9]+){1,5}$", name):
        raise ConfigError(f"{path}: key {key}: tool names look like <system>_<object>_<verb>, e.g. inventory_item_show")
    for i, arg in enumerate(spec.argv):
        for ref in placeholders(arg):
            if ref not in spec.inputs:
                raise fail(f"argv[{i}]", f"{{{ref}}} is not one of its inputs ({', '.join(spec.inputs) or 'none'})")
    for field in spec.log_fields:
        if field not in spec.inputs:
            raise fail("log_fields", f"{field!r} is not one of its inputs")
    if spec.stdin_input is not None and spec.stdin_input not in spec.inputs:
        raise fail("stdin_input", f"{spec.stdin_input!r} is not one of its inputs")
    for code in spec.exit:
        if not code.lstrip("-").isdigit():
            raise fail(f"exit.{code}", "keys are exit statuses, e.g. [tools.x.exit.3]")
    patterns = [("parse.pattern", spec.parse.pattern)] if spec.parse.pattern else []
    patterns += [(f"confirm[{i}].pattern", c.pattern) for i, c in enumerate(spec.confirm)]
    patterns += [(f"credential_prompt[{i}].pattern", c.pattern) for i, c in enumerate(spec.credential_prompt)]
    patterns += [(f"askpass[{i}].pattern", c.pattern) for i, c in enumerate(spec.askpass)]
    for where, pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise fail(where, f"not a valid regular expression: {exc}") from None
    if spec.parse.kind == "regex" and not spec.parse.pattern:
        raise fail("parse.pattern", "a regex parser needs a pattern with named groups")
    if spec.commit_point == "confirmation" and not spec.confirm:
        raise fail("commit_point", "'confirmation' needs a [[...confirm]] entry to answer")
    if spec.side_effect != "read" and spec.verify is None and spec.import_ is None:
        raise fail("verify", "a tool that changes something needs a read-back: "
                             "[tools.NAME.verify] tool = \"<a read tool of this file>\"")
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
            if isinstance(value, str) and placeholders(value) and whole(value) is None:
                raise fail(f"{where}.{field}", f"{value!r}: a read-back value is one whole input (\"{{name}}\") "
                                               "or a literal, so a settle read after a crash can be rebuilt exactly")
    if spec.verify:
        target = specs[spec.verify.tool]
        for field in spec.verify.expect:
            if field not in target.parse.fields:
                raise fail(f"verify.expect.{field}", f"{spec.verify.tool} does not parse a field {field!r}")


def _inputs_model(name: str, inputs: dict[str, InputSpec], more: dict[str, Any] | None = None) -> type[ToolInputs]:
    fields: dict[str, Any] = dict(more or {})
    for field_name, spec in inputs.items():
        kind: Any = Literal[tuple(spec.enum)] if spec.enum else TYPES[spec.type]
        extra = {"allow_dash": True} if spec.allow_dash else None
        info = Field(
            description=spec.description,
            examples=[spec.example],
            pattern=spec.pattern,
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
    core = ["TIMEOUT", "SURFACE_CHANGED"] if spec.parse.kind != "none" or spec.verify else ["TIMEOUT"]
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
    """Runs the file's program with one tool's argv, stdin, prompts and limits."""

    def __init__(self, command: Path, env: dict[str, str], credentials: dict[str, str], spec: ToolSpec) -> None:
        self.command = command
        self.env = env
        self.credentials = credentials
        self.spec = spec
        self.exit_table = {int(code): ErrorRule(r.code, r.retry, r.next_action, r.hint, r.meaning)
                           for code, r in spec.exit.items()}

    def program(self, values: dict[str, Any], argv: list[str] | None = None) -> Program:
        spec = self.spec
        words = []
        for template in argv if argv is not None else spec.argv:
            value = substitute(template, values)
            if value is None:
                continue  # an optional input left out drops its whole argument
            words.append(str(value).lower() if isinstance(value, bool) else str(value))
        stdin: Any = spec.stdin
        if spec.stdin_input is not None and values.get(spec.stdin_input) is not None:
            stdin = str(values[spec.stdin_input]).encode() + b"\n"
        return Program(
            argv=(str(self.command), *words),
            env={**self.env, **spec.env},
            env_credentials={**self.credentials, **spec.credentials},
            file_credentials=spec.credential_files,
            stdin=stdin,
            confirmations=tuple(Confirmation(re.compile(c.pattern), c.answer, c.times) for c in spec.confirm),
            credential_prompts=tuple(CredentialPrompt(re.compile(c.pattern), c.credential, c.times)
                                     for c in spec.credential_prompt),
            askpass=tuple(CredentialPrompt(re.compile(c.pattern), c.credential, c.times) for c in spec.askpass),
            limits=Limits(**spec.limits.model_dump()) if spec.limits else None,
        )

    async def run(self, ctx: CallContext, values: dict[str, Any], *,
                  commits: bool = True) -> tuple[dict[str, Any], Completed]:
        done = await run_program(ctx, dataclasses.replace(self.program(values), commits=commits))
        check_exit(done, self.exit_table, ok=tuple(self.spec.ok_exit))
        if done.truncated and self.spec.parse.kind not in ("none", "lines"):
            # Parsing the kept head and tail would call a healthy program "changed".
            raise ToolError(
                "OUTPUT_TOO_LARGE",
                f"the program printed {done.stdout_bytes} bytes, more than the tool keeps to parse",
                hint=f"narrow the request; the full output is in evidence {done.evidence[0]}",
            )
        return parse_output(self.spec.parse, done.stdout), done


class _ReadBack:
    """The read a write is verified by: another tool of the same file, run in this call."""

    def __init__(self, command: Path, program: Any, target: ToolSpec, spec: ReadBackSpec) -> None:
        self.runner = _ProgramRunner(command, program.env, program.credentials, target)
        self.spec = spec
        self.name = spec.tool

    async def read(self, ctx: CallContext, values: dict[str, Any]) -> dict[str, Any]:
        inputs = {k: substitute(v, values) for k, v in self.spec.inputs.items()}
        fields, _ = await self.runner.run(ctx, inputs, commits=False)
        return fields

    def expected(self, values: dict[str, Any]) -> dict[str, Any]:
        return {k: substitute(v, values) for k, v in self.spec.expect.items()}


def _matches(fields: dict[str, Any], expected: dict[str, Any]) -> bool:
    return shows(fields, expected) is True


def _handler(program: _ProgramRunner, readback: _ReadBack | None, spec: ToolSpec) -> Any:
    async def handle(ctx: CallContext, inputs: ToolInputs) -> Result:
        values = inputs.model_dump()
        if readback is None:
            fields, done = await program.run(ctx, values)
            return Result(fields=fields, truncated=done.truncated,
                          narrow="the output was cut; the full output is in the evidence" if done.truncated else None,
                          verified_by=f"parsed {spec.parse.kind} output" if spec.parse.kind != "none" else None)
        return await _act_and_verify(ctx, program, readback, values)

    return handle


async def _act_and_verify(
    ctx: CallContext, program: _ProgramRunner, readback: _ReadBack, values: dict[str, Any]
) -> Result:
    """Read before, act, poll the read until it shows the expected state, report honestly."""
    expected = readback.expected(values)
    before = await readback.read(ctx, values)
    try:
        output, _ = await program.run(ctx, values)
    except SurfaceChanged:
        # The program ran; whether it did its work is for the read-back to say, not its
        # chatter. The outcome is left to the boundary: unknown after the commit point.
        raise
    give_up = trio.current_time() + readback.spec.wait_s
    after = await readback.read(ctx, values)
    while not _matches(after, expected) and trio.current_time() < give_up:
        await trio.sleep(0.2)
        after = await readback.read(ctx, values)
    fields = {**output, "before": before, "after": after}
    verified = f"{readback.name} after the change (rung 2)"
    if _matches(after, expected):
        return Result(fields=fields, effect="no_change" if _matches(before, expected) else "changed",
                      verified_by=verified)
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
