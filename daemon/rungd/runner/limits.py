"""Resource limits a tool may set on its program, applied in the new process before exec
(by the launcher, ``rungd.runner.launcher``)."""

from __future__ import annotations

import dataclasses

import trio


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

    def wire(self) -> tuple[object, ...]:
        """The limits as the launcher applies them (``rungd.runner.launcher.apply_limits``)."""
        return (self.cpu_s, self.address_space_bytes, self.open_files, self.processes,
                self.file_size_bytes, self.core_bytes, self.no_new_privs)


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
