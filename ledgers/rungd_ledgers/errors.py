"""Errors raised by the ledger package.

    LedgerError             base of everything below
    ├── LedgerUnavailable   the ledger cannot be written now (disk full, I/O error, another
    │                       process holds it); nothing was recorded, a later append may work
    ├── LedgerClosed        append after ``Ledger.close()``: a bug in the caller, not the disk
    └── LedgerCorrupt       a file holds bytes that are not ledger records; run ``verify``

The daemon turns ``LedgerUnavailable`` into its own ``LEDGER_UNAVAILABLE`` result at its one
error boundary; this package knows nothing of result envelopes.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base of every error this package raises on purpose."""


class LedgerUnavailable(LedgerError):
    """Nothing was recorded: the write, the fsync or the lock failed. Retry later."""


class LedgerClosed(LedgerError):
    """The ledger was closed before this append."""


class LedgerCorrupt(LedgerError):
    """A ledger file cannot be read as records. ``verify`` names the first bad line."""
