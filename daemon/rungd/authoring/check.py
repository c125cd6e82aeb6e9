"""Adverse-outcome receipts: a tool file's contract run against stand-ins for its program.

``rungctl check`` copies a tool file into a throw-away folder with its ``[program] command``
pointed at a stand-in (``rungd.authoring.standins``), starts a throw-away daemon on that copy, and calls
every tool once per adverse fixture, twice each, never running the real program:

    read tools    missing  hang  question  flood  secret  empty
    write tools   missing  hang_before  hang_after  question  flood  secret  acts_dies  noop  already
    export tools  missing  empty  changed  flood
    screen tools  missing  hang  never  dialog  dies  flood  secret  (and a write's acts_dies  noop  already)

A screen tool's stand-in draws, with plain escape sequences, the state each step waits for and
the fields its reads take, and reads the keys each step presses; "never" draws a screen no step
expects, "dialog" an extra dialog after the first key, "dies" exits after it.

It prints one receipt per tool, in the shape of the seed's acceptance line:

    PASS apt_package_remove  fixtures=8 stableCodes=8 secretHits=0 unknownWriteRetries=0 verifiedFromSkipped=false

and fails (exit status 1) when a fixture gives different codes twice (unstable), a seeded
credential appears anywhere (an envelope, the ledger, evidence, the daemon's log), a write
whose outcome was not ``not_started`` runs again on a repeat with the same request_id, an
effect is reported ``changed`` without a read-back that shows the change, or a fixture ends
in a result its contract rules out (a hang that reports ``not_started`` after the program
acted, an empty answer from a program that printed nothing it can parse, ...).

What is changed in the copy, and why: deadlines are cut to ``CHECK_DEADLINE_S`` for the
fixtures that hang and to at most ``SLOW_DEADLINE_S`` for the others, and a
read-back's ``wait_s`` to 0 (a hang is a hang after 2 s as after 300 s; a stand-in
acts before it exits, so one read shows what happened); the tool's own
``gate`` is dropped and every class gets gate ``none`` (the check is about results, not
approvals); each tool gets an extra credential, ``rungd_check_secret``, so even a tool that
declares none shows whether a secret its program prints is redacted.

Python plugins' tools are checked by ``rungd.authoring.plugin_check``, their programs stood in
for where the plugin starts them. A tool or fixture the check could not run is said, with
why: ``SKIP`` (none ran) or ``PART`` (some did not), and the CLI exits 5.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import trio

from rungd.core import expectations
from rungd.client import ClientError
from rungd.config import Config, load_config
from rungd.core.envelope import Envelope
from rungd.core.errors import ConfigError, PluginError
from rungd.redact import Redactor
from rungd.runner.program import credential_files_named
from rungd.authoring.standins import (
    ROLE_ENV,
    SHEBANG,
    CannotSynthesize,
    confirmation_text,
    sample_text,
    screen_frames,
    write_standin,
)
from rungd.service.inprocess import RunningDaemon, start_daemon, write_config

READ_FIXTURES = ("missing", "hang", "question", "flood", "secret", "empty")
WRITE_FIXTURES = ("missing", "hang_before", "hang_after", "question", "flood", "secret", "acts_dies", "noop",
                  "already")
EXPORT_FIXTURES = ("missing", "empty", "changed", "flood")
# A screen tool's: its expected screen never comes, an extra dialog comes after its first key,
# it dies after its first key, it floods its screen; and, for a write, what a write's get.
SCREEN_READ_FIXTURES = ("missing", "hang", "never", "dialog", "dies", "flood", "secret")
SCREEN_WRITE_FIXTURES = ("missing", "hang_before", "hang_after", "never", "dialog", "dies", "flood", "secret",
                         "acts_dies", "noop", "already")
# How long a checked copy's screen step waits: a screen that does not come, does not come.
SCREEN_STEP_S = 4.0
CHECK_DEADLINE_S = 2.0
SLOW_DEADLINE_S = 10.0
HANGS = ("hang", "hang_before", "hang_after")
CHECK_SECRET = "rungd_check_secret"
CHECK_SECRET_ENV = "RUNGD_CHECK_SECRET"
ENVELOPE_CAP = 4096
# Parsers for which an empty output cannot be a real answer: "no matches" must come from
# the program saying so, so an empty stdout is SURFACE_CHANGED, never an empty `ok`.
STRUCTURED = ("regex", "json", "key_value", "columns")
T = TypeVar("T")


class CheckError(Exception):
    """What was asked cannot be checked as written (a file that does not load, no tools)."""


@dataclasses.dataclass
class FixtureResult:
    """One fixture, run twice: the codes each run gave and what was wrong with them."""

    fixture: str
    runs: list[str] = dataclasses.field(default_factory=list)  # "status outcome effect code"
    problems: list[str] = dataclasses.field(default_factory=list)
    # What the tool's author should know and the contract does not rule out.
    notes: list[str] = dataclasses.field(default_factory=list)
    # Why the fixture never got where it aims (a Python write's reads before its act ended
    # the call): its runs are judged by what every result must hold, not by the fixture.
    unreached: str | None = None

    @property
    def stable(self) -> bool:
        return len(set(self.runs)) == 1


@dataclasses.dataclass
class Receipt:
    """The receipt of one tool: counters in the seed's shape, and every problem found."""

    tool: str
    source: str
    fixtures: list[FixtureResult] = dataclasses.field(default_factory=list)
    secret_hits: list[str] = dataclasses.field(default_factory=list)
    unknown_write_retries: int = 0
    verified_from_skipped: bool = False
    skipped: str | None = None
    # Fixtures a tool of its kind is never given (a Python tool's empty or already), with why:
    # said on the receipt, not counted against it.
    outside: list[str] = dataclasses.field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        found = [f"{f.fixture}: {p}" for f in self.fixtures for p in f.problems]
        found += [f"{f.fixture}: codes differ between two runs: {' | '.join(f.runs)}"
                  for f in self.fixtures if not f.stable]
        found += [f"seeded secret found in {where}" for where in self.secret_hits]
        if self.unknown_write_retries:
            found.append(f"{self.unknown_write_retries} repeat(s) with the same request_id ran the program again")
        if self.verified_from_skipped:
            found.append("'changed' reported without a read-back showing the change")
        return found

    @property
    def notes(self) -> list[str]:
        return list(dict.fromkeys(f"{f.fixture}: {n}" for f in self.fixtures for n in f.notes))

    @property
    def passed(self) -> bool:
        return self.skipped is None and not self.problems

    @property
    def unchecked(self) -> list[str]:
        """What the check could not show of this tool, one line each: the fixtures that never
        reached what they aim at."""
        return [f"{f.fixture}: {f.unreached}" for f in self.fixtures if f.unreached]

    @property
    def verdict(self) -> str:
        """FAIL (a problem found), SKIP (nothing run), PART (no problem in what ran, but not
        every fixture got where it aims) or PASS."""
        if self.skipped is not None:
            return "SKIP"
        if self.problems:
            return "FAIL"
        return "PART" if self.unchecked else "PASS"

    def line(self) -> str:
        """The acceptance line: ``PASS tool  fixtures=N stableCodes=N secretHits=0 ...``."""
        if self.skipped is not None:
            return f"SKIP {self.tool}  {self.skipped}"
        reached = [f for f in self.fixtures if not f.unreached]
        stable = sum(1 for f in reached if f.stable)
        unchecked = [f.fixture for f in self.fixtures if f.unreached]
        return (f"{self.verdict} {self.tool}  fixtures={len(reached)} "
                f"stableCodes={stable} secretHits={len(self.secret_hits)} "
                f"unknownWriteRetries={self.unknown_write_retries} "
                f"verifiedFromSkipped={str(self.verified_from_skipped).lower()}"
                + (f" notChecked={','.join(unchecked)}" if unchecked else ""))

    def as_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "source": self.source, "verdict": self.verdict, "passed": self.passed,
                "skipped": self.skipped, "line": self.line(), "problems": self.problems, "notes": self.notes,
                "unchecked": self.unchecked, "outside": self.outside,
                "fixtures": [{"fixture": f.fixture, "runs": f.runs, "stable": f.stable, "problems": f.problems,
                              "unreached": f.unreached}
                             for f in self.fixtures]}


