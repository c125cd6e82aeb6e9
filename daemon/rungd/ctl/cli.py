"""What both command lines (``rungd`` and ``rungctl``) do the same way: ``--version``,
reading the config with every failure in one line, and the last-resort handler that turns
an unexpected exception into one line.

A traceback is for the person fixing rungd, not the one running it: it is printed only
with ``RUNGD_DEBUG=1`` in the environment.
"""

from __future__ import annotations

import os
import sys
import traceback
from importlib import metadata
from pathlib import Path

from rungd.config import CONFIG_ENV, Config, load_config
from rungd.core.errors import ConfigError

DEBUG_ENV = "RUNGD_DEBUG"


def version() -> str:
    """The installed distribution's version; ``rungd.__version__`` when run from a bare checkout."""
    try:
        return metadata.version("rungd")
    except metadata.PackageNotFoundError:
        import rungd

        return getattr(rungd, "__version__", "unknown")


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def fail(prog: str, message: str) -> None:
    """Print one line to stderr: ``prog: what: why; hint: what to do``."""
    print(f"{prog}: {message}", file=sys.stderr)


def unexpected(prog: str, exc: BaseException) -> None:
    """Report an exception no handler expected: one line, or the traceback when debugging."""
    if debugging():
        traceback.print_exception(exc, file=sys.stderr)
    detail = str(exc).splitlines()[0] if str(exc) else ""
    fail(prog, f"unexpected failure: {type(exc).__name__}{': ' + detail if detail else ''}; hint: run again with "
         f"{DEBUG_ENV}=1 for the traceback, and report it with what you ran")


def read_config(path: Path | None) -> Config:
    """``load_config`` with an unreadable file said in one line, like a missing one.

    Raises:
        ConfigError: missing, unreadable, not TOML or not valid.
    """
    try:
        return load_config(path)
    except OSError as exc:  # load_config itself explains only a missing file
        where = exc.filename or path or os.environ.get(CONFIG_ENV) or "the config"
        raise ConfigError(
            f"{where}: cannot read it: {exc.strerror or exc}; hint: run as a user who may read it "
            "(see `ls -l` on it; the install guide makes /etc/rungd/rungd.toml 0644: it holds no secret), "
            "or pass --config to a readable copy"
        ) from None
