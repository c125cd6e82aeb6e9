"""The command table: one decorated function per ``rungctl`` command, and what they share.

    @command("describe", "show a tool's definition and contract",
             arg("tool", help="the tool's name, as `rungctl tools` lists it"))
    def describe(ctx: Context) -> int:
        ...

A command name of two words (``"ledger verify"``) is a subcommand of a group. The parser
is built from this table (``rungd.ctl.app``), so every command word reaches exactly one
function and an unknown word is a usage error, never a guess.

A command returns its exit status, or raises one of the errors below; ``rungd.ctl.app``
is the one place that turns exceptions into a message and an exit status.
"""

from __future__ import annotations

import argparse
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rungd.client import Client
from rungd.config import CONFIG_ENV, Config
from rungd.ctl.cli import read_config
from rungd.core.envelope import Envelope

EXIT_OK, EXIT_ERROR_RESULT, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_PENDING = 0, 1, 2, 3, 4

EXIT_CODES = """\
exit status:
  0  ok
  1  the call ended in an error result, or a check found a problem (lint fix-first,
     a broken ledger, a call no longer held or no longer known, a task the model failed)
  2  bad usage: unknown command or option, an unknown or denied tool, a config or
     file that cannot be read
  3  rungd could not be reached (no socket, no permission, nothing listening)
  4  the call is still pending (held at a gate, or still running): rungctl wait CALL_ID

environment:
  RUNGD_CONFIG   config file to use when --config is not given
  RUNGD_SOCKET   socket path when neither --socket nor --config is given (it overrides
                 the socket of $RUNGD_CONFIG or of the embedded default)
  RUNGD_DEBUG=1  print the traceback of an unexpected failure
"""

# Error codes that mean the caller asked for something it cannot have, as the README
# promises: a usage error (2), not an error result of a call (1).
USAGE_CODES = frozenset({"UNKNOWN_TOOL", "DENIED", "INVALID_MESSAGE", "NOT_MSGPACK", "FRAME_TOO_LARGE"})


class UsageError(Exception):
    """The command line asks for something that cannot be done as written (exit 2)."""


class CommandFailed(Exception):
    """The command ran and found a problem, e.g. a call no longer held (exit 1)."""


def envelope_exit(env: Envelope) -> int:
    """The exit status for a call's result: 0 ok, 1 error, 2 unknown or denied tool, 4 pending."""
    if env.status == "error" and env.error is not None and env.error.code in USAGE_CODES:
        return EXIT_USAGE
    return {"ok": EXIT_OK, "error": EXIT_ERROR_RESULT, "pending": EXIT_PENDING}[env.status]


class Context:
    """What a command gets: its parsed arguments, the config and a client, both made on first use.

    Commands that only read files (``tail``, ``ledger verify``, ``new-plugin``) never
    connect; the others connect when they first touch ``client``.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._client: Client | None = None
        self._config: Config | None = None

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    @property
    def config(self) -> Config:
        """``--config``, else ``$RUNGD_CONFIG``, else the embedded default."""
        if self._config is None:
            self._config = read_config(self.args.config)
        return self._config

    def socket_path(self) -> Path | None:
        """``--socket``; else the socket of ``--config``; else ``$RUNGD_SOCKET``; else the
        socket of ``$RUNGD_CONFIG``; else None (the client's default, ``./var/rungd.sock``).

        Explicit beats environment beats default: ``load_config`` lets ``$RUNGD_SOCKET``
        replace the socket of ``$RUNGD_CONFIG`` but never that of ``--config``."""
        if self.args.socket:
            return self.args.socket
        if self.args.config or os.environ.get(CONFIG_ENV):
            return self.config.server.socket
        return None

    @property
    def client(self) -> Client:
        """A connected client. Raises ConnectFailed when rungd cannot be reached."""
        if self._client is None:
            self._client = Client(self.socket_path())
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


@dataclass(frozen=True)
class Arg:
    """One ``add_argument`` call, kept until the parser is built."""

    flags: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)


def arg(*flags: str, **options: Any) -> Arg:
    """Declare an argument as ``argparse.add_argument`` takes it."""
    return Arg(flags, options)


@dataclass(frozen=True)
class Command:
    """A registered command.

    Attributes:
        name: the command words, e.g. ``"tail"`` or ``"ledger verify"``.
        help: one line for the command list.
        description: the function's docstring, shown by ``rungctl NAME --help``.
        run: the function; it returns the exit status.
        args: its arguments.
    """

    name: str
    help: str
    description: str
    run: Callable[[Context], int]
    args: tuple[Arg, ...]


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, *args: Arg) -> Callable[[Callable[[Context], int]], Callable[[Context], int]]:
    """Register the decorated function as the command ``name``.

    Raises:
        RuntimeError: ``name`` is registered already (two functions for one word).
    """

    def register(fn: Callable[[Context], int]) -> Callable[[Context], int]:
        if name in COMMANDS:
            raise RuntimeError(f"rungctl command {name!r} registered twice")
        COMMANDS[name] = Command(name, help, inspect.getdoc(fn) or help, fn, args)
        return fn

    return register