def run_check(paths: Iterable[Path], tools: set[str] | None = None) -> list[Receipt]:
    """Check every tool (or only ``tools``) of each tool file; blocking, for the CLI.

    Raises:
        CheckError: a file cannot be read, has none of the tools asked for, or its checked
            copy does not load (the first such, out of the nurseries' exception groups).
    """
    return blocking(check_files, list(paths), tools)


def blocking(run: Callable[..., Awaitable[T]], *args: Any, error: type[Exception] = CheckError) -> T:
    """Run an async check (or dry run) to its end, for the CLI.

    Raises:
        error: the first one, out of the nurseries' exception groups.
    """
    try:
        return trio.run(run, *args)
    except BaseExceptionGroup as group:
        matched, _ = group.split(error)
        if matched is None:
            raise
        while isinstance(matched, BaseExceptionGroup):
            matched = matched.exceptions[0]
        raise matched from None


async def check_files(paths: list[Path], tools: set[str] | None = None) -> list[Receipt]:
    """The async form of ``run_check``: one throw-away daemon per file, torn down after it.

    The files are checked side by side (most of a check is waiting out hangs); the receipts
    come back in the order of ``paths``.
    """
    found: dict[int, list[Receipt]] = {}

    async def one(index: int, path: Path) -> None:
        found[index] = await check_tool_file(path, tools)

    async with trio.open_nursery() as nursery:
        for index, path in enumerate(paths):
            nursery.start_soon(one, index, path)
    return [receipt for index in sorted(found) for receipt in found[index]]


