"""Adverse-outcome receipts for the tools of Python plugins: each program stood in for
where it is started.

A Python plugin chooses its program in code, so ``rungctl check`` cannot rewrite a file as it
does a tool file's ``[program] command``. Its throw-away daemon loads the config's plugins
with their settings instead, and replaces every program a call starts (``run(ctx,
Program)``) through ``CallContext.stand_in``: argv[0] becomes the fixture's stand-in
(``standins.write_plugin_standin``); the rest of argv, the environment and the credentials
stay as the plugin built them, and it runs as the daemon's user. The stand-in is told whether
it was started as the act (a write's ``Program.commits``) or as a read, the question the
program's first confirmation recognises, and the names of the variables and files that carry
its credentials; the real program never runs. A program a handler starts another way
(``subprocess``) is out of rungd's reach: it runs for real, and the receipt cannot know.

What a plugin's program prints when it works is known only to the plugin's code, unless
the plugin says it: a ``Program(example_output=...)`` is printed by the stand-in wherever a
read plays no fixture, so a handler that parses a read before its act reaches the act.

    read tools    missing  hang  question  flood  secret                 outside: empty
    write tools   missing  hang_before  hang_after  question  flood  secret
                  acts_dies  noop                                        outside: already

(What a tool of its kind is never given is listed as outside the check, as acts_dies is for
a read: it does not make a receipt ``PART``.)

missing, hang(_before), question, flood and secret play their part in every program the call
starts, so they are met at the first, a read before the act included. hang_after, acts_dies
and noop aim at the act (the program started with ``commits``); a read before it with no
example prints nothing, the handler usually stops there (SURFACE_CHANGED), and the receipt
says the fixture did not reach the act (``PART``) rather than counting it as passed. Every
result is still held to what no result may be (its cap, a hint, never pending, never
``not_started`` after an act), and every seeded secret is looked for in envelopes, the
ledger, evidence and the log.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import trio

from rungd.authoring.check import (
    CHECK_DEADLINE_S,
    CHECK_SECRET,
    CHECK_SECRET_ENV,
    HANGS,
    SLOW_DEADLINE_S,
    FixtureResult,
    LogCapture,
    Receipt,
    codes,
    judged_always,
    merged,
    secret_hits,
    throwaway_daemon,
)
from rungd.authoring.standins import (
    CONFIRM_ENV,
    EXAMPLE_ENV,
    ROLE_ENV,
    SECRET_FILES_ENV,
    SECRET_VARS_ENV,
    CannotSynthesize,
    confirmation_text,
    write_plugin_standin,
)
from rungd.config import Config, CredentialsConfig, GatesConfig, ServerConfig, StateConfig
from rungd.core.contract import CallContext, Tool
from rungd.core.envelope import Envelope
from rungd.core.errors import RungdError
from rungd.runner.program import EXAMPLE_BYTES, Program
from rungd.service.inprocess import RunningDaemon
from rungd.service.plugins import RegisteredTool

READ_FIXTURES = ("missing", "hang", "question", "flood", "secret")
WRITE_FIXTURES = ("missing", "hang_before", "hang_after", "question", "flood", "secret", "acts_dies", "noop")
# Fixtures that aim at the act: the reads before it may end the call first.
NEEDS_ACT = ("hang_after", "acts_dies", "noop")
# What a Python tool is never given (as a read tool never gets acts_dies): said on its receipt,
# not counted against it.
OUTSIDE = {False: ("empty: whether an empty output is an answer is known only to the plugin's code",),
           True: ("already: what its reads show once the state it aims at holds is known only to the "
                  "plugin's code",)}
EXPECTED = {"hang": {"TIMEOUT"}, "hang_before": {"TIMEOUT"}, "hang_after": {"TIMEOUT"},
            "question": {"PROMPT_UNEXPECTED"}}
# A screen program's: a step's wait that no screen answers ends SURFACE_CHANGED (or TIMEOUT).
SCREEN_EXPECTED = {"hang": {"TIMEOUT", "SURFACE_CHANGED"}, "hang_before": {"TIMEOUT", "SURFACE_CHANGED"},
                   "hang_after": {"TIMEOUT", "SURFACE_CHANGED"}, "question": {"SURFACE_CHANGED", "TIMEOUT"}}


@dataclasses.dataclass(frozen=True)
class Started:
    """A program a tool's handler started, as the stand-in saw it."""

    role: str  # "act" or "read"
    argv: tuple[str, ...]
    example: str | None


