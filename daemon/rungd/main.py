"""``rungd``: run the daemon, check a configuration, or show the demo.

    rungd serve [--config PATH]          serve until SIGTERM/SIGINT
    rungd check-config [--config PATH]   load config and plugins, list tools, exit
    rungd demo                           serve the embedded default and walk through it
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import trio

from rungd.ctl.cli import fail, read_config, unexpected, version
from rungd.service.daemon import Daemon, run_until_signalled
from rungd.core.errors import ConfigError, PluginError
from rungd.service.journal import make_handler
from rungd.service.preflight import check_paths
from rungd.runner import launch
from rungd.service.server import SocketInUse
from rungd_ledgers import LedgerCorrupt, LedgerUnavailable

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_RUNTIME = 1

EXIT_CODES = """\
exit status:
  0  ok (serve: stopped by SIGTERM or SIGINT)
  1  the daemon could not run or failed: the socket is in use, or a path of the
     config it cannot use (check-config checks server.socket's folder and state.dir
     for the user running it)
  2  the configuration or a plugin is not valid, or cannot be read

environment:
  RUNGD_CONFIG   config file to use when --config is not given
  RUNGD_SOCKET   socket path when --config is not given (it overrides the socket of
                 $RUNGD_CONFIG or of the embedded default; --config's own wins)
  RUNGD_DEBUG=1  print the traceback of an unexpected failure
"""


def setup_logging(verbose: bool, quiet: bool = False) -> None:
    """Log to the journal natively when stdout or stderr goes there, else plain lines on stdout.

    In the journal each event is one entry with its priority and its fields (CALL_ID, TOOL,
    ...), a traceback included; see ``rungd.service.journal``.
    """
    handler = make_handler()
    root = logging.getLogger("rungd")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rungd", description="Serve task-shaped tools around legacy programs.",
                                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"rungd {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (("serve", "run the daemon until SIGTERM or SIGINT"),
                       ("check-config", "validate the configuration and plugins, list the tools"),
                       ("demo", "serve the embedded default and walk through a few calls")):
        cmd = sub.add_parser(name, help=text, description=text, epilog=EXIT_CODES,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        cmd.add_argument("--config", type=Path,
                         help="TOML file (default: $RUNGD_CONFIG, else the embedded default)")
        cmd.add_argument("-v", "--verbose", action="store_true", help="log debug lines too")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``rungd`` command; returns its exit status (see ``EXIT_CODES``)."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130  # 128 + SIGINT, as a shell reports it
    except Exception as exc:  # the last resort: one line, the traceback only with RUNGD_DEBUG=1
        unexpected("rungd", exc)
        return EXIT_RUNTIME


def run(args: argparse.Namespace) -> int:
    if args.command != "check-config":
        # Before any thread: capabilities given to run tools as their users are the launcher's.
        launch.keep_ambient_for_launcher()
    # The demo prints a walkthrough; the daemon's own log would only interleave with it.
    setup_logging(args.verbose, quiet=args.command == "demo")
    try:
        config = read_config(args.config)
        daemon = Daemon(config)
    except (ConfigError, PluginError) as exc:
        fail("rungd", str(exc))
        return EXIT_CONFIG
    # The config loads; now whether this host lets serve use its paths, before serve makes
    # any folder. check-config only notes a folder systemd makes before the daemon starts.
    paths = check_paths(config)
    fatal = paths.problems if args.command == "check-config" else paths.problems + paths.notes
    if fatal:
        for problem in fatal:
            fail("rungd", problem)
        return EXIT_RUNTIME
    if args.command == "check-config":
        for note in paths.notes:
            fail("rungd", f"note: {note}")
        print(f"config ok: {config.source}")
        print(f"socket:    {config.server.socket}")
        print(f"state:     {config.state_dir}")
        for name, reg in sorted(daemon.tools.items()):
            print(f"  {name:32} {reg.tool.side_effect:12} plugin {reg.plugin}")
        # Left out by ownership (rungd.system.trust): the daemon serves the rest, so this is no
        # failure of the config (a reload still applies), but each is said, with its fix.
        for problem in daemon.hooks.refused:
            fail("rungd", f"refused: {problem}")
        if daemon.hooks.refused:
            print(f"refused:   {len(daemon.hooks.refused)} (not loaded; each named above with its fix)")
        return EXIT_OK
    try:
        try:
            if args.command == "demo":
                from rungd.ctl.demo import run_demo

                trio.run(run_demo, daemon)
            else:
                trio.run(run_until_signalled, daemon)
        except BaseExceptionGroup as group:
            # A start-up failure comes out of the daemon's nurseries wrapped in a group;
            # one reason is told as that reason.
            raise _sole(group) from None
    except SocketInUse as exc:
        fail("rungd", f"{exc}; hint: stop the other daemon or set server.socket")
        return EXIT_RUNTIME
    except ConfigError as exc:  # a file of the state folder serve refuses (rungd.service.sensitive's key)
        fail("rungd", str(exc))
        return EXIT_CONFIG
    except LedgerUnavailable as exc:
        fail("rungd", f"{exc}; hint: another rungd uses this state folder: stop it, or give this one its "
             "own state.dir")
        return EXIT_RUNTIME
    except LedgerCorrupt as exc:  # its records decide what a repeated request gets: none is guessed
        fail("rungd", f"the ledger cannot be read: {exc}; hint: rungd starts only on a ledger it can read "
             f"(its records decide what a repeated request gets): {daemon.config.state_dir / 'ledger'}")
        return EXIT_RUNTIME
    except OSError as exc:
        fail("rungd", f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}; hint: check that the "
             "paths in the config (server.socket, state.dir) exist and this user may write them")
        return EXIT_RUNTIME
    return EXIT_OK

def _sole(group: BaseExceptionGroup) -> BaseException:
    """The one exception inside nested single-member groups, or the group itself."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


if __name__ == "__main__":
    sys.exit(main())
