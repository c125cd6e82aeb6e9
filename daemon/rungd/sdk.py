"""The plugin SDK: everything a rungd plugin imports from rungd, in one place.

A plugin imports from here and nowhere else in ``rungd`` (``tests/test_layering.py`` fails
the build otherwise), so the modules behind these names can move without breaking a plugin.
Everything listed below is public and stable: a name is removed or changed only after a
release in which using it warns. Anything not listed here is internal.

    from rungd.sdk import Description, Program, Result, Tool, ToolInputs, check_exit, hookimpl, run

Hooks (see ``rungd.core.hookspecs`` for when each is called)
    hookimpl            the marker: ``@hookimpl def rungd_register_tools(register, settings)``
    PluginSettings      a plugin's own ``[plugins.settings.<name>]`` table, ``parse(model,
                        example)``, the config label, ``tool_dirs`` and its ``state_dir``

The tool contract (``Tool`` and its five parts)
    Tool, ToolInputs, NoInputs, Description, ErrorRule, Timing, SettleSpec
    A ToolInputs field with ``json_schema_extra={"sensitive": True}`` (a str: a password, a PIN)
                        reaches the handler as it is and shows everywhere else as a keyed mark,
                        ``<sensitive hmac:1a2b3c4d5e6f>``; it is redacted from the program's
                        output, and no settle read or precondition may take it
    Precondition        a write's expected revision: a read, the fields it must still show, and
                        a resource lock held from the check to the end of the call (CONFLICT)
    Result              what a handler returns when the call worked
    CallContext         what a handler knows about its call
    Caller              who called (the socket peer), as observers see it
    Envelope            the result an observer sees
    SideEffect, CommitPoint, Gate, Effect, Outcome, Retry, NextAction   the literal types
    CORE_ERRORS         the core codes: code -> (retry, next_action, meaning)
    shows(fields, expect)   the one rule a read-back and reconcile judge "it happened" by

The contract's heading (``Tool(heading=..., credentials=(...))``)
    Heading             rung, ruled_out, step_down, climb, attempts (the budget), session
    RuledOut            a higher rung and the test it fails: present, unattended, readable back
    StepDown            an observation the daemon watches for: codes, count, in a row or within_s
    Session             credential names (declared in ``Tool.credentials``), who provides
                        them, the code returned on expiry
    RUNGS               rung number -> name (1 API ... 6 screen)

Errors a plugin raises (failures are raised, never returned)
    ToolError(code, message, hint=...)  a code of the tool's own error table
    SurfaceChanged, UnexpectedState, AuthRequired, PromptUnexpected, Locked, StaleExport,
    ImportPartial, Failed, BadInput, Conflict   the core codes a handler may report
    ConfigError         the plugin's settings or files are wrong (start-up stops)
    Untrusted           a ConfigError: a file that decides what runs is not owned right; raised
                        from rungd_register_tools it drops that plugin's tools, not the daemon

Trust follows ownership (``rungd.system.trust``)
    check_trusted(path, what)   refuse a file (a program, a script) unless it and every folder
                        above it are owned by root or rungd's user and writable by no one else
    check_trusted_operand(path, what)   the same for a path a tool fixes in its arguments: a
                        folder is judged as on the way (``df /tmp``), a path not made yet by
                        the folder it would be made in; ``Program.fixed_paths`` re-checks per call
    RungdError          the base class, for ``except``

Rung 2, running a command-line program (``rungd.runner``)
    run(ctx, Program(...)) -> Completed, check_exit(done, table)
    Program, Confirmation, CredentialPrompt, Limits, Completed
    Screen, Step, Wait, Read, Band   a screen program (``Program(terminal="screen",
                        screen=Screen(steps=...))``): steps that wait for what it draws, read
                        fields at fixed positions, type text, a credential or named keys;
                        ``Completed.fields`` holds what they read, ``Completed.screen`` the last
                        screen
    screen_key(term, name)   the key ``name`` on a terminal of type ``term``, from the host's
                        terminfo; raises UnknownKey (a ValueError) naming what is missing
    credential_file_marker(name)   what an argv word holds where the runner puts the path of
                        a sealed file with that credential (``Program.argv_file_credentials``)

Rung 3, file exchange (``rungd.exchange``): ``exchange`` is the package as a namespace, and
its public names are also here
    Export, ExportSpec, ExportRead, AsOf, Complete, Csv, Tsv, JsonLines, FixedWidth, Filter,
    RowSchema, Importer, ImportSpec, Taken, ImportOutcome, Roots, OutsideRoots, OUTSIDE_ROOTS,
    NotAFile, NOT_A_FILE, checked_name, glob, Watcher
    ExportLimits        how big an export may be before reading it is refused
    LIBREOFFICE_LOCK, LCK_LOCK, STEM_LCK_LOCK, MS_OFFICE_LOCK   lock-file conventions

Regular expressions an operator writes (``rungd.exchange.patterns``)
    catastrophic_pattern(p)   why ``p`` can backtrack catastrophically, or None
    polynomial_pattern(p)     why ``p`` takes time growing as a power of its text's length (two
                        repeats that take the same characters in a row), or None: too slow
                        for a pattern matched on every redraw of a screen
    refused_pattern(p)        the same, remembered per pattern, and an invalid one refused
    PATTERN_HINT              how to rewrite a refused pattern, for an error's hint

Test helpers for plugin authors live in ``rungd.testing`` (a pytest plugin; it needs the
``test`` extra), not here, so a plugin never imports pytest at run time.
"""