class StandIn:
    """What the throw-away daemon gives every tool and runs instead of every program
    (``Daemon(stand_in=...)``, ``CallContext.stand_in``).

    Args:
        path: the stand-in to run (a symlink the check points at each fixture's).
        deadline_s: the longest deadline a tool keeps (a hang is a hang after 2 s).
    """

    def __init__(self, path: Path, deadline_s: float) -> None:
        self.path = path
        self.deadline_s = deadline_s
        # Tools a program of which was given its stdin (bytes, or an end at once): a question
        # it asks reads that, never waits, so no PROMPT_UNEXPECTED can come.
        self.fed: set[str] = set()
        # Tools that started a screen program: a question there is text on a screen no step
        # waits for, not a read of a line.
        self.screens: set[str] = set()
        # Per tool, each program it started: its role ("act" or "read"), its own argv, and
        # the example_output the stand-in prints for it (None: none given).
        self.started: dict[str, list[Started]] = {}

    def tool(self, tool: Tool) -> Tool:
        """The tool with its deadline cut and no gate of its own (the check is about results)."""
        timing = dataclasses.replace(tool.timing, deadline_s=min(tool.timing.deadline_s, self.deadline_s))
        return dataclasses.replace(tool, timing=timing, gate=None)

    def program(self, ctx: CallContext, program: Program) -> Program:
        """``program`` with the stand-in for argv[0], told its role and what to ask and print."""
        if program.stdin != "none":
            self.fed.add(ctx.tool.name)
        if program.terminal == "screen":
            self.screens.add(ctx.tool.name)
        role = "act" if ctx.tool.side_effect != "read" and program.commits else "read"
        example = None
        if program.example_output is not None:  # its first EXAMPLE_BYTES: an example, not a recording
            example = program.example_output.encode()[:EXAMPLE_BYTES].decode(errors="ignore")
        self.started.setdefault(ctx.tool.name, []).append(Started(role, program.argv, example))
        env = {**program.env, ROLE_ENV: role,
               SECRET_VARS_ENV: ",".join([CHECK_SECRET_ENV, *program.env_credentials]),
               SECRET_FILES_ENV: ",".join(program.file_credentials)}
        if program.confirmations:
            try:
                env[CONFIRM_ENV] = confirmation_text(program.confirmations[0].pattern.pattern)
            except CannotSynthesize:
                pass  # it acts without asking: the commit point is then its start
        if example is not None:
            env[EXAMPLE_ENV] = example
        return dataclasses.replace(program, argv=(str(self.path), *program.argv[1:]), user=None, env=env,
                                   env_credentials={**program.env_credentials, CHECK_SECRET_ENV: CHECK_SECRET})


async def check_plugin_tools(config: Config, tools: list[RegisteredTool]) -> list[Receipt]:
    """Run the fixtures against ``tools`` (of the config's Python plugins), in two
    throw-away daemons side by side: one for the fixtures that hang, one for the rest.

    Returns:
        One receipt per tool, in the order given.

    Raises:
        CheckError: the plugins do not load in the throw-away daemon; the message has a hint.

    Cancellation: the daemons are stopped and their folders removed either way.
    """
    parts: dict[bool, list[Receipt]] = {}

    async def group(hangs: bool) -> None:
        parts[hangs] = await _check_group(config, tools, hangs)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(group, True)
        nursery.start_soon(group, False)
    return merged(parts[True], parts[False])


