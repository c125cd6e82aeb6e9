"""``rungd``: run the daemon, check a configuration, or show the demo.

    rungd serve [--config PATH]          serve until SIGTERM/SIGINT
    rungd check-config [--config PATH]   load config and plugins, list tools, exit
    rungd demo                           serve the embedded default and walk through it
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import trio

from rungd.config import load_config
from rungd.daemon import Daemon, run_until_signalled
from rungd.errors import ConfigError, PluginError
from rungd.server import SocketInUse

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_RUNTIME = 1


class JournalFormatter(logging.Formatter):
    """One line per record, with ``call_id`` and ``tool`` as key=value pairs.

    Under systemd (``$JOURNAL_STREAM`` set) each line starts with the syslog priority in
    angle brackets, which journald turns into the entry's level.
    """

    PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

    def __init__(self, journald: bool) -> None:
        super().__init__()
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        line = record.getMessage()
        for key in ("call_id", "tool", "status", "code"):
            value = getattr(record, key, None)
            if value is not None:
                line += f" {key}={value}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if self.journald:
            return f"<{self.PRIORITY.get(record.levelno, 6)}>{line}"
        return f"{record.levelname.lower():7} {record.name}: {line}"


def setup_logging(verbose: bool, quiet: bool = False) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JournalFormatter(journald="JOURNAL_STREAM" in os.environ))
    root = logging.getLogger("rungd")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rungd", description="Serve task-shaped tools around legacy programs.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("serve", "run the daemon until SIGTERM or SIGINT"),
                       ("check-config", "validate the configuration and plugins, list the tools"),
                       ("demo", "serve the embedded default and walk through a few calls")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--config", type=Path, help="TOML file (default: the embedded default)")
        cmd.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    # The demo prints a walkthrough; the daemon's own log would only interleave with it.
    setup_logging(args.verbose, quiet=args.command == "demo")
    try:
        config = load_config(args.config)
        daemon = Daemon(config)
    except (ConfigError, PluginError) as exc:
        print(f"rungd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "check-config":
        print(f"config ok: {config.source}")
        print(f"socket:    {config.server.socket}")
        print(f"state:     {config.state_dir}")
        for name, reg in sorted(daemon.tools.items()):
            print(f"  {name:32} {reg.tool.side_effect:12} plugin {reg.plugin}")
        return EXIT_OK
    try:
        if args.command == "demo":
            from rungd.demo import run_demo

            trio.run(run_demo, daemon)
        else:
            trio.run(run_until_signalled, daemon)
    except SocketInUse as exc:
        print(f"rungd: {exc}; hint: stop the other daemon or set server.socket", file=sys.stderr)
        return EXIT_RUNTIME
    except OSError as exc:
        print(f"rungd: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