from __future__ import annotations

from rungd import exchange
from rungd.core.contract import (
    CallContext,
    Caller,
    CommitPoint,
    Description,
    ErrorRule,
    Heading,
    NoInputs,
    Precondition,
    Result,
    RuledOut,
    RUNGS,
    Session,
    SettleSpec,
    SideEffect,
    StepDown,
    Timing,
    Tool,
    ToolInputs,
    shows,
)
from rungd.core.envelope import Effect, Envelope
from rungd.core.vocabulary import Gate
from rungd.core.errors import (
    CORE_ERRORS,
    AuthRequired,
    BadInput,
    ConfigError,
    Conflict,
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
    NOT_A_FILE,
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
    NotAFile,
    OutsideRoots,
    Roots,
    RowSchema,
    Taken,
    Tsv,
    Watcher,
    checked_name,
    glob,
)
from rungd.exchange import Limits as ExportLimits
from rungd.exchange import Outcome as ImportOutcome
from rungd.exchange import locks as _locks
from rungd.exchange.patterns import HINT as PATTERN_HINT
from rungd.exchange.patterns import catastrophic as catastrophic_pattern
from rungd.exchange.patterns import polynomial as polynomial_pattern
from rungd.exchange.patterns import refused as refused_pattern
from rungd.core.hookspecs import hookimpl
from rungd.core.settings import PluginSettings
from rungd.system.trust import Untrusted
from rungd.system.trust import check as check_trusted
from rungd.system.trust import check_operand as check_trusted_operand
from rungd.runner.keys import UnknownKey
from rungd.runner.keys import key as screen_key
from rungd.runner import (
    Band,
    Completed,
    Confirmation,
    CredentialPrompt,
    Limits,
    Program,
    Read,
    Screen,
    Step,
    Wait,
    check_exit,
    credential_file_marker,
    run,
)

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
    "NOT_A_FILE",
    "OUTSIDE_ROOTS",
    "PATTERN_HINT",
    "RUNGS",
    "STEM_LCK_LOCK",
    "AsOf",
    "AuthRequired",
    "BadInput",
    "Band",
    "CallContext",
    "Caller",
    "CommitPoint",
    "Complete",
    "Completed",
    "ConfigError",
    "Untrusted",
    "UnknownKey",
    "screen_key",
    "check_trusted",
    "check_trusted_operand",
    "Confirmation",
    "credential_file_marker",
    "CredentialPrompt",
    "Csv",
    "Description",
    "Effect",
    "Envelope",
    "ErrorRule",
    "Export",
    "ExportLimits",
    "ExportRead",
    "ExportSpec",
    "Failed",
    "Filter",
    "FixedWidth",
    "Gate",
    "Heading",
    "ImportOutcome",
    "ImportPartial",
    "ImportSpec",
    "Importer",
    "JsonLines",
    "Limits",
    "Locked",
    "NextAction",
    "NoInputs",
    "NotAFile",
    "Outcome",
    "OutsideRoots",
    "PluginSettings",
    "Program",
    "PromptUnexpected",
    "Read",
    "Result",
    "Retry",
    "Screen",
    "Step",
    "Roots",
    "RowSchema",
    "RuledOut",
    "RungdError",
    "Session",
    "SettleSpec",
    "Precondition",
    "Conflict",
    "SideEffect",
    "StaleExport",
    "StepDown",
    "SurfaceChanged",
    "Taken",
    "Timing",
    "Tool",
    "ToolError",
    "ToolInputs",
    "Tsv",
    "UnexpectedState",
    "Wait",
    "Watcher",
    "catastrophic_pattern",
    "polynomial_pattern",
    "check_exit",
    "checked_name",
    "exchange",
    "glob",
    "hookimpl",
    "refused_pattern",
    "run",
    "shows",
]
