"""Whether ``rungd serve`` can use the config's paths on this host, checked before it touches any.

    check_paths(config)     the socket's folder and the state folder: problems and notes

``rungd check-config`` and ``rungd serve`` both run it, after the config and its plugins
load and before serve creates anything, so a socket folder that is a file or that this user
may not write is said once, naming the key and the path, rather than as the errno of
whichever ``mkdir`` or ``bind`` met it first (``File exists: /x/afile``) after the state
folders were already made.

Writability is checked for the user running the check (``os.access``, so a read-only
mount counts). Under the unit, ``ExecStartPre=`` runs check-config as the daemon's own
user; by hand, run it as that user (``sudo -u rungd rungd check-config ...``).
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import stat
from pathlib import Path

from rungd.config import Config


@dataclasses.dataclass
class PathReport:
    """What the check found.

    Attributes:
        problems: serve cannot run with these paths; one line each, naming key and path.
        notes: a folder that does not exist yet and this user may not create; serve fails
            on it, but under systemd ``RuntimeDirectory=`` / ``StateDirectory=`` make it
            before ``ExecStartPre=``, so check-config only notes it.
    """

    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


def check_paths(config: Config) -> PathReport:
    """Check the socket's folder and the state folder of ``config`` for the current user.

    Never creates or changes anything; only stats and ``os.access``.
    """
    report = PathReport()
    sock = config.server.socket
    _check_folder(report, config.source, "server.socket", sock.parent, "the socket")
    if not report.problems:
        try:
            mode = sock.lstat().st_mode
        except OSError:
            pass  # absent (serve makes it) or unreachable (the folder check said so)
        else:
            if not stat.S_ISSOCK(mode):
                report.problems.append(
                    f"{config.source}: key server.socket: {sock} exists and is a {_kind(mode)}, not a socket; "
                    "hint: serve never replaces it: point server.socket at a new path, or move that file away")
    _check_folder(report, config.source, "state.dir", config.state_dir, "ledgers, evidence and work folders")
    return report


def _user() -> str:
    uid = os.geteuid()
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _kind(mode: int) -> str:
    return ("regular file" if stat.S_ISREG(mode) else "socket" if stat.S_ISSOCK(mode)
            else "symlink" if stat.S_ISLNK(mode) else "fifo" if stat.S_ISFIFO(mode)
            else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "file")


def _check_folder(report: PathReport, source: str, key: str, folder: Path, what: str) -> None:
    where = f"{source}: key {key}"
    existing = folder
    while True:
        try:
            info = existing.stat()
            break
        except (FileNotFoundError, NotADirectoryError):
            # Missing, or some folder above it is a file: go up until something exists.
            if existing.parent == existing:
                report.problems.append(f"{where}: no part of {folder} exists")
                return
            existing = existing.parent
        except PermissionError:
            report.problems.append(f"{where}: {_user()} may not look inside a folder above {existing}; "
                                   f"hint: serve needs to reach {folder} for {what}")
            return
    if not stat.S_ISDIR(info.st_mode):
        holder = "so it" if existing == folder else f"so {folder} inside it"
        report.problems.append(
            f"{where}: {existing} is a {_kind(info.st_mode)}, not a folder, {holder} cannot hold {what}; "
            f"hint: point {key} at a path inside a folder")
        return
    writable = os.access(existing, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids)
    if existing == folder:
        if not writable:
            report.problems.append(
                f"{where}: {_user()} may not create files in {folder} (mode {stat.S_IMODE(info.st_mode):04o}, "
                f"owner uid {info.st_uid}), which must hold {what}; hint: serve runs as the user checked here "
                f"(run check-config as that user): chown the folder to it, or point {key} elsewhere")
        return
    if not writable:
        report.notes.append(
            f"{where}: {folder} does not exist, and {_user()} may not create it in {existing}; "
            f"hint: create it (install -d -o USER {folder}); under systemd, RuntimeDirectory= and "
            "StateDirectory= make /run/rungd and /var/lib/rungd before the daemon starts")
