"""The environment policy: what a child sees, which is almost nothing of the daemon's."""

from __future__ import annotations

import logging
import os
import pwd
from collections.abc import Mapping

from rungd.system import proctree
from rungd.core.contract import CallContext
from rungd.core.errors import AuthRequired, Failed, RungdError
from rungd.runner.program import Program

log = logging.getLogger("rungd.runner")

# Environment every child gets. Nothing is inherited from the daemon except the names in
# PASS_THROUGH: a daemon's environment is not a program's business.
QUIET_ENV: Mapping[str, str] = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "cat",
    "SYSTEMD_COLORS": "0",
    "LESS": "-FRX",
    # An editor that fails at once: a program that wants a person to edit text gets an
    # error instead of a hang.
    "EDITOR": "false",
    "VISUAL": "false",
    "GIT_EDITOR": "false",
    "TERM": "dumb",
    "NO_COLOR": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "DEBIAN_FRONTEND": "noninteractive",
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
}
PASS_THROUGH = ("PATH", "HOME", "USER", "LOGNAME", "TZ", "TMPDIR")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


def child_env(
    ctx: CallContext, program: Program, credentials: Mapping[str, str], askpass: Mapping[str, str] = {}
) -> dict[str, str]:
    """The child's whole environment: the quiet defaults, a few names passed through, the
    askpass helper, the tool's own values, its credentials, and the call tag."""
    env: dict[str, str] = {}
    for name in PASS_THROUGH:  # one lookup each: os.environ encodes the name every time
        if (value := os.environ.get(name)) is not None:
            env[name] = value
    if program.user is not None:
        # A program run as another user finds its own home and name, never the daemon's.
        account = pwd.getpwnam(program.user)
        env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(QUIET_ENV)
    env.update(askpass)
    env.update(program.env)
    env.update(credentials)
    if program.screen is not None:
        # A screen program draws for the terminal the tool fixed, in colour as for a person
        # (a current item may be marked by colour only).
        env["TERM"] = program.screen.term
        env.pop("NO_COLOR", None)
        # It is driven as a person at it would: debconf's screens are asked, not skipped.
        if program.env.get("DEBIAN_FRONTEND") is None:
            env.pop("DEBIAN_FRONTEND", None)
        # Line drawing as the UTF-8 characters it is, not the alternate character set (which
        # the emulator ignores in UTF-8 mode, as many terminals do).
        env["NCURSES_NO_UTF8_ACS"] = "1"
    env[proctree.TAG_ENV] = ctx.call_id
    return env


def credential(ctx: CallContext, name: str) -> str:
    """The credential ``name`` from the daemon's store for this call's tool.

    Raises:
        AuthRequired: rungd does not hold it.
        Failed: the store failed (a credential plugin's exception): nothing was run.
    """
    value = stored(ctx, name, "nothing was run")
    if value is None:
        raise AuthRequired(
            f"{ctx.tool.name} needs the credential {name!r}, which rungd does not hold",
            hint=f"the operator must add {name!r} to rungd's credential store; nothing was run",
        )
    return value


def stored(ctx: CallContext, name: str, undone: str) -> str | None:
    """The credential ``name`` from the daemon's store, or None where it holds none.

    Raises:
        Failed: the store failed (a credential plugin's exception, whatever it is: a plugin's
            failure ends this call, never the daemon); ``undone`` says what that left undone.
    """
    try:
        return ctx.credentials(name)
    except RungdError:
        raise
    except Exception as exc:  # noqa: BLE001 - a credential plugin's failure, whatever it is
        # Its type only: a store's message may quote what it read.
        log.error("credential store failed for %r: %s", name, type(exc).__name__)
        raise Failed(f"rungd could not read the credential {name!r} from its store ({type(exc).__name__}); {undone}",
                     hint="the operator must check the credential store (its plugin, or the files in "
                     "$CREDENTIALS_DIRECTORY); the daemon's log says when it failed") from None
