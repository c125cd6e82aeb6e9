"""``rungctl``: the operator's and developer's command line, a thin layer over the client.

    rungctl tools                               the tools you may call
    rungctl describe TOOL                       the definition a model reads, and the contract
    rungctl call TOOL [key=value ...] [--inputs JSON] [--request-id ID] [--wait S]
    rungctl status CALL_ID | wait CALL_ID
    rungctl reconcile TOOL REQUEST_ID [--found yes|no]
    rungctl evidence ID [--bytes OFFSET:LENGTH | --lines FIRST:COUNT | --grep TEXT] [--all] [--raw]
    rungctl pending | approve CALL_ID [--key KEY] [--reason TEXT] | deny CALL_ID [--reason TEXT]
    rungctl export-tools --format openai|anthropic|mcp|jsonschema [--tools a,b]
    rungctl lint [--json] [--tools a,b] [--offline]
    rungctl health [TOOL] [--since 24h] [--json | --format prometheus [--textfile F]] | resume TOOL
    rungctl mcp [--wait S]                      an MCP server on stdio, forwarding to rungd
    rungctl new-plugin NAME [--python] [--dir DIR]
    rungctl ledger verify [PATH]
    rungctl tail [-n N] [--since WHEN] [--until WHEN] [-f] [--tool T] [--outcome O] [--call ID] [--event E] [-o FORMAT]
    rungctl probe [--read 'CMD'] [--answer REGEX=TEXT] [--draft FILE] -- PROGRAM ARGS

Every command takes ``--json`` for machines, and ``--host ssh://[user@]host[:port][/socket]``
(or ``$RUNGD_HOST``) to reach the rungd of another host through ssh (``rungd.ssh_host``). Exit status: 0 ok, 1 the call ended in an
error result, 2 bad usage (an unknown or denied tool included), 3 rungd could not be
reached, 4 the call is still pending (``registry.EXIT_CODES`` has the full text).

Modules:

    registry   the command table (``@command``), Context, exit codes, UsageError / CommandFailed
    commands   the commands that talk to the daemon, and lint / export-tools / mcp / new-plugin
    ledger     tail and ledger verify: they read the ledger files
    evidence   evidence: a call's full, redacted output, read through the daemon
    health     health (reads the ledger files) and resume (lifts a step-down mark)
    probe      probe: a program run once as a call would, what it asked, and a drafted tool file
    show       human output: envelopes, definitions, ledger lines
    cli        what rungd and rungctl share: --version, the last-resort error line
    app        the parser built from the table, and main: the one error boundary
"""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["build_parser", "main", "print_envelope"]


def main(argv: list[str] | None = None) -> int:
    """The ``rungctl`` console script; see ``rungd.ctl.app.main``."""
    # `rungctl ... | head` should end quietly when head has read enough, like any CLI. Only
    # here, in the process rungctl owns: a test or a program calling app.main in-process
    # keeps Python's ignored SIGPIPE (else its next write to a closed pipe kills it).
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # Imported here so that `rungd`, which shares rungd.ctl.cli, does not load every command.
    from rungd.ctl.app import main as run

    return run(argv)


def __getattr__(name: str) -> Any:
    if name == "build_parser":
        from rungd.ctl.app import build_parser

        return build_parser
    if name == "print_envelope":
        from rungd.ctl.show import print_envelope

        return print_envelope
    raise AttributeError(f"module 'rungd.ctl' has no attribute {name!r}")