async def check_tool_file(path: Path, tools: set[str] | None = None) -> list[Receipt]:
    """Run every adverse fixture against the tools of one tool file.

    Two throw-away daemons run side by side: one whose copy has deadlines cut to
    ``CHECK_DEADLINE_S`` for the fixtures that hang, one with the file's own deadlines (at most
    ``SLOW_DEADLINE_S``) for the rest, so a read-before, a confirmation and a read-back fit.

    Args:
        path: the tool file; it is read, never changed.
        tools: only these tool names (default: all of the file's tools).

    Returns:
        One receipt per tool, in file order.

    Raises:
        CheckError: the file is not TOML, holds none of ``tools``, or its copy does not
            load; the message has a hint.

    Cancellation: the throw-away daemons are stopped and their folders removed either way.
    """
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CheckError(f"{path}: cannot read the tool file: {exc}; "
                         "hint: run `rungd check-config` on a config that loads it") from None
    names = [n for n in raw.get("tools", {}) if tools is None or n in tools]
    if not names:
        raise CheckError(f"{path}: none of the tools asked for is in this file; hint: `rungctl tools` lists them")
    parts: dict[bool, list[Receipt]] = {}

    async def group(hangs: bool) -> None:
        parts[hangs] = await _check_group(path, raw, names, hangs)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(group, True)
        nursery.start_soon(group, False)
    return merged(parts[True], parts[False])


def merged(hangs: list[Receipt], others: list[Receipt]) -> list[Receipt]:
    """One receipt per tool from the two daemons' (the fixtures that hang, and the rest)."""
    order: dict[str, int] = {}
    for fixture in (*WRITE_FIXTURES, *READ_FIXTURES, *EXPORT_FIXTURES, *SCREEN_WRITE_FIXTURES,
                    *SCREEN_READ_FIXTURES):
        order.setdefault(fixture, len(order))
    receipts = []
    for fast, slow in zip(hangs, others, strict=True):
        slow.fixtures = sorted(fast.fixtures + slow.fixtures, key=lambda f: order[f.fixture])
        slow.secret_hits += fast.secret_hits
        slow.unknown_write_retries += fast.unknown_write_retries
        slow.verified_from_skipped |= fast.verified_from_skipped
        slow.skipped = slow.skipped or fast.skipped
        slow.outside = list(dict.fromkeys(fast.outside + slow.outside))
        receipts.append(slow)
    return receipts


async def _check_group(path: Path, raw: dict[str, Any], names: list[str], hangs: bool) -> list[Receipt]:
    """The fixtures that hang (``hangs``) or all the others, in one throw-away daemon."""
    # A short path: the socket's path must fit in 107 bytes (sun_path).
    folder = Path(tempfile.mkdtemp(prefix="rungd-"))
    what = f"{path}: the checked copy"
    try:
        plan = _Plan(path, raw, folder, hangs)
        try:
            config = load_config(plan.write_config())
        except (ConfigError, TypeError, ValueError) as exc:
            raise CheckError(f"{what} does not load: {exc}; "
                             "hint: `rungd check-config` shows the same problem on the real file") from None
        async with throwaway_daemon(config, what) as (running, logs):
            return [await plan.check_tool(running, name, logs) for name in names]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def throwaway_daemon(config: Config, what: str, *, stand_in: Any = None, error: type[Exception] = CheckError
                           ) -> AsyncIterator[tuple[RunningDaemon, LogCapture]]:
    """A check's (or a dry run's) daemon for ``config`` (``what`` names it in errors), serving
    while the body runs, and every line it logs meanwhile: kept off the terminal, to look for
    secrets in.

    Raises:
        error: it does not load, cannot start, or stopped answering; with a hint.
    """
    logs = LogCapture()
    logging.getLogger().addHandler(logs)
    try:
        async with trio.open_nursery() as nursery:
            try:
                running = await start_daemon(nursery, config, stand_in=stand_in)
            except (ConfigError, PluginError) as exc:
                raise error(f"{what} does not load: {exc}; "
                            "hint: `rungd check-config` shows the same problem on the real config") from None
            except OSError as exc:  # its socket's path too long under $TMPDIR, a full disk...
                raise error(f"{what}: the throw-away daemon cannot start: {exc}; hint: point TMPDIR at a "
                            "short, writable folder (a socket's path must fit in 107 bytes)") from None
            try:
                yield running, logs
            except ClientError as exc:
                raise error(f"{what}: the throw-away daemon stopped answering: {exc}; "
                            "hint: rerun with RUNGD_DEBUG=1") from None
            finally:
                running.daemon.stop()
    finally:
        logging.getLogger().removeHandler(logs)


