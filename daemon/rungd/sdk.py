"""The plugin SDK: everything a rungd plugin imports from rungd, in one place.

A plugin imports from here and nowhere else in ``rungd`` (``tests/test_layering.py`` fails
the build otherwise), so the modules behind these names can move without breaking a plugin.
Everything listed below is public and stable: a name is removed or changed only after a
release in which using it warns. Anything not listed here is internal.

    from rungd.sdk import Description, Program, Result, Tool, ToolInputs, check_exit, hookimpl, run

Hooks (see ``rungd.hookspecs`` for when each is called)
    hookimpl            the marker: ``@hookimpl def rungd_register_tools(register, settings)``
    PluginSettings      a plugin's own ``[plugins.settings.<name>]`` table, ``parse(model,
                        example)``, the config label, ``tool_dirs`` and its ``state_dir``

The tool contract (``Tool`` and its five parts)
    Tool, ToolInputs, NoInputs, Description, ErrorRule, Timing, SettleSpec
    Result              what a handler returns when the call worked
    CallContext         what a handler knows about its call
    Caller              who called (the socket peer), as observers see it
    Envelope            the result an observer sees
    SideEffect, CommitPoint, Gate, Effect, Outcome, Retry, NextAction   the literal types
    CORE_ERRORS         the core codes: code -> (retry, next_action, meaning)
    shows(fields, expect)   the one rule a read-back and reconcile judge "it happened" by

Errors a plugin raises (failures are raised, never returned)
    ToolError(code, message, hint=...)  a code of the tool's own error table
    SurfaceChanged, UnexpectedState, AuthRequired, PromptUnexpected, Locked, StaleExport,
    ImportPartial, Failed, BadInput     the core codes a handler may report
    ConfigError         the plugin's settings or files are wrong (start-up stops)
    RungdError          the base class, for ``except``

Rung 2, running a command-line program (``rungd.runner``)
    run(ctx, Program(...)) -> Completed, check_exit(done, table)
    Program, Confirmation, CredentialPrompt, Limits, Completed

Rung 3, file exchange (``rungd.exchange``): ``exchange`` is the package as a namespace, and
its public names are also here
    Export, ExportSpec, ExportRead, AsOf, Complete, Csv, Tsv, JsonLines, FixedWidth, Filter,
    RowSchema, Importer, ImportSpec, Taken, ImportOutcome, Roots, OutsideRoots, OUTSIDE_ROOTS,
    checked_name, glob, Watcher
    LIBREOFFICE_LOCK, LCK_LOCK, STEM_LCK_LOCK, MS_OFFICE_LOCK   lock-file conventions

Test helpers for plugin authors live in ``rungd.testing`` (a pytest plugin; it needs the
``test`` extra), not here, so a plugin never imports pytest at run time.
"""

from __future__ import annotations

from rungd import exchange
from rungd.contract import (
    CallContext,
    Caller,
    CommitPoint,
    Description,
    ErrorRule,
    Gate,
    NoInputs,
    Result,
    SettleSpec,
    SideEffect,
    Timing,
    Tool,
    ToolInputs,
    shows,
)
from rungd.envelope import Effect, Envelope
from rungd.errors import (
    CORE_ERRORS,
    AuthRequired,
    BadInput,
    ConfigError,
    Failed,
    ImportPartial,
    Locked,
    NextAction,
    Outcome,
    PromptUnexpected,
    Retry,
    RungdError,
    StaleExport,
    SurfaceChanged,
    ToolError,
    UnexpectedState,
)
from rungd.exchange import (
    OUTSIDE_ROOTS,
    AsOf,
    Complete,
    Csv,
    Export,
    ExportRead,
    ExportSpec,
    Filter,
    FixedWidth,
    Importer,
    ImportSpec,
    JsonLines,
    OutsideRoots,
    Roots,
    RowSchema,
    Taken,
    Tsv,
    Watcher,
    checked_name,
    glob,
)
from rungd.exchange import Outcome as ImportOutcome
from rungd.exchange import locks as _locks
from rungd.hookspecs import hookimpl
from rungd.plugins import PluginSettings
from rungd.runner import Completed, Confirmation, CredentialPrompt, Limits, Program, check_exit, run

# The lock-file conventions of programs people keep files open in; ``{name}`` is the
# file's name and ``{stem}`` its name without the suffix.
LIBREOFFICE_LOCK = _locks.LIBREOFFICE
LCK_LOCK = _locks.LCK
STEM_LCK_LOCK = _locks.STEM_LCK
MS_OFFICE_LOCK = _locks.MS_OFFICE

__all__ = [
    "CORE_ERRORS",
    "LCK_LOCK",
    "LIBREOFFICE_LOCK",
    "MS_OFFICE_LOCK",
    "OUTSIDE_ROOTS",
    "STEM_LCK_LOCK",
    "AsOf",
    "AuthRequired",
    "BadInput",
    "CallContext",
    "Caller",
    "CommitPoint",
    "Complete",
    "Completed",
    "ConfigError",
    "Confirmation",
    "CredentialPrompt",
    "Csv",
    "Description",
    "Effect",
    "Envelope",
    "ErrorRule",
    "Export",
    "ExportRead",
    "ExportSpec",
    "Failed",
    "Filter",
    "FixedWidth",
    "Gate",
    "ImportOutcome",
    "ImportPartial",
    "ImportSpec",
    "Importer",
    "JsonLines",
    "Limits",
    "Locked",
    "NextAction",
    "NoInputs",
    "Outcome",
    "OutsideRoots",
    "PluginSettings",
    "Program",
    "PromptUnexpected",
    "Result",
    "Retry",
    "Roots",
    "RowSchema",
    "RungdError",
    "SettleSpec",
    "SideEffect",
    "StaleExport",
    "SurfaceChanged",
    "Taken",
    "Timing",
    "Tool",
    "ToolError",
    "ToolInputs",
    "Tsv",
    "UnexpectedState",
    "Watcher",
    "check_exit",
    "checked_name",
    "exchange",
    "glob",
    "hookimpl",
    "run",
    "shows",
]