async def _check_group(config: Config, tools: list[RegisteredTool], hangs: bool) -> list[Receipt]:
    folder = Path(tempfile.mkdtemp(prefix="rungd-"))  # short: the socket's path must fit sun_path
    try:
        plan = _Plan(folder, tools, hangs)
        async with throwaway_daemon(plan.config(config), "the check's daemon for the config's plugins",
                                    stand_in=plan.stand_in) as (running, logs):
            return [await plan.check_tool(running, tool, logs) for tool in tools]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class _Plan:
    """The throw-away folder of one daemon: its stand-ins, credentials and config."""

    def __init__(self, folder: Path, tools: list[RegisteredTool], hangs: bool) -> None:
        self.folder = folder
        self.hangs = hangs  # this daemon runs only the fixtures that hang, with short deadlines
        self.program = folder / "program"  # a symlink: pointed at each fixture's stand-in in turn
        self.stand_in = StandIn(self.program, CHECK_DEADLINE_S if hangs else SLOW_DEADLINE_S)
        self.secrets = seeded_secrets(tools)
        self.seen_hits: set[str] = set()

    def config(self, config: Config) -> Config:
        """The operator's config with its plugins and their settings, no tool files (their
        tools are checked from their files), the rest the check's own (``standin_config``)."""
        return standin_config(config.model_copy(update={"plugins": config.plugins.model_copy(
            update={"tool_dirs": []})}), self.folder, self.secrets)

    async def check_tool(self, running: RunningDaemon, registered: RegisteredTool, logs: LogCapture) -> Receipt:
        tool = registered.tool
        receipt = Receipt(tool.name, f"plugin {registered.plugin}")
        write = tool.side_effect != "read"
        inputs = tool.example_inputs()
        try:
            tool.validate(inputs)
        except RungdError as exc:
            missing = [name for name in tool.inputs.model_fields if inputs.get(name) == f"<{name}>"]
            why = (f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no examples" if missing
                   else f"its inputs' examples do not make a valid call ({exc})")
            receipt.skipped = (f"not called: {why}; hint: give every required input examples=[...] "
                               "(rungctl lint names each)")
            return receipt
        receipt.outside = list(OUTSIDE[write])
        envelopes: list[Envelope] = []
        started = False
        for fixture in WRITE_FIXTURES if write else READ_FIXTURES:
            if (fixture in HANGS) != self.hangs:
                continue
            result, ran = await self._fixture(running, tool, fixture, inputs, receipt, envelopes, logs)
            receipt.fixtures.append(result)
            started |= ran
        if not started and receipt.fixtures:
            receipt.skipped = ("its handler started no program through run() with its example inputs, so "
                               "there is nothing to stand in for; a program it starts another way (subprocess, "
                               "os.system) is not stood in for: it ran for real. Test it with rungd.testing "
                               "(plugins/README.md, section 6)")
        receipt.secret_hits = secret_hits(self.secrets.values(), self.folder, envelopes, logs, self.seen_hits)
        return receipt

    async def _fixture(self, running: RunningDaemon, tool: Tool, fixture: str, inputs: dict,
                       receipt: Receipt, envelopes: list[Envelope], logs: LogCapture) -> tuple[FixtureResult, bool]:
        """Run one fixture twice; also whether the tool started any program through run()."""
        folder = self.folder / "standins" / tool.name
        folder.mkdir(parents=True, exist_ok=True)
        if fixture == "missing":
            standin = folder / "missing"  # never written: the program is gone
        else:
            standin = write_plugin_standin(folder, fixture)
        staged = self.folder / "program.next"  # replaced atomically: never seen half-swapped
        staged.unlink(missing_ok=True)
        staged.symlink_to(standin)
        os.replace(staged, self.program)
        result = FixtureResult(fixture)
        write = tool.side_effect != "read"
        ran = False
        for attempt in (1, 2):
            (folder / "acted").unlink(missing_ok=True)
            request_id = f"check-{fixture}-{attempt}-{secrets.token_hex(4)}" if write else None
            seen = len(self.stand_in.started.get(tool.name, []))
            env = await running.call(tool.name, inputs, request_id=request_id, wait_s=SLOW_DEADLINE_S * 3 + 10)
            envelopes.append(env)
            acted = (folder / "acted").exists()
            started = self.stand_in.started.get(tool.name, [])[seen:]
            ran |= bool(started)
            result.runs.append(codes(env))
            result.problems += judged_always(env, tool.cap_bytes, acted)
            if env.call_id in logs.crashed:
                result.problems.append(f"{codes(env)}: the handler raised an exception (a bug in the plugin; the "
                                       "daemon's log has the traceback)")
            if fixture in NEEDS_ACT and all(run.role != "act" for run in started):
                code = env.error.code if env.error is not None else env.status
                if any(run.example is not None for run in started):
                    result.unreached = (f"the call ended {code} before its act: its handler did not act on what its "
                                        "reads' example_output showed; an example of the state before the change "
                                        "would reach the act")
                else:
                    result.unreached = (f"the call ended {code} before its act: a read before it printed nothing "
                                        "its handler could use; give that read's Program an example_output")
            else:
                result.problems += self._judge(tool, fixture, env, started)
            if env.effect == "changed" and (not env.verified_by or not acted):
                receipt.verified_from_skipped = True
            if write and attempt == 1 and env.outcome != "not_started" and env.status != "pending":
                before = len(self.stand_in.started.get(tool.name, []))
                envelopes.append(await running.call(tool.name, inputs, request_id=request_id,
                                                    wait_s=SLOW_DEADLINE_S * 3 + 10))
                if len(self.stand_in.started.get(tool.name, [])) > before:
                    receipt.unknown_write_retries += 1
        result.problems = sorted(set(result.problems))
        return result, ran

    def _judge(self, tool: Tool, fixture: str, env: Envelope, started: list[Started]) -> list[str]:
        """What the fixture rules out of a Python tool's result (``started``: what the call ran)."""
        code = env.error.code if env.error is not None else None
        expected = (SCREEN_EXPECTED if tool.name in self.stand_in.screens else EXPECTED).get(fixture)
        if fixture == "question" and tool.name in self.stand_in.fed:
            expected = None  # its stdin carries what the plugin gave it, then ends: nothing waits
        if expected is not None and code not in expected:
            return [f"expected {' or '.join(sorted(expected))}, got {code or env.status}"]
        if fixture == "missing" and env.status != "error":
            return [f"expected an error, got {env.status}"]
        if fixture == "acts_dies" and env.status == "ok" and env.effect != "changed":
            return [f"the program acted and was killed, yet the call is ok with effect {env.effect}"]
        # Only where each read printed the same every time: a read given another example after
        # the act than before it shows a change the stand-in never made, as the plugin says.
        shown: dict[tuple[str, ...], set[str | None]] = {}
        for run in started:
            if run.role == "read":
                shown.setdefault(run.argv, set()).add(run.example)
        same = all(len(examples) == 1 for examples in shown.values())
        if fixture == "noop" and env.effect == "changed" and same:
            return ["the program did nothing and its reads showed the same before and after, yet effect is changed"]
        return []


def seeded_secrets(tools: Iterable[RegisteredTool]) -> dict[str, str]:
    """A random value for every credential the tools may obtain, and the check's own (which
    every stand-in is given): the credentials of a throw-away daemon, never real ones."""
    names = {CHECK_SECRET, *(name for registered in tools for name in registered.tool.credentials)}
    return {name: "rungdck" + secrets.token_hex(16) for name in sorted(names)}


def standin_config(config: Config, folder: Path, secrets: dict[str, str]) -> Config:
    """``config``'s plugins, their settings and its limits, the rest a throw-away daemon's own:
    its socket and state in ``folder``, ``secrets`` as its credentials (a 0600 file), every
    gate none (a check and a dry run are about results, not approvals)."""
    creds = folder / "credentials.toml"
    fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write("".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in secrets.items()))
    return Config(server=ServerConfig(socket=folder / "rungd.sock", shutdown_grace_s=2),
                  state=StateConfig(dir=folder / "state"), plugins=config.plugins,
                  credentials=CredentialsConfig(file=creds), limits=config.limits,
                  gates=GatesConfig(read="none", reversible="none", visible="none", irreversible="none"))
