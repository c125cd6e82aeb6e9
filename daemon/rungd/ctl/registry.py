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
import dataclasses
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rungd.client import Client, ssh_failed
from rungd.config import CONFIG_ENV, Config
from rungd.ctl.cli import read_config
from rungd.core.envelope import Envelope
from rungd.ssh_host import REMOTE_SOCKET, BadHost, SshHost, Tunnel, TunnelFailed, host_from_env

EXIT_OK, EXIT_ERROR_RESULT, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_PENDING = 0, 1, 2, 3, 4
EXIT_INCOMPLETE = 5  # rungctl check: no problem found in what ran, but not everything ran

EXIT_CODES = """\
exit status:
  0  ok
  1  the call ended in an error result, or a check found a problem (lint fix-first,
     a broken ledger, a call no longer held or no longer known, a task the model failed)
  2  bad usage: unknown command or option, an unknown or denied tool, a config or
     file that cannot be read
  3  rungd could not be reached (no socket, no permission, nothing listening)
  4  the call is still pending (held at a gate, or still running): rungctl wait CALL_ID
  5  rungctl check found no problem in what it ran, but skipped a tool or a fixture
     (SKIP and PART lines say which, and why)

environment:
  RUNGD_CONFIG   config file to use when --config is not given
  RUNGD_SOCKET   socket path when neither --socket nor --config is given (it overrides
                 the socket of $RUNGD_CONFIG or of the embedded default)
  RUNGD_HOST     ssh://[USER@]HOST[:PORT][/SOCKET] when none of --host, --socket and
                 --config is given (it beats RUNGD_SOCKET and RUNGD_CONFIG; empty: this host)
  RUNGD_SSH_CONFIG      with a host: the ssh config file to use (ssh -F) instead of ~/.ssh/config
  RUNGD_REMOTE_RUNGCTL  with a host: the rungctl that tail, ledger verify, health and status
                        run there over ssh (default: rungctl on the ssh user's PATH)
  RUNGD_DEBUG=1  print the traceback of an unexpected failure
"""

# The commands that read the daemon's files (its ledger), not only its socket. With a host
# the files are there, so the host's own rungctl runs them (``ssh HOST rungctl ...``).
RUN_ON_HOST = frozenset({"tail", "ledger verify", "health", "status"})

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
        self._host: SshHost | None = None
        self._tunnel: Tunnel | None = None

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    @property
    def config(self) -> Config:
        """``--config``, else ``$RUNGD_CONFIG``, else the embedded default."""
        if self._config is None:
            self._config = read_config(self.args.config)
        return self._config

    def host(self) -> SshHost | None:
        """The host whose rungd to reach over ssh: ``--host``; else ``$RUNGD_HOST`` unless
        ``--socket`` or ``--config`` is given; else None (this machine).

        Explicit beats environment, as for the socket: ``--host`` beats ``$RUNGD_SOCKET`` and
        ``$RUNGD_CONFIG``, and a ``--socket`` or ``--config`` given here beats ``$RUNGD_HOST``.

        Raises:
            UsageError: both ``--host`` and ``--socket``, or a host that is not an ssh:// URL.
        """
        if self._host is None:
            given = getattr(self.args, "host", None)
            try:
                if given:
                    if self.args.socket:
                        raise UsageError(f"--host {given} and --socket {self.args.socket} both say where rungd is; "
                                         "hint: give one (the socket on the host goes in the URL's path: "
                                         "ssh://HOST/run/rungd/rungd.sock)")
                    self._host = SshHost.parse(given)
                elif not self.args.socket and not self.args.config:
                    self._host = host_from_env()
            except BadHost as exc:
                raise UsageError(str(exc)) from None
        return self._host

    def socket_path(self) -> Path | None:
        """``--socket``; else the socket of ``--config``; else ``$RUNGD_SOCKET``; else the
        socket of ``$RUNGD_CONFIG``; else None (the client's default, ``./var/rungd.sock``).
        With a host (``host()``), the local end of an ssh tunnel to its socket, opened on
        first use and closed by ``close``.

        Explicit beats environment beats default: ``load_config`` lets ``$RUNGD_SOCKET``
        replace the socket of ``$RUNGD_CONFIG`` but never that of ``--config``.

        Raises:
            UsageError: ``--host`` with ``--config`` (a file on the host that a socket command
                cannot read from here).
            ConnectFailed: the tunnel did not come up.
        """
        host = self._socket_host()
        if host is not None:
            if self._tunnel is None:
                tunnel = Tunnel(host)
                try:
                    tunnel.open()
                except TunnelFailed as exc:
                    raise ssh_failed(host, exc) from None
                self._tunnel = tunnel
            return self._tunnel.local
        if self.args.socket:
            return self.args.socket
        if self.args.config or os.environ.get(CONFIG_ENV):
            return self.config.server.socket
        return None

    def _socket_host(self) -> SshHost | None:
        host = self.host()
        if host is not None and self.args.config:
            # The config is on the host, where only the commands of RUN_ON_HOST read it:
            # guessing its socket here could reach another daemon.
            example = dataclasses.replace(host, socket=REMOTE_SOCKET).url
            raise UsageError(f"--config {self.args.config} with --host: the config is a file on {host.host}, which "
                             "this command cannot read from here; hint: name its socket (server.socket in that "
                             f"config) in the URL instead: {example}")
        return host

    @property
    def client(self) -> Client:
        """A connected client (over ssh, with a host). Raises ConnectFailed when rungd cannot
        be reached."""
        if self._client is None:
            host = self._socket_host()
            self._client = Client(host=host) if host is not None else Client(self.socket_path())
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._tunnel is not None:
            self._tunnel.close()


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
