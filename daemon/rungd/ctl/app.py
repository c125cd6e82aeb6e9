"""The parser built from the command table, and ``main``: the one place where an
exception becomes a message and an exit status."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
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
    RUN_ON_HOST,
    USAGE_CODES,
    CommandFailed,
    Context,
    UsageError,
)
from rungd.core.errors import ConfigError, PluginError
from rungd.ssh_host import SshHost, TunnelFailed, dies_with

PROG = "rungctl"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


def _options(suppress: bool) -> argparse.ArgumentParser:
    # The same options before and after the command word. After it they default to
    # SUPPRESS, or argparse would let the subcommand's default overwrite a value given
    # before it (`rungctl --socket S call ...`).
    extra = {"default": argparse.SUPPRESS} if suppress else {}
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help="machine-readable output", **extra)
    parent.add_argument("--socket", type=Path, help="daemon socket (default: --config's; else $RUNGD_HOST's; "
                        "else $RUNGD_SOCKET; else $RUNGD_CONFIG's; else ./var/rungd.sock)", **extra)
    parent.add_argument("--config", type=Path, help="the daemon's config file (default: $RUNGD_CONFIG, else the "
                        "embedded default); with --host, a file on the host", **extra)
    parent.add_argument("--host", metavar="ssh://[USER@]HOST[:PORT][/SOCKET]",
                        help="the rungd of another host, through your ssh (keys, agent, ~/.ssh/config); it sees "
                        "the ssh user as the caller. SOCKET defaults to /run/rungd/rungd.sock. tail, ledger verify, "
                        "health and status run that host's rungctl over ssh (default: $RUNGD_HOST, unless --socket "
                        "or --config is given)", **extra)
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
    words = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(words)  # a usage error exits 2 here, with the usage
    ctx = Context(args)
    try:
        if args.run in {COMMANDS[name].run for name in RUN_ON_HOST} and (host := ctx.host()) is not None:
            return run_on_host(host, words, config_given=bool(args.config))
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
    except (ConnectFailed, TunnelFailed) as exc:
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


def run_on_host(host: SshHost, words: list[str], *, config_given: bool) -> int:
    """Run a command that reads the daemon's files with the host's own rungctl, where the
    files are: ``ssh HOST rungctl [--socket SOCKET] WORDS`` (WORDS less ``--host``), its
    output and exit status relayed.

    Paths among WORDS (``--config``, ``--ledger``, ``PATH``, ``--anchors``) are the host's.
    The URL's socket goes along (so ``status`` asks the daemon the other commands reach),
    unless only ``--config`` names it.

    Raises:
        TunnelFailed: no ssh here, ssh failed (its status 255: rungctl never exits so), or
            the host's shell found no rungctl (127).
    """
    words = _without_host(words)
    if host.socket_given or not config_given:
        words = ["--socket", str(host.socket), *words]
    try:
        # stdout goes straight through (tail -f prints as it goes); stderr is held to tell
        # ssh's own failure from the remote rungctl's one-line error, which is relayed.
        done = subprocess.run(host.rungctl_argv(words), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              check=False, preexec_fn=dies_with(os.getpid()))
    except FileNotFoundError:
        raise host.ssh_missing() from None
    said = done.stderr.decode("utf-8", "replace")
    if done.returncode == 255:
        raise host.ssh_failed(said, done.returncode)
    if done.returncode == 127:
        raise host.rungctl_missing(said)
    for line in said.splitlines(keepends=True):  # its paths are the host's: say which host
        sys.stderr.write(f"{PROG}: {host.host}: {line.removeprefix(f'{PROG}: ')}" if line.startswith(f"{PROG}: ")
                         else line)
    return done.returncode


def _without_host(words: list[str]) -> list[str]:
    """``words`` less ``--host URL`` and ``--host=URL`` (or a prefix argparse took for it,
    ``--ho``); words after ``--`` are arguments, kept as they are."""
    kept: list[str] = []
    rest = iter(words)
    for word in rest:
        if word == "--":
            return [*kept, word, *rest]
        name, equals, _ = word.partition("=")
        if len(name) >= len("--ho") and "--host".startswith(name):
            if not equals:
                next(rest, None)
            continue
        kept.append(word)
    return kept
