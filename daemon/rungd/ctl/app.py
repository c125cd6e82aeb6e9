"""The parser built from the command table, and ``main``: the one place where an
exception becomes a message and an exit status."""

from __future__ import annotations

import argparse
from pathlib import Path

from rungd.client import ClientError, ConnectFailed, RequestRejected
from rungd.ctl import check, commands, evaluate, evidence, health, ledger, probe  # noqa: F401  (importing them registers their commands)
from rungd.ctl.cli import fail, unexpected, version
from rungd.ctl.ledger import LedgerUnreadable
from rungd.ctl.registry import (
    COMMANDS,
    EXIT_CODES,
    EXIT_ERROR_RESULT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    USAGE_CODES,
    CommandFailed,
    Context,
    UsageError,
)
from rungd.core.errors import ConfigError, PluginError

PROG = "rungctl"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


def _options(suppress: bool) -> argparse.ArgumentParser:
    # The same options before and after the command word. After it they default to
    # SUPPRESS, or argparse would let the subcommand's default overwrite a value given
    # before it (`rungctl --socket S call ...`).
    extra = {"default": argparse.SUPPRESS} if suppress else {}
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help="machine-readable output", **extra)
    parent.add_argument("--socket", type=Path, help="daemon socket (default: --config's; else $RUNGD_SOCKET; else "
                        "$RUNGD_CONFIG's; else ./var/rungd.sock)", **extra)
    parent.add_argument("--config", type=Path, help="the daemon's config file (default: $RUNGD_CONFIG, else the "
                        "embedded default)", **extra)
    return parent


def build_parser() -> argparse.ArgumentParser:
    """``rungctl``'s parser: one subparser per registered command, each ending at its function."""
    common = _options(suppress=True)
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog=PROG, description="Talk to a running rungd, and read its ledger.",
                                     parents=[_options(suppress=False)], epilog=EXIT_CODES,
                                     formatter_class=formatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    words = parser.add_subparsers(dest="command_word", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for cmd in COMMANDS.values():
        group_word, _, word = cmd.name.rpartition(" ")
        into = words
        if group_word:
            if group_word not in groups:
                group = words.add_parser(group_word, help=f"{group_word} commands: "
                                         + ", ".join(c.name.split()[-1] for c in COMMANDS.values()
                                                     if c.name.startswith(group_word + " ")))
                groups[group_word] = group.add_subparsers(dest=f"{group_word}_word", required=True, metavar="COMMAND")
            into = groups[group_word]
        sub = into.add_parser(word, parents=[common], help=cmd.help, description=cmd.description,
                              epilog=EXIT_CODES, formatter_class=formatter)
        for declared in cmd.args:
            sub.add_argument(*declared.flags, **declared.options)
        sub.set_defaults(run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``rungctl`` command; returns its exit status (see ``EXIT_CODES``).

    Process-wide settings belong to the console script (``rungd.ctl.main``), not here: a
    program that calls this in-process keeps its own signal dispositions.
    """
    args = build_parser().parse_args(argv)  # a usage error exits 2 here, with the usage
    ctx = Context(args)
    try:
        return args.run(ctx)
    except (UsageError, ConfigError, PluginError, LedgerUnreadable) as exc:
        fail(PROG, str(exc))
        return EXIT_USAGE
    except CommandFailed as exc:
        fail(PROG, str(exc))
        return EXIT_ERROR_RESULT
    except RequestRejected as exc:
        # The daemon answered: it was reached. A refusal of what was asked is a usage error;
        # anything else (a call no longer held, no longer known) is a failed request.
        fail(PROG, str(exc))
        return EXIT_USAGE if exc.code in USAGE_CODES else EXIT_ERROR_RESULT
    except ConnectFailed as exc:
        fail(PROG, str(exc))
        return EXIT_UNREACHABLE
    except ClientError as exc:
        fail(PROG, f"{exc}; hint: check that rungd is still running (`systemctl status rungd`) and try again")
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # the last resort: one line, never a traceback unless asked
        unexpected(PROG, exc)
        return EXIT_ERROR_RESULT
    finally:
        ctx.close()
