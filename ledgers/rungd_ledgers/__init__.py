"""The rungd ledger: an append-only, hash-chained record of every call, as JSON Lines.

Modules, one concept each:

    records   Record, the line format and its schema rules; input_digest
    chain     sealing a record into a line; checking a line against its hash
    files     ledger file names, and decoding them in blocks of whole lines
    writer    Ledger: durable, group-committed appends; crash repair; rotation
    reader    iter_records and follow (``rungctl tail --follow``)
    verify    verify: the first problem in a ledger, if any, against anchors too
    retention prune: delete whole old files, recorded first by a ``pruned`` record
    anchors   Anchor, read_anchors: the chain's head as published off-host
    index     IdempotencyIndex: request_id -> first result, unfinished and held calls
    errors    the exception tree

Standard library and msgspec only. Everything blocks and everything is thread-safe; the
daemon calls it through ``trio.to_thread.run_sync``.
"""

from rungd_ledgers.anchors import Anchor, AnchorFileError, anchor_message, read_anchors
from rungd_ledgers.chain import GENESIS
from rungd_ledgers.errors import LedgerClosed, LedgerCorrupt, LedgerError, LedgerUnavailable
from rungd_ledgers.files import MAX_LINE_BYTES
from rungd_ledgers.index import DEFAULT_RETENTION_SECONDS, Entry, Held, IdempotencyIndex, Unfinished
from rungd_ledgers.reader import Event, follow, iter_events, iter_records
from rungd_ledgers.records import EVENTS, SCHEMA_VERSION, PrunedFile, Record, input_digest
from rungd_ledgers.retention import PruneResult, prune
from rungd_ledgers.verify import Problem, VerifyReport, verify
from rungd_ledgers.writer import DEFAULT_ROTATE_BYTES, Ledger, TornRepair

__all__ = [
    "MAX_LINE_BYTES",
    "Event",
    "iter_events",
    "Anchor",
    "AnchorFileError",
    "PruneResult",
    "PrunedFile",
    "anchor_message",
    "prune",
    "read_anchors",
    "DEFAULT_RETENTION_SECONDS",
    "DEFAULT_ROTATE_BYTES",
    "EVENTS",
    "GENESIS",
    "SCHEMA_VERSION",
    "Entry",
    "Held",
    "IdempotencyIndex",
    "Ledger",
    "LedgerClosed",
    "LedgerCorrupt",
    "LedgerError",
    "LedgerUnavailable",
    "Problem",
    "Record",
    "TornRepair",
    "Unfinished",
    "VerifyReport",
    "follow",
    "input_digest",
    "iter_records",
    "verify",
]
