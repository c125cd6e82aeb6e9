"""Rung 3: file exchange with legacy programs that read an import folder and write exports.

One module per concept:

    paths     the roots a tool may touch; names checked against a pattern, never paths
    safe      opening what users can influence: never blocking, never following a swap
    patterns  operators' regular expressions refused when they can backtrack catastrophically
    formats   CSV/TSV, JSON Lines, fixed-width: streaming readers, writers, encodings
    rows      the pydantic row model as header check, fast batch validation, typed filters
    watch     watchdog observers bridged into Trio; an index of the newest complete files
    locks     our filelock, legacy lock-file conventions, open handles (psutil)
    exports   read the newest complete export: header, as_of, staleness, rows, evidence
    imports   write an import atomically, wait until taken, count before and after

A plugin uses ``Export`` and ``Importer`` with specs it declares once; see the
``rungd_plugins.ledgerbook`` demo for a complete pair of tools.
"""

from rungd.exchange.exports import AsOf, Complete, Export, ExportRead, ExportSpec, glob
from rungd.exchange.formats import Csv, FixedWidth, JsonLines, Limits, Tsv
from rungd.exchange.imports import Importer, ImportSpec, Outcome, Taken
from rungd.exchange.paths import OUTSIDE_ROOTS, OutsideRoots, Roots, checked_name
from rungd.exchange.rows import Filter, RowSchema
from rungd.exchange.safe import NOT_A_FILE, NotAFile
from rungd.exchange.watch import Watcher

__all__ = [
    "OUTSIDE_ROOTS",
    "AsOf",
    "Complete",
    "Csv",
    "Export",
    "ExportRead",
    "ExportSpec",
    "Filter",
    "FixedWidth",
    "ImportSpec",
    "Importer",
    "JsonLines",
    "Limits",
    "NOT_A_FILE",
    "NotAFile",
    "Outcome",
    "OutsideRoots",
    "Roots",
    "RowSchema",
    "Taken",
    "Tsv",
    "Watcher",
    "checked_name",
    "glob",
]
