"""``rungctl check``: adverse-outcome receipts for tool files (``rungd.authoring.check``)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from rungd.authoring.check import CheckError, Receipt, run_check
from rungd.ctl.registry import EXIT_ERROR_RESULT, EXIT_OK, Context, UsageError, arg, command
from rungd.core.errors import ConfigError, PluginError
from rungd.service.plugins import Hooks


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
    exiting 0 having done nothing) runs twice in a throw-away daemon on a copy of the tool
    file whose program is a stand-in: the real program never runs. One line per tool:

        PASS apt_package_remove  fixtures=8 stableCodes=8 secretHits=0 unknownWriteRetries=0 verifiedFromSkipped=false

    Exit status 1 when a receipt fails: codes that differ between two runs of a fixture, a
    seeded secret found anywhere, a repeat with the same request_id that ran the program
    again, `changed` without a read-back, or a result the contract rules out. Tools of Python
    plugins are listed as skipped, with the reason.
    """
    files, tools, skipped = _targets(ctx)
    try:
        receipts = run_check(files, tools) if files else []
    except CheckError as exc:
        raise UsageError(str(exc)) from None
    receipts += [Receipt(name, "", skipped=why) for name, why in skipped]
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
            for note in receipt.notes:
                print(f"  note: {note}")
    return EXIT_OK if all(r.passed or r.skipped for r in receipts) else EXIT_ERROR_RESULT


def _targets(ctx: Context) -> tuple[list[Path], set[str] | None, list[tuple[str, str]]]:
    """The tool files to check, the tool names to keep (None: all), and tools skipped, why.

    Raises:
        UsageError: a name is neither a file nor a tool of the config's tool files.
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
    others = sorted(name for name in served if name not in in_files)
    if not ctx.args.targets:
        return files, None, [(name, _why(served[name].plugin)) for name in others]
    chosen: dict[Path, None] = {}
    names: set[str] = set()
    skipped = []
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
        elif target in served:
            skipped.append((target, _why(served[target].plugin)))
        else:
            raise UsageError(f"{target}: no such tool in this config; "
                             "hint: `rungctl tools` lists them, or give a tool file's path")
    return list(chosen), names, skipped


def _tool_names(path: Path) -> list[str]:
    try:
        return list(tomllib.loads(path.read_text(encoding="utf-8")).get("tools", {}))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the tool file: {exc}; hint: rungd check-config names the problem") from None


def _why(plugin: str) -> str:
    return (f"a tool of the Python plugin {plugin!r}: its program is chosen in Python, so no stand-in "
            "can replace it; check it with rungd.testing and a fake program (plugins/README.md)")
