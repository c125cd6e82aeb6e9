"""Resource limits a tool may set on its program, applied in the child before exec."""

from __future__ import annotations

import ctypes
import dataclasses
import resource
from collections.abc import Callable

import trio

_PR_SET_NO_NEW_PRIVS = 38  # from <linux/prctl.h>


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits for the child (setrlimit), applied before exec. None = unlimited."""

    cpu_s: int | None = None
    address_space_bytes: int | None = None
    open_files: int | None = None
    processes: int | None = None
    file_size_bytes: int | None = None
    core_bytes: int | None = None
    no_new_privs: bool = True


# What every call's program gets unless the configuration ([limits]) or the tool says otherwise:
# enough for any ordinary command-line program, not enough for one to take the host.
DEFAULT = Limits(
    address_space_bytes=None,  # RLIMIT_AS breaks JVMs and threaded programs: see config.py
    processes=4096,  # RLIMIT_NPROC counts the whole uid's processes; root is exempt
    file_size_bytes=16 << 30,
    core_bytes=0,
    open_files=1024,
    # Not by default: wrapped programs include setuid ones (sudo -u, crontab, passwd) that
    # no_new_privs would break. A tool that declares its own limits gets it unless it says no.
    no_new_privs=False,
)
_DEFAULTS: trio.lowlevel.RunVar[Limits] = trio.lowlevel.RunVar("rungd.runner.limits", default=DEFAULT)


def set_defaults(limits: Limits) -> None:
    """Set the defaults of this daemon (its Trio run): the ``[limits]`` of its config."""
    _DEFAULTS.set(limits)


def effective(limits: Limits | None) -> Limits:
    """A tool's limits over the daemon's defaults: each limit the tool sets wins."""
    defaults = _DEFAULTS.get()
    if limits is None:
        return defaults
    chosen = {field.name: getattr(limits, field.name) for field in dataclasses.fields(Limits)}
    for name, value in chosen.items():
        if value is None and name != "no_new_privs":
            chosen[name] = getattr(defaults, name)
    return Limits(**chosen)


def apply_limits(limits: Limits) -> None:
    """Apply ``limits`` to the calling process (a child between fork and exec)."""
    pairs = (
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_AS, limits.address_space_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        (resource.RLIMIT_CORE, limits.core_bytes),
    )
    for which, value in pairs:
        if value is not None:
            resource.setrlimit(which, (value, value))
    if limits.no_new_privs:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def preexec(limits: Limits) -> Callable[[], None]:
    """The function the child runs between fork and exec to apply ``limits`` to itself."""

    def apply() -> None:
        apply_limits(limits)

    return apply