class LogCapture(logging.Handler):
    """Every log line the in-process daemon writes while a check runs, to look for secrets."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.crashed: set[str] = set()  # calls whose handler raised what is not a RungdError

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "crashed", False):
            self.crashed.add(str(getattr(record, "call_id", "")))
        try:
            self.lines.append(record.getMessage())
        except Exception:  # a malformed record must not stop the check; it has nothing to leak
            self.lines.append(str(record.msg))


class _Plan:
    """The throw-away folder for one tool file: its copy, stand-ins, credentials and config."""

    def __init__(self, path: Path, raw: dict[str, Any], folder: Path, hangs: bool) -> None:
        self.path = path
        self.hangs = hangs  # this daemon runs only the fixtures that hang, with short deadlines
        self.raw = raw
        self.folder = folder
        self.program = folder / "program"  # a symlink: pointed at each fixture's stand-in in turn
        self.specs: dict[str, dict[str, Any]] = raw.get("tools", {})
        self.secrets = self._seed_secrets()
        self.seen_hits: set[str] = set()
        (folder / "standins").mkdir()
        healthy = folder / "standins" / "healthy"
        healthy.write_text(SHEBANG + "print('ok')\n", encoding="utf-8")
        healthy.chmod(0o755)
        self.program.symlink_to(healthy)

    # --- the copy --------------------------------------------------------------------------

    def _seed_secrets(self) -> dict[str, str]:
        """A random value for every credential name the file declares, and the check's own."""
        names = {CHECK_SECRET, *(name for program in self._programs(self.raw)
                                 for name in program.get("credentials", {}).values())}
        for spec in self.specs.values():
            names |= set(spec.get("credentials", {}).values()) | set(spec.get("credential_files", {}).values())
            names |= {p["credential"] for key in ("credential_prompt", "askpass") for p in spec.get(key, [])}
            names |= {name for word in spec.get("argv", []) if isinstance(word, str)
                      for name in credential_files_named(word)}
        return {name: "rungdck" + secrets.token_hex(16) for name in sorted(names)}

    @staticmethod
    def _programs(raw: dict) -> list[dict]:
        """The file's program tables: ``[program]`` and every ``[programs.NAME]``."""
        return [*([raw["program"]] if "program" in raw else []), *raw.get("programs", {}).values()]

    def write_config(self) -> Path:
        """Write the copy, the credentials file (0600) and the config; return the config."""
        tools_dir = self.folder / "tools"
        tools_dir.mkdir()
        copy = json.loads(json.dumps(self.raw))  # a deep copy of plain TOML values
        for program in self._programs(copy):  # every program of the file runs the stand-in
            program["command"] = str(self.program)
            program.pop("user", None)  # the stand-in runs as the daemon's user
        for name, spec in copy["tools"].items():
            spec.pop("gate", None)
            if "export" in spec:
                export = spec["export"]
                export["folder"] = str(self._export_folder(name))
                export["stable_s"] = 0
                continue
            spec["env"] = {**spec.get("env", {}), ROLE_ENV: name}
            spec["credentials"] = {**spec.get("credentials", {}), CHECK_SECRET_ENV: CHECK_SECRET}
            spec["deadline_s"] = min(float(spec.get("deadline_s", 30)),
                                     CHECK_DEADLINE_S if self.hangs else SLOW_DEADLINE_S)
            if "verify" in spec:
                spec["verify"]["wait_s"] = 0
            for step in spec.get("screen", {}).get("steps", []):
                step["timeout_s"] = min(float(step.get("timeout_s", 5)), SCREEN_STEP_S)
        (tools_dir / self.path.name).write_text(_toml(copy), encoding="utf-8")
        creds = self.folder / "credentials.toml"
        fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in self.secrets.items()))
        body = (f"[plugins]\ntool_dirs = [{json.dumps(str(tools_dir))}]\n\n"
                f"[credentials]\nfile = {json.dumps(str(creds))}\n\n"
                "[gates]\nread = \"none\"\nreversible = \"none\"\nvisible = \"none\"\nirreversible = \"none\"\n")
        return write_config(self.folder, body, demo_plugins=False)

    def _export_folder(self, tool: str) -> Path:
        folder = self.folder / "exports" / tool
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    # --- one tool --------------------------------------------------------------------------

    async def check_tool(self, running: RunningDaemon, name: str, logs: LogCapture) -> Receipt:
        spec = self.specs[name]
        receipt = Receipt(name, str(self.path))
        if "import" in spec:
            receipt.skipped = "import tools are not checked yet: their program is a watched folder"
            return receipt
        inputs = {k: v["example"] for k, v in spec.get("inputs", {}).items() if v.get("required", True)}
        write = spec.get("side_effect", "read") != "read"
        envelopes: list[Envelope] = []
        if "export" in spec:
            for fixture in EXPORT_FIXTURES if not self.hangs else ():
                receipt.fixtures.append(await self._export_fixture(running, name, spec, fixture, inputs, envelopes))
        else:
            try:
                script = self._script(name, spec, inputs)
            except CannotSynthesize as exc:
                receipt.skipped = f"no stand-in output fits its parser: {exc}"
                return receipt
            screen = "screen" in spec
            for fixture in ((SCREEN_WRITE_FIXTURES if write else SCREEN_READ_FIXTURES) if screen
                            else WRITE_FIXTURES if write else READ_FIXTURES):
                if (fixture in HANGS) != self.hangs:
                    continue
                result = await self._fixture(running, name, spec, fixture, inputs, script, receipt, envelopes)
                receipt.fixtures.append(result)
        receipt.secret_hits = self._secret_hits(envelopes, logs)
        return receipt

    def _script(self, name: str, spec: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
        """What the stand-ins print for each role: the tool itself and its read-back."""
        roles: dict[str, dict[str, Any]] = {}
        confirm = spec.get("confirm", [])
        roles[name] = {"ok": sample_text(spec.get("parse", {}), {}),
                       "confirm": confirmation_text(confirm[0]["pattern"]) if confirm else None}
        if "screen" in spec:
            roles[name]["screen"] = {"frames": screen_frames(_filled(spec["screen"], inputs), {}),
                                     "end": spec["screen"].get("end", "exit")}
        verify = spec.get("verify")
        if verify is not None:
            target = self.specs[verify["tool"]]
            expect = {k: _substitute(v, inputs) for k, v in verify.get("expect", {}).items()}
            pairs = _shown_before(verify["tool"], target.get("parse", {}), expect)
            after = sample_text(target.get("parse", {}), {k: pair[1] for k, pair in pairs.items()})
            before = sample_text(target.get("parse", {}), {k: pair[0] for k, pair in pairs.items()})
            roles[verify["tool"]] = {"before": before, "after": after}
            if "screen" in target:  # a screen read: the fields drawn where its steps read them
                read_inputs = {k: _substitute(v, inputs) for k, v in verify.get("inputs", {}).items()}
                screen = _filled(target["screen"], read_inputs)
                roles[verify["tool"]]["screen"] = {
                    "before": screen_frames(screen, {k: pair[0] for k, pair in pairs.items()}),
                    "after": screen_frames(screen, {k: pair[1] for k, pair in pairs.items()}),
                    "end": target["screen"].get("end", "exit")}
        return {"fixture": "", "target": name, "roles": roles,
                "secret_env": [CHECK_SECRET_ENV, *spec.get("credentials", {}),
                               *(var for program in self._programs(self.raw)
                                 for var in program.get("credentials", {}))],
                "secret_files": list(spec.get("credential_files", {}))}

    async def _fixture(self, running: RunningDaemon, name: str, spec: dict[str, Any], fixture: str,
                       inputs: dict[str, Any], script: dict[str, Any], receipt: Receipt,
                       envelopes: list[Envelope]) -> FixtureResult:
        folder = self.folder / "standins" / name
        folder.mkdir(exist_ok=True)
        if fixture == "missing":
            standin = folder / "missing"  # never written: the program is gone since start-up
            standin.unlink(missing_ok=True)
        else:
            standin = write_standin(folder, fixture, {**script, "fixture": fixture})
        self._point_at(standin)
        result = FixtureResult(fixture)
        write = spec.get("side_effect", "read") != "read"
        for attempt in (1, 2):
            (folder / "acted").unlink(missing_ok=True)
            request_id = f"check-{fixture}-{attempt}-{secrets.token_hex(4)}" if write else None
            env = await running.call(name, inputs, request_id=request_id, wait_s=SLOW_DEADLINE_S * 3 + 10)
            envelopes.append(env)
            acted = (folder / "acted").exists()
            result.runs.append(codes(env))
            result.problems += _judge(fixture, spec, env, acted, write)
            if fixture == "already" and env.status == "ok" and env.outcome == "done":
                result.notes.append(
                    f"a program that did nothing, where the state it aims at already held, came back "
                    f"ok {env.effect}: this tool cannot tell a refusal from a success; a read-back that "
                    "must change (expect = { FIELD = { differs_from_before = true } }, or a counter "
                    "with before_plus) or a read that shows the act itself would")
            if env.effect == "changed" and (not env.verified_by or not acted):
                receipt.verified_from_skipped = True
            if write and attempt == 1 and env.outcome != "not_started" and env.status != "pending":
                before = _runs(folder, name)
                again = await running.call(name, inputs, request_id=request_id, wait_s=SLOW_DEADLINE_S * 3 + 10)
                envelopes.append(again)
                if _runs(folder, name) > before:
                    receipt.unknown_write_retries += 1
        result.problems = sorted(set(result.problems))
        return result

    def _point_at(self, standin: Path) -> None:
        # Replaced atomically, so the daemon never sees the program half-swapped.
        staged = self.folder / "program.next"
        staged.unlink(missing_ok=True)
        staged.symlink_to(standin)
        os.replace(staged, self.program)

    async def _export_fixture(self, running: RunningDaemon, name: str, spec: dict[str, Any], fixture: str,
                              inputs: dict[str, Any], envelopes: list[Envelope]) -> FixtureResult:
        export = spec["export"]
        folder = self._export_folder(name)
        for old in folder.iterdir():
            old.unlink()
        if fixture != "missing":
            _write_export(folder, export, fixture)
        result = FixtureResult(fixture)
        for _attempt in (1, 2):
            env = await running.call(name, inputs, wait_s=30)
            envelopes.append(env)
            result.runs.append(codes(env))
            result.problems += _judge_export(fixture, env)
        result.problems = sorted(set(result.problems))
        return result

    def _secret_hits(self, envelopes: list[Envelope], logs: LogCapture) -> list[str]:
        return secret_hits(self.secrets.values(), self.folder, envelopes, logs, self.seen_hits)


def secret_hits(values: Iterable[str], folder: Path, envelopes: list[Envelope], logs: LogCapture,
                seen: set[str]) -> list[str]:
    """Every place (not in ``seen``, which grows) holding a seeded secret: an envelope, the
    daemon's log, a file under ``folder`` but its credentials file. In any encoding the
    daemon redacts (base64 of ``user:secret``, hex...): what it finds is what its redaction
    would have had to take out."""
    redactor = Redactor(list(values))

    def holds_one(data: bytes) -> bool:
        return redactor.bytes(data) != data

    hits = []
    for env in envelopes:
        if holds_one(msgspec.json.encode(env)):
            hits.append(f"the envelope of call {env.call_id}")
    if any(holds_one(line.encode()) for line in logs.lines):
        hits.append("the daemon's log")
    skip = {folder / "credentials.toml"}
    for path in sorted(folder.rglob("*")):
        if path in skip or path.is_symlink() or not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if holds_one(data):
            hits.append(str(path.relative_to(folder)))
    fresh = [h for h in hits if h not in seen]
    seen |= set(hits)
    return fresh


def codes(env: Envelope) -> str:
    code = env.error.code if env.error is not None else "-"
    return f"{env.status} {env.outcome} {env.effect} {code}"


def _runs(folder: Path, role: str) -> int:
    try:
        lines = (folder / "runs.log").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    return sum(1 for line in lines if line.split(" ")[-1] == role)


def judged_always(env: Envelope, cap_bytes: int, acted: bool) -> list[str]:
    """What no result may be, whatever the fixture: over its cap, an error without a hint
    or next action, still pending, or ``not_started`` after the program acted."""
    problems = []
    code = env.error.code if env.error is not None else None
    size = len(msgspec.json.encode(env))
    if size > max(cap_bytes, ENVELOPE_CAP):
        problems.append(f"the envelope is {size} bytes, over its cap")
    if env.status == "error" and env.error is not None and not (env.error.hint and env.next_action):
        problems.append(f"{code} comes without a hint or next_action")
    if env.status == "pending":
        problems.append("still pending after the deadline and its settle read")
    if acted and env.outcome == "not_started":
        problems.append(f"{code or env.status}: outcome not_started, but the program had acted")
    return problems


def _judge(fixture: str, spec: dict[str, Any], env: Envelope, acted: bool, write: bool) -> list[str]:
    """What the contract rules out for this fixture's result (empty when it is fine)."""
    code = env.error.code if env.error is not None else None
    problems = judged_always(env, int(spec.get("cap_bytes", ENVELOPE_CAP)), acted)
    if "screen" in spec:
        return problems + _judge_screen(fixture, spec, env, code, acted)
    expected = {
        "hang": "TIMEOUT", "hang_before": "TIMEOUT", "hang_after": "TIMEOUT",
        "question": "PROMPT_UNEXPECTED", "noop": "UNEXPECTED_STATE",
    }.get(fixture)
    if fixture == "question" and spec.get("stdin_input"):
        # Its stdin carries the declared input, then ends: a question reads that, never
        # waits, so no PROMPT_UNEXPECTED can come (what it made of it, the result says).
        expected = None
    if expected is not None and code != expected:
        problems.append(f"expected {expected}, got {code or env.status}")
    # The secret stand-in exits 1: an error, unless the tool counts 1 as an answer (ok_exit = [0, 1],
    # the guide's stat read); its check is that the secret shows nowhere, whatever the status.
    fails = fixture == "missing" or (fixture == "secret" and 1 not in spec.get("ok_exit", [0]))
    if fails and env.status != "error":
        problems.append(f"expected an error, got {env.status}")
    if fixture == "acts_dies" and env.status == "ok" and env.effect != "changed":
        problems.append(f"the program acted and the read-back shows it, yet effect is {env.effect}")
    if fixture == "empty" and env.status == "ok" and spec.get("parse", {}).get("kind", "none") in STRUCTURED:
        problems.append("an empty output from a program came back as an empty ok (no matches is not 'cannot answer')")
    return problems


# What a screen tool's fixture may end in: a screen that did not come (SURFACE_CHANGED), or
# the deadline first (TIMEOUT: a step's wait may outlast the checked copy's deadline).
_SCREEN_CODES = {
    "hang": {"TIMEOUT", "SURFACE_CHANGED"}, "hang_before": {"TIMEOUT", "SURFACE_CHANGED"},
    "hang_after": {"TIMEOUT", "SURFACE_CHANGED"}, "never": {"SURFACE_CHANGED", "TIMEOUT"},
    "dialog": {"SURFACE_CHANGED", "TIMEOUT"}, "dies": {"FAILED", "SURFACE_CHANGED"},
    # A flood is stopped at its cap, or shows nothing a step waits for before that.
    "flood": {"OUTPUT_TOO_LARGE", "SURFACE_CHANGED", "TIMEOUT"}, "secret": {"SURFACE_CHANGED", "TIMEOUT"},
    "missing": {"FAILED"},
    "noop": {"UNEXPECTED_STATE"},
}


def _judge_screen(fixture: str, spec: dict[str, Any], env: Envelope, code: str | None, acted: bool) -> list[str]:
    """A screen tool's fixture: an error of the kind the screen calls for, and never a change
    the stand-in did not make."""
    problems = []
    waits = sum(1 for step in spec["screen"].get("steps", []) if step.get("wait"))
    expected = _SCREEN_CODES.get(fixture)
    # An extra dialog after a one-wait tool's last key comes after everything it waited for.
    if expected is not None and not (fixture == "dialog" and waits < 2 and env.status == "ok") and code not in expected:
        problems.append(f"expected {' or '.join(sorted(expected))}, got {code or env.status}")
    if env.effect == "changed" and not acted:
        problems.append("effect changed, but the stand-in changed nothing")
    if fixture == "acts_dies" and env.status == "ok" and env.effect != "changed":
        problems.append(f"the program acted and the read-back shows it, yet effect is {env.effect}")
    return problems


def _judge_export(fixture: str, env: Envelope) -> list[str]:
    code = env.error.code if env.error is not None else None
    if fixture == "missing" and env.status != "error":
        return ["no export at all came back as ok: an export that cannot answer must be an error"]
    if fixture == "empty" and (env.status != "ok" or (env.fields or {}).get("matched") != 0):
        return [f"a fresh export with no rows must be ok with matched=0, got {code or env.fields}"]
    if fixture == "changed" and code != "SURFACE_CHANGED":
        return [f"expected SURFACE_CHANGED for a changed header, got {code or env.status}"]
    if fixture == "flood":
        if env.status != "ok" or not env.truncated:
            return [f"expected ok and truncated for a large export, got {code or env.status}"]
        if len(msgspec.json.encode(env)) > ENVELOPE_CAP:
            return ["the envelope is over its cap"]
    return []


def _write_export(folder: Path, export: dict[str, Any], fixture: str) -> None:
    """An export file for the fixture, in the tool's format and encoding, already complete."""
    columns: dict[str, str] = export["columns"]
    names = list(columns)
    if fixture == "changed":
        names = [*names[:-1], names[-1] + " (renamed)"]
    samples = {"string": "A-1", "integer": "7", "number": "1.5", "decimal": "1.50", "boolean": "true",
               "date": "2024-01-02", "datetime": "2024-01-02T03:04:05"}
    rows = 0 if fixture == "empty" else 5000 if fixture == "flood" else 3
    name = export["pattern"].replace("*", "20240102").replace("?", "x")
    fmt = export.get("format", "csv")
    delimiter = "\t" if fmt == "tsv" else export.get("delimiter", ",")
    if fmt == "jsonl":
        text = "".join(json.dumps({n: samples[columns.get(n, "string")] for n in names}) + "\n" for _ in range(rows))
    else:
        lines = [delimiter.join(names)]
        lines += [delimiter.join(samples[columns.get(n, "string")] for n in names) for _ in range(rows)]
        text = "\r\n".join(lines) + "\r\n"
    path = folder / name
    path.write_bytes(text.encode(export.get("encoding", "utf-8")))
    past = time.time() - 10  # older than any stable_s: the writer is done with it
    os.utime(path, (past, past))


def _filled(screen: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A screen table with each wait's text filled in from the call's inputs, as the daemon
    fills it (a literal brace is doubled)."""
    steps = []
    for step in screen.get("steps", []):
        wait = step.get("wait")
        if wait is not None and "text" in wait:
            step = {**step, "wait": {**wait, "text": str(_substitute(wait["text"], values))}}
        steps.append(step)
    return {**screen, "steps": steps}


def _substitute(template: Any, values: dict[str, Any]) -> Any:
    if isinstance(template, str) and template.startswith("{") and template.endswith("}") \
            and template[1:-1] in values:
        return values[template[1:-1]]
    return template.format_map(values) if isinstance(template, str) else template


def _other(value: Any) -> Any:
    """A value of the same kind that differs: the state before the change."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    return "x" if str(value) != "x" else "y"


# Values tried, after _other's, for a field's state before a change the parser must read.
_BEFORE_VALUES = (0, 1, "0", "1", "x", "no", "yes", "false", "true", "")


def _shown_before(read: str, parse: dict[str, Any], expect: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Per field of a read-back, its value before the change and after it, each one the
    read's parser can read: a field that must read ``1`` (a ``[01]`` pattern) is shown as
    ``0`` before, not as ``2``.

    Raises:
        CannotSynthesize: no text the parser reads shows a field in another state than the
            one the write aims at; the message names the field and says why in plain words.
    """
    pairs = {k: _before_and_after(v) for k, v in expect.items()}
    for field, (before, after) in list(pairs.items()):
        if expectations.test_of(expect[field]) not in (None, ("equals", after)):
            continue  # a relative or open test: its pair is made for it
        for value in (before, *_BEFORE_VALUES):
            if str(value) == str(after):
                continue
            try:
                sample_text(parse, {k: pair[0] for k, pair in pairs.items() if k != field} | {field: value})
            except CannotSynthesize:
                continue
            pairs[field] = (value, after)
            break
        else:
            raise CannotSynthesize(
                f"its read-back {read} cannot be shown before the change: its parser reads {field} as "
                f"{after!r} and no other value the check could make, so the stand-in cannot show the state "
                "the write changes")
    return pairs


def _before_and_after(expected: Any) -> tuple[Any, Any]:
    """A field's value before a change and after it, such that ``expected`` (a literal or a
    test of ``rungd.core.expectations``) holds after and not before; a relative test ("greater
    than before") compares the two.

    Raises:
        CannotSynthesize: a test no stand-in value is made for (``matches``: its pattern).
    """
    test = expectations.test_of(expected)
    if test is None:
        return _other(expected), expected
    name, arg = test
    pairs: dict[str, tuple[Any, Any]] = {
        "equals": (_other(arg), arg),
        "present": ("", "sample") if arg else ("sample", ""),
        "absent": ("sample", "") if arg else ("", "sample"),
        "contains": ("other", arg),
        "lacks": (arg, "other"),
        "before_plus": (1, 1 + arg) if isinstance(arg, int) else (1, 2),
        "greater_than_before": (1, 2),
        "less_than_before": (2, 1),
        "differs_from_before": ("a", "b"),
    }
    if name not in pairs:
        raise CannotSynthesize(f"a read-back that expects {name} = {arg!r}: no stand-in value is made for it")
    return pairs[name]


def _toml(data: dict[str, Any]) -> str:
    """Write a tool file back as TOML: tables as headers, every value inline.

    JSON's string, number, boolean and array syntax is valid TOML for the values tool files
    hold, so each value is written with ``json.dumps``; an inline table spells ``k = v``.
    """
    out = []
    for table, body in data.items():
        if table == "tools":
            for name, spec in body.items():
                out.append(f"[tools.{json.dumps(name)}]")
                out += [f"{json.dumps(k)} = {_inline(v)}" for k, v in spec.items()]
        else:
            out.append(f"[{json.dumps(table)}]")
            out += [f"{json.dumps(k)} = {_inline(v)}" for k, v in body.items()]
        out.append("")
    return "\n".join(out)


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_inline(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    if value is None:
        raise CheckError("a tool file value is null, which TOML cannot hold")
    return json.dumps(value)
