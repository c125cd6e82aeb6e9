"""Times read from files a person or a program may have edited (a ledger, a tombstone), told
in words: a number no clock can show (1e308, -1e18) is told as itself, never raised."""

from __future__ import annotations

import datetime
import time


def local(unix: float, fmt: str = "%Y-%m-%d %H:%M:%S %Z") -> str:
    """``unix`` in the local zone, by ``fmt`` (strftime)."""
    try:
        return time.strftime(fmt, time.localtime(unix))
    except (OverflowError, ValueError, OSError):
        return f"{unix!r} (not a time)"


def utc_iso(unix: float) -> str:
    """``unix`` as ISO 8601 in UTC, to the second: ``2026-12-04T21:00:00+00:00``."""
    return _iso(unix, datetime.timezone.utc)


def local_iso(unix: float) -> str:
    """``unix`` as ISO 8601 in the local zone, with its offset: ``2026-11-30T10:00:00+01:00``."""
    return _iso(unix, None)


def _iso(unix: float, zone: datetime.tzinfo | None) -> str:
    try:
        return datetime.datetime.fromtimestamp(unix, zone).astimezone(zone).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return f"{unix!r} (not a time)"
