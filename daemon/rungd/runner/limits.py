"""Resource limits a tool may set on its program, applied in the child before exec."""

from __future__ import annotations

import ctypes
import dataclasses
import resource
from collections.abc import Callable

_PR_SET_NO_NEW_PRIVS = 38  # from <linux/prctl.h>


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits for the child (setrlimit), applied before exec. None = unlimited."""

    cpu_s: int | None = None
    address_space_bytes: int | None = None
    open_files: int | None = None
    processes: int | None = None
    file_size_bytes: int | None = None
    no_new_privs: bool = True


def preexec(limits: Limits) -> Callable[[], None]:
    """The function the child runs between fork and exec to apply ``limits`` to itself."""

    def apply() -> None:
        pairs = (
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_AS, limits.address_space_bytes),
            (resource.RLIMIT_NOFILE, limits.open_files),
            (resource.RLIMIT_NPROC, limits.processes),
            (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        )
        for which, value in pairs:
            if value is not None:
                resource.setrlimit(which, (value, value))
        if limits.no_new_privs:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

    return apply
