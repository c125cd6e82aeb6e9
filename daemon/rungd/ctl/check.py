"""``rungctl check``: adverse-outcome receipts for tool files (``rungd.authoring.check``)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import trio

from rungd.authoring.check import CheckError, Receipt, blocking, check_files
from rungd.authoring.plugin_check import check_plugin_tools
from rungd.config import Config
from rungd.ctl.registry import EXIT_ERROR_RESULT, EXIT_INCOMPLETE, EXIT_OK, Context, UsageError, arg, command
from rungd.core.errors import ConfigError, PluginError
from rungd.service.plugins import Hooks, RegisteredTool


@command(
    "check",
    "run tools against adverse stand-ins for their program, in a throw-away daemon",
    arg("targets", nargs="*", metavar="TOOL|FILE",
        help="tool names (looked up in the config's tool files) or tool files; default: every tool file"),
    arg("--verbose", "-v", action="store_true", help="show each fixture's codes"),
)
def check(ctx: Context) -> int:
    """Run each tool's contract against adverse stand-ins for its program and print a receipt.

    Every fixture (the program missing, hanging before and after its commit point, asking a
    question nobody declared, flooding, printing a seeded secret, acting and then dying,
    exiting 0 having done nothing) runs twice in a throw-away daemon whose programs are
    stand-ins: the real program never runs. A tool file's copy names the stand-in as its
    command; a Python plugin's program is replaced where the plugin starts it. One line per tool:

        PASS apt_package_remove  fixtures=8 stableCodes=8 secretHits=0 unknownWriteRetries=0 verifiedFromSkipped=false

    Exit status 1 when a receipt fails: codes that differ between two runs of a fixture, a
    seeded secret found anywhere, a repeat with the same request_id that ran the program
    again, `changed` without a read-back, or a result the contract rules out. Exit status 5
    when none failed but a tool was skipped (SKIP) or checked in part (PART: a fixture not run,
    or not reaching what it aims at), each with the reason.
    """
    files, tools, plugin_tools = _targets(ctx)
    try:
        receipts = blocking(_check_all, files, tools, ctx.config, plugin_tools)
    except CheckError as exc:
        raise UsageError(str(exc)) from None
    if ctx.json:
        print(json.dumps([r.as_dict() for r in receipts], indent=2))
    else:
        for receipt in receipts:
            print(receipt.line())
            if ctx.args.verbose or not receipt.passed:
                for fixture in receipt.fixtures:
                    print(f"  {fixture.fixture:<12} {' | '.join(dict.fromkeys(fixture.runs))}")
            for problem in receipt.problems:
                print(f"  ! {problem}")
            for line in receipt.unchecked if receipt.skipped is None else ():
                print(f"  not checked: {line}")
            for line in receipt.outside if ctx.args.verbose and receipt.skipped is None else ():
                print(f"  outside the check: {line}")
            for note in receipt.notes:
                print(f"  note: {note}")
    verdicts = {r.verdict for r in receipts}
    if "FAIL" in verdicts:
        return EXIT_ERROR_RESULT
    return EXIT_INCOMPLETE if verdicts & {"SKIP", "PART"} else EXIT_OK


async def _check_all(files: list[Path], tools: set[str] | None, config: Config,
                     plugin_tools: list[RegisteredTool]) -> list[Receipt]:
    """The tool files' receipts, then the Python plugins' tools', checked side by side."""
    found: dict[str, list[Receipt]] = {"files": [], "plugins": []}

    async def files_part() -> None:
        found["files"] = await check_files(files, tools) if files else []

    async def plugins_part() -> None:
        found["plugins"] = await check_plugin_tools(config, plugin_tools) if plugin_tools else []

    async with trio.open_nursery() as nursery:
        nursery.start_soon(files_part)
        nursery.start_soon(plugins_part)
    return found["files"] + found["plugins"]


def _targets(ctx: Context) -> tuple[list[Path], set[str] | None, list[RegisteredTool]]:
    """The tool files to check, the tool names to keep (None: all), and the Python plugins'
    tools to check.

    Raises:
        UsageError: a name is neither a file nor a tool of the config.
    """
    config = ctx.config
    files = sorted(p for folder in config.plugins.tool_dirs if folder.is_dir() for p in folder.glob("*.toml"))
    in_files: dict[str, Path] = {}
    for path in files:
        try:
            in_files.update(dict.fromkeys(tomllib.loads(path.read_text(encoding="utf-8")).get("tools", {}), path))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"{path}: cannot read the tool file: {exc}; hint: rungd check-config names the problem")
    try:
        served = Hooks.load(config).collect_tools(config)
    except (PluginError, ConfigError) as exc:
        raise UsageError(f"the config's plugins do not load: {exc}") from None
    in_code = {name: reg for name, reg in sorted(served.items()) if name not in in_files}
    if not ctx.args.targets:
        return files, None, list(in_code.values())
    chosen: dict[Path, None] = {}
    names: set[str] = set()
    plugin_tools: dict[str, RegisteredTool] = {}
    for target in ctx.args.targets:
        path = Path(target)
        if target.endswith(".toml") or path.is_file():
            if not path.is_file():
                raise UsageError(f"{target}: no such tool file; hint: give a path to a *.toml tool file")
            chosen[path] = None
            names |= set(_tool_names(path))
        elif target in in_files:
            chosen[in_files[target]] = None
            names.add(target)
        elif target in in_code:
            plugin_tools[target] = in_code[target]
        else:
            raise UsageError(f"{target}: no such tool in this config; hint: `rungd check-config` lists "
                             "the tools it loads, or give a tool file's path")
    return list(chosen), names, list(plugin_tools.values())


def _tool_names(path: Path) -> list[str]:
    try:
        return list(tomllib.loads(path.read_text(encoding="utf-8")).get("tools", {}))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the tool file: {exc}; hint: rungd check-config names the problem") from None
