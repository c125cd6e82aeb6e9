"""``rungctl lint``: check tool definitions against the contract and seed 002's template.

The linter reads what a model and an operator read, the ``ToolDefinition`` the daemon
serves, so it checks a running daemon's tools for the calling uid, a config loaded
offline (``definitions_from_config``), or one ``Tool`` (``lint_tool``) alike. Like seed
002's linter it is pattern matching over text and schema: it cannot tell a right call
from a wrong one, only a definition a model is likely to misread from one it is not.

Each finding has a rank:

    fix-first   the tool will be misused or cannot be used safely: a write that cannot be
                settled or retried safely, a description that only restates the name, a
                schema a provider refuses. CI fails on these (``exit_status``).
    should-fix  a model will guess where it should know: a missing slot, an undescribed or
                untyped input, a write not named as one, a missing core error.
    consider    usually worth it, sometimes not: an unbounded string, a closed set written
                as prose, a large definition.

Codes are stable (``description.slot_missing``); tests, CI filters and waivers use them.
A definition may waive codes for its tool with a reason (``lint_waivers``, when the
contract carries it), for the case only its author can judge, e.g. a program that can
never ask for a credential (``errors.auth_required_missing``).

Thresholds, and why:

- Definition size, measured as the Anthropic shape in compact JSON (name, description,
  input schema; the smallest of the four): consider above 2,048 bytes (about 500 tokens),
  should-fix above 4,096 (about 1,000). Seed 002's exemplary refund_payment is 1,502
  bytes, so a full six-slot tool fits under the first line; the vendor figure it cites,
  55K tokens for 58 tools, is about 950 tokens each, the cost the second line stops.
- Result cap: should-fix under 512 bytes (an error envelope with its hint needs room),
  consider above 8,192 and should-fix above 16,384 (4K tokens of result read again on
  every later pass; seed 002: more was worse).
- Tool count: consider above 20, the soft ceiling two providers' docs give.
- Names too close: edit distance 1, the same words but for a plural or separators, or a
  difflib ratio of 0.92 or more (``get_customer`` / ``get_customers``), not verb pairs
  like ``_pull`` / ``_push``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

from rungd.service.catalog import describe
from rungd.core import expectations
from rungd.core.contract import Description
from rungd.authoring.definitions import (
    PROVIDER_NAME,
    ExportError,
    compact_json,
    estimate_tokens,
    to_anthropic,
)
from rungd.core.errors import CORE_ERRORS, NextAction, Retry
from rungd.service.plugins import DECLARATIVE, Hooks
from rungd.protocol import ToolDefinition

if TYPE_CHECKING:
    from rungd.config import Config
    from rungd.core.contract import Tool

Rank = Literal["fix-first", "should-fix", "consider"]
RANKS: tuple[Rank, ...] = ("fix-first", "should-fix", "consider")
SET = "(set)"  # the tool name of findings about the whole set

SIZE_CONSIDER, SIZE_SHOULD_FIX = 2048, 4096
CAP_SMALL, CAP_CONSIDER, CAP_SHOULD_FIX = 512, 8192, 16384
MAX_TOOLS = 20
DEADLINE_LONG_S = 600
CLOSE_RATIO = 0.92


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing to change in one tool's definition (or, with tool ``(set)``, in the set)."""

    tool: str
    rank: Rank
    code: str
    message: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


# --- vocabulary ----------------------------------------------------------------------------

SLOTS: tuple[tuple[str, str], ...] = Description.SLOTS  # the template the contract joins
# For descriptions written as prose (not rungd's labelled lines): the phrase that fills a slot.
_PROSE_SLOTS = {
    "use_when": re.compile(r"\buse (?:it |this )?when\b", re.IGNORECASE),
    "do_not_use_when": re.compile(r"\b(?:do not|don't|never) use\b", re.IGNORECASE),
    "returns": re.compile(r"\breturns?\b", re.IGNORECASE),
    "on_error": re.compile(r"\bon error\b|\bif it fails\b", re.IGNORECASE),
    "if_unknown": re.compile(r"\bif (?:you )?(?:do not|don't) know\b|\bif unknown\b|\bdo not guess\b", re.IGNORECASE),
}
_LABEL = re.compile(
    r"^\s*(" + "|".join(re.escape(label) for _, label in sorted(SLOTS, key=lambda s: -len(s[1]))) + r")\s*:\s*(.*)$",
    re.IGNORECASE,
)

READ_VERBS = frozenset((
    "show", "get", "list", "read", "status", "check", "find", "search", "describe", "inspect", "query",
    "view", "diff", "verify", "stat", "lookup", "export", "tail", "watch", "probe", "test", "ping",
    "preview", "plan"
))
WRITE_VERBS = frozenset((
    "set", "create", "delete", "remove", "restart", "start", "stop", "reload", "update", "import",
    "add", "apply", "write", "put", "move", "rename", "copy", "send", "submit", "approve", "deny",
    "cancel", "reset", "enable", "disable", "install", "uninstall", "upgrade", "pull", "push", "fetch",
    "commit", "merge", "rebase", "clone", "tag", "grant", "revoke", "lock", "unlock", "kill", "refund",
    "pay", "charge", "book", "schedule", "post", "publish", "deploy", "rollback", "restore", "backup",
    "clear", "purge", "truncate", "upload", "download", "sync", "assign", "close", "open", "mark",
    "edit", "patch", "replace", "rotate", "renew", "register", "unregister", "mount", "unmount",
    "attach", "detach", "scale", "resize", "drain", "flush", "rebuild", "repair", "migrate", "archive",
    "unarchive", "hold", "release", "suspend", "resume", "trigger", "insert", "append", "erase", "wipe",
    "prune", "sign", "issue", "transfer"
))
# Verbs that name a task without reading or changing anything a caller cares about.
NEUTRAL_VERBS = frozenset((
    "echo", "sleep", "wait", "print", "render", "convert", "parse", "compute", "calculate", "resolve",
    "compare", "validate", "lint", "estimate", "explain", "summarize"
))
VAGUE_VERBS = frozenset((
    "do", "run", "exec", "execute", "process", "handle", "perform", "manage", "call", "invoke", "go"
))
VERBS = READ_VERBS | WRITE_VERBS | NEUTRAL_VERBS
# Input names that name a closed set more often than not.
_CLOSED_SET_NAMES = frozenset((
    "mode", "kind", "type", "state", "status", "level", "format", "unit", "action", "reason",
    "category", "priority", "severity", "direction", "order", "sort", "policy", "strategy", "scope"
))
_OPTIONS = re.compile(
    r"\bone of\b|\beither\b.+\bor\b|\b(?:values?|options?|choices?)\s*:|"
    r"'[^']+',\s*'[^']+'|\"[^\"]+\",\s*\"[^\"]+\"|`[^`]+`,\s*`[^`]+`|\b\w+ \| \w+",
    re.IGNORECASE,
)
# A pattern held to the whole value: ^ (or \A) first, $ (or \Z) last, optionally after inline flags.
_ANCHORED = re.compile(r"(\(\?[a-zA-Z]+\))?(\^|\\A).*(\$|\\Z)", re.DOTALL)
_PROSE_LENGTH = 64  # a string allowed this long is free text, whatever its name
_EXAMPLE_TEXT = re.compile(r"\bexample\b|\be\.g\.|\bfor instance\b|\blike\b", re.IGNORECASE)
_UNDO_TEXT = re.compile(
    r"\bundo|\bundone\b|revers|\bpermanent|\bcannot be\b|\bcan't be\b|\brestore|roll ?back", re.IGNORECASE
)
_REPEAT_TEXT = re.compile(
    r"\brepeat|\bretr(?:y|ies)\b|request_id|\bagain\b|idempot|\btwice\b|\bsame change\b", re.IGNORECASE
)
_CODE = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
_CODE_STYLE = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$")
_SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")
_NEIGHBOR = re.compile(r"\buse ([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b")
_STOP = frozenset((
    "a", "an", "the", "this", "that", "these", "those", "one", "some", "any", "of", "to", "for", "in",
    "on", "at", "by", "with", "from", "and", "or", "it", "its", "is", "are", "be", "tool", "function",
    "does", "do", "will", "can", "given", "specified", "thing", "things", "stuff", "data", "something"
))
_COMMIT_POINTS = ("spawn", "confirmation", "callback")
_RETRY = frozenset(get_args(Retry))
_NEXT_ACTIONS = frozenset(get_args(NextAction))


# --- entry points --------------------------------------------------------------------------


def lint(definitions: Iterable[ToolDefinition], known_tools: Iterable[str] | None = None) -> list[Finding]:
    """Every finding for the definitions and for the set, ranked (fix-first first).

    Args:
        definitions: the tools to check, as the daemon serves them.
        known_tools: every tool name that exists, when ``definitions`` is only a part
            (``--tools a,b``), so a settle read or a neighbour named in a description is
            not reported missing. Defaults to the names in ``definitions``.
    """
    defs = list(definitions)
    by_name = {d.name: d for d in defs}
    known = set(known_tools or ()) | set(by_name)
    findings: list[Finding] = []
    for d in defs:
        found = [
            *_check_name(d),
            *_check_description(d, known),
            *_check_schema(d),
            *_check_write(d, by_name, known),
            *_check_errors(d),
            *_check_output(d),
            *_check_size(d),
            *_check_placeholders(d),
            *_check_heading(d),
        ]
        waived = d.lint_waivers
        in_file = d.plugin == DECLARATIVE  # its author writes TOML: the fix in the tool file's words
        findings += [_in_tool_file(f) if in_file else f for f in found if f.code not in waived]
    findings += _check_set(defs)
    return sorted(findings, key=lambda f: (RANKS.index(f.rank), f.tool, f.code, f.message))


# The fixes whose Python words (Timing, Field, ErrorRule...) a tool file's author would have to
# translate, in the tool file's own keys; {tool} is the tool's name.
_TOOL_FILE_FIXES = {
    "timing.commit_point_invalid": 'set [tools.{tool}] commit_point = "spawn" or "confirmation"',
    "timing.deadline_invalid": "set [tools.{tool}] deadline_s to the longest a correct run takes, plus margin",
    "write.request_id_not_required": "every side_effect but read requires a request_id: check [tools.{tool}] "
                                     "side_effect",
    "write.settle_missing": '[tools.{tool}.verify] tool = "<system>_<object>_show" (a read of this file), with its '
                           'inputs = {{ <input> = "{{<input>}}" }} and expect, or a [tools.{tool}.settle] table',
    "input.undescribed": '[tools.{tool}.inputs.NAME] description = "<what it is>, <format or unit>": the model '
                         "reads nothing else about it",
    "input.no_example": '[tools.{tool}.inputs.NAME] example = "<one valid value>"',
    "input.untyped": '[tools.{tool}.inputs.NAME] type = "string" / "integer" / "boolean", or enum = [...] for a '
                     "closed set",
    "errors.timeout_blind_retry": "TIMEOUT is rungd's own: do not list it in [tools.{tool}.exit]; rungd answers "
                                  "retry after_check, next_action reconcile",
    "errors.timeout_missing": "rungd adds TIMEOUT to every tool file's tools; say in on_error what to do (settle "
                              "first, for a write)",
    "description.on_error_unknown_code": "add an [tools.{tool}.exit.STATUS] table with that code, or correct the "
                                         "code in on_error",
    "errors.surface_changed_missing": "SURFACE_CHANGED comes from a parse that fails: give [tools.{tool}.parse] a "
                                      "kind that checks the output (json, key_value, regex, columns), or list it in "
                                      '[tools.{tool}] errors = ["SURFACE_CHANGED"]',
    "errors.auth_required_missing": '[tools.{tool}] errors = ["AUTH_REQUIRED"] if it can ask (a password prompt, '
                                    "askpass, a token); if it never can, [tools.{tool}] lint_waivers = "
                                    '{{ "errors.auth_required_missing" = "<why>" }}',
    "heading.step_down_missing": '[tools.{tool}.heading] step_down = [{{ codes = ["SURFACE_CHANGED", '
                                 '"PROMPT_UNEXPECTED"], count = 3 }}] (a new heading table names its rung too: '
                                 'rung = 2 for a command-line or screen program)',
    "session.credential_undeclared": "name only credentials the tool uses ([tools.{tool}] credentials, "
                                     "credential_files, credential_prompt or askpass), or declare the one it needs",
}


def _in_tool_file(finding: Finding) -> Finding:
    """``finding`` with its fix in a tool file's keys, where its words are Python's."""
    fix = _TOOL_FILE_FIXES.get(finding.code)
    return dataclasses.replace(finding, fix=fix.format(tool=finding.tool)) if fix else finding


def lint_tool(tool: Tool, plugin: str = "", known_tools: Iterable[str] | None = None) -> list[Finding]:
    """``lint`` for one ``Tool`` declaration, through the definition the daemon would serve."""
    return lint([describe(tool, plugin)], known_tools)


def definitions_from_config(config: Config, refused: list[str] | None = None) -> list[ToolDefinition]:
    """The definitions a daemon started with ``config`` would serve, without starting one.

    For ``rungctl lint --config`` in CI: the same plugins, loaded the same way.

    Args:
        refused: given, what the daemon would leave out because its owner or modes are wrong
            (:mod:`rungd.system.trust`) is added to it; :func:`refused_findings` makes findings of it.

    Raises:
        PluginError: as ``Hooks.load`` and ``Hooks.collect_tools`` do.
        ConfigError: a plugin's own settings (``plugins.settings.NAME``) do not validate.
    """
    hooks = Hooks.load(config)
    tools = hooks.collect_tools(config)
    if refused is not None:
        refused.extend(hooks.refused)
    return [describe(reg.tool, reg.plugin) for reg in tools.values()]


def refused_findings(refused: Iterable[str]) -> list[Finding]:
    """A fix-first finding for each file the daemon would refuse by its owner or modes: the
    tools in it are missing from the set, which CI must not take for a clean lint."""
    return [Finding("(set)", "fix-first", "UNTRUSTED_FILE", problem,
                    "give it and every folder above it to root (or rungd's user), writable by no one else")
            for problem in refused]


def exit_status(findings: Iterable[Finding]) -> int:
    """1 when any finding is fix-first (CI fails), else 0."""
    return 1 if any(f.rank == "fix-first" for f in findings) else 0


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    totals = dict.fromkeys(RANKS, 0)
    for f in findings:
        totals[f.rank] += 1
    return totals


def format_json(findings: Iterable[Finding]) -> str:
    """``{"ok", "counts", "findings": [{tool, rank, code, message, fix}, ...]}``, indented."""
    findings = list(findings)
    return json.dumps(
        {"ok": exit_status(findings) == 0, "counts": counts(findings), "findings": [f.as_dict() for f in findings]},
        indent=2,
        ensure_ascii=False,
    )


def format_text(findings: Iterable[Finding], tools_checked: int | None = None) -> str:
    """Ranked, aligned lines for a person: rank, tool, code, message, then the fix below it."""
    findings = list(findings)
    lines = []
    if findings:
        tool_w = max(len(f.tool) for f in findings)
        code_w = max(len(f.code) for f in findings)
        indent = " " * (10 + 2 + tool_w + 2 + code_w + 2)
        for f in findings:
            lines.append(f"{f.rank:<10}  {f.tool:<{tool_w}}  {f.code:<{code_w}}  {f.message}")
            lines.append(f"{indent}fix: {f.fix}")
    summary = ", ".join(f"{n} {rank}" for rank, n in counts(findings).items()) if findings else "no findings"
    if tools_checked is not None:
        summary += f" in {tools_checked} tool{'s' if tools_checked != 1 else ''}"
    lines.append(summary)
    return "\n".join(lines)


# --- description ---------------------------------------------------------------------------


def parse_slots(description: str) -> dict[str, str | None]:
    """The six slots of a description: slot -> its text, ``""`` if only named, None if absent.

    rungd's form is one labelled line per slot (``Does: ...``), continuation lines joining
    the slot above. A description with no labels at all is read as prose (seed 002's
    repaired example): its first sentence is ``does`` and a slot counts as present when its
    phrase ("use when", "do not use", "returns", ...) occurs.
    """
    slots: dict[str, str | None] = {attr: None for attr, _ in SLOTS}
    label_to_attr = {label.lower(): attr for attr, label in SLOTS}
    current = None
    for line in description.splitlines():
        match = _LABEL.match(line)
        if match:
            current = label_to_attr[match.group(1).lower()]
            slots[current] = match.group(2).strip()
        elif current is not None and line.strip():
            slots[current] = f"{slots[current]} {line.strip()}".strip()
    if any(text is not None for text in slots.values()):
        return slots
    text = " ".join(description.split())
    if text:
        slots["does"] = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    for attr, phrase in _PROSE_SLOTS.items():
        if phrase.search(text):
            slots[attr] = ""
    return slots


def _check_description(d: ToolDefinition, known: set[str]) -> list[Finding]:
    out = []
    slots = parse_slots(d.description)
    labels = dict(SLOTS)
    labelled = any(_LABEL.match(line) for line in d.description.splitlines())
    for attr, text in slots.items():
        if text is None or (labelled and not text.strip()):
            missing = "is empty" if text is not None else "is missing"
            out.append(Finding(
                d.name, "fix-first" if attr == "does" else "should-fix", "description.slot_missing",
                f"the '{labels[attr]}' slot {missing}",
                _SLOT_FIX[attr],
            ))
    does = slots["does"] or ""
    if does and _restates(does, d.name):
        out.append(Finding(
            d.name, "fix-first", "description.restates_name",
            f"the description only restates the name: {does.strip()!r}",
            "say the task and what it changes, if anything, in words the name does not already give: "
            "which object, on which system, what comes back",
        ))
    if d.side_effect != "read" and does:
        if not _REPEAT_TEXT.search(d.description):
            out.append(Finding(
                d.name, "should-fix", "description.repeat_unstated",
                "a write whose description does not say what a repeat does",
                "add to 'Does': 'a repeat with the same request_id changes nothing more' (rungd guarantees it)",
            ))
        if not _UNDO_TEXT.search(d.description):
            out.append(Finding(
                d.name, "consider", "description.undo_unstated",
                "a write whose description does not say whether it can be undone",
                "add to 'Does' how to undo it (e.g. 'undone by setting the old value again') or that it is permanent",
            ))
    table = {str(e.get("code", "")) for e in d.errors}
    on_error = slots["on_error"] or ""
    for code in sorted(set(_CODE.findall(on_error)) - table - set(CORE_ERRORS)):
        out.append(Finding(
            d.name, "should-fix", "description.on_error_unknown_code",
            f"'On error' names {code}, which is not in the tool's error table",
            f"add an ErrorRule for {code} or correct the code in the description",
        ))
    own = sorted(c for c in table - set(CORE_ERRORS) if c)
    unnamed = [c for c in own if c not in on_error]
    if on_error and unnamed:
        out.append(Finding(
            d.name, "consider", "description.on_error_omits_code",
            f"'On error' does not mention the tool's own code{'s' if len(unnamed) > 1 else ''} {', '.join(unnamed)}",
            "name each of the tool's own codes with what to do next (retry or not, what to check)",
        ))
    returns = slots["returns"] or ""
    if returns and d.outputs and not any(re.search(rf"\b{re.escape(n)}\b", returns) for n in d.outputs):
        out.append(Finding(
            d.name, "consider", "description.returns_unnamed_fields",
            "'Returns' names none of the output fields",
            f"name the fields the next step needs: {', '.join(d.outputs)}",
        ))
    for neighbor in _NEIGHBOR.findall(slots["do_not_use_when"] or ""):
        if neighbor not in known:
            out.append(Finding(
                d.name, "should-fix", "description.neighbor_unknown",
                f"'Do not use when' points to {neighbor}, which is not a tool here",
                "point to the tool to use instead by its exact name",
            ))
    return out


_SLOT_FIX = {
    "does": "start with 'Does: <the task this tool performs and what it changes, if anything>'",
    "use_when": "add 'Use when: <the situations, in the words a user would use>'",
    "do_not_use_when": "add 'Do not use when: <the near-miss cases>; use <neighbor_tool> instead'",
    "returns": "add 'Returns: <the fields the next step needs, by name>'",
    "on_error": "add 'On error: <code> (<retry or not>; <what to do next>)' for the codes it can return",
    "if_unknown": "add 'If unknown: if you do not know <required value>, ask the user; do not guess'",
}


def name_words(name: str) -> list[str]:
    """The words of a tool name: snake_case, kebab-case, dotted and camelCase alike."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return [w.lower() for w in re.split(r"[_\-.\s]+", spaced) if w]


def _stem(word: str) -> str:
    word = word.lower()
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def _restates(does: str, name: str) -> bool:
    first = re.split(r"(?<=[.!?])\s", does.strip(), maxsplit=1)[0]
    words = {_stem(w) for w in re.findall(r"[A-Za-z]+", first) if w.lower() not in _STOP}
    return not (words - {_stem(w) for w in name_words(name)})


# --- name ----------------------------------------------------------------------------------


def _check_name(d: ToolDefinition) -> list[Finding]:
    out = []
    name = d.name
    if not PROVIDER_NAME.match(name):
        out.append(Finding(
            name, "fix-first", "name.invalid",
            "OpenAI and Anthropic refuse this name (letters, digits, _ and - only, at most 64)",
            "rename it <system>_<object>_<verb> in snake_case",
        ))
    if not _SNAKE.match(name):
        out.append(Finding(
            name, "should-fix", "name.not_snake_case",
            "the name is not snake_case",
            f"rename it <system>_<object>_<verb>, e.g. {'_'.join(name_words(name)) or 'legacy_item_show'}",
        ))
    words = name_words(name)
    if len(words) < 2:
        out.append(Finding(
            name, "should-fix", "name.too_short",
            "the name names an action but not the system or object it acts on",
            "rename it <system>_<object>_<verb>, e.g. inventory_item_show",
        ))
    elif len(words) > 4:
        out.append(Finding(
            name, "consider", "name.too_long",
            f"the name has {len(words)} parts; <system>_<object>_<verb> needs 3 (2-4)",
            "drop the words the description already carries",
        ))
    # The verb: the last one after the system part; in a two-part name also a leading one
    # (get_customer). In three parts or more the first is the system, even one like "test".
    verbs = [w for w in reversed(words[1:]) if w in VERBS]
    verbs += [w for w in words[:1] if w in VERBS and len(words) == 2]
    verb = verbs[0] if verbs else None
    vague = [w for w in words if w in VAGUE_VERBS]
    if vague:
        out.append(Finding(
            name, "should-fix", "name.vague_verb",
            f"'{vague[0]}' says nothing of the task",
            "name the task's own verb: show, set, restart, import, ...",
        ))
    elif not verbs and d.side_effect == "read":  # a write without a verb gets name.write_not_named
        out.append(Finding(
            name, "should-fix", "name.no_verb",
            "the name has no verb, so a model cannot tell what calling it does",
            "end the name with what it does: …_show, …_list, …_status",
        ))
    if verb is not None and words[-1] != verb:
        out.append(Finding(
            name, "consider", "name.verb_not_last",
            f"the verb '{verb}' is not last; rungd names are <system>_<object>_<verb>",
            "move the verb to the end so kin tools sort and read together",
        ))
    if d.side_effect != "read":
        if verb in READ_VERBS:
            out.append(Finding(
                name, "fix-first", "name.write_named_as_read",
                f"{_a(d.side_effect)} write named like a read ('{verb}')",
                "name it by the change it makes (…_set, …_restart, …_import); "
                "keep reads and writes separate tools",
            ))
        elif verb not in WRITE_VERBS:
            out.append(Finding(
                name, "should-fix", "name.write_not_named",
                f"{_a(d.side_effect)} write whose name does not say it changes something",
                "end the name with the change it makes: …_set, …_create, …_delete, …_restart, …_import",
            ))
    elif verb in WRITE_VERBS:
        out.append(Finding(
            name, "should-fix", "name.read_named_as_write",
            f"a read named like a write ('{verb}')",
            "name it by what it reads: …_show, …_list, …_status",
        ))
    return out


def _a(word: str) -> str:
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def _edit_distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _normal(name: str) -> str:
    return "".join(w[:-1] if w.endswith("s") and len(w) > 3 else w for w in name_words(name))


def too_close(a: str, b: str) -> bool:
    """Whether two tool names are close enough for a model to pick one for the other."""
    return (
        _edit_distance(a.lower(), b.lower()) <= 1
        or _normal(a) == _normal(b)
        or difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio() >= CLOSE_RATIO
    )


# --- input schema --------------------------------------------------------------------------


def _check_schema(d: ToolDefinition) -> list[Finding]:
    out = []
    schema = d.input_schema
    if schema.get("type") != "object":
        out.append(Finding(
            d.name, "fix-first", "schema.not_object",
            "the input schema is not an object; providers require type 'object' at the root",
            "declare the inputs as a ToolInputs subclass",
        ))
    properties = schema.get("properties") or {}
    if "required" not in schema:
        out.append(Finding(
            d.name, "should-fix", "schema.required_missing",
            "the schema has no 'required' list, so nothing is marked required",
            "list what the call needs in 'required' (a field without a default is required)",
        ))
    for name in schema.get("required", ()):
        if name not in properties:
            out.append(Finding(
                d.name, "fix-first", "schema.required_unknown",
                f"'{name}' is required but not a property; no call can be valid",
                f"declare {name} as an input or drop it from 'required'",
            ))
    if "request_id" in properties:
        out.append(Finding(
            d.name, "fix-first", "input.request_id_reserved",
            "an input is called request_id, the name rungd keeps for the idempotency key",
            "rename the input; the key travels beside the inputs and is added to exported schemas",
        ))
    out += _check_object(d, schema, schema, "")
    return out


def _check_object(d: ToolDefinition, node: Mapping[str, Any], root: Mapping[str, Any], path: str) -> list[Finding]:
    out = []
    where = f" at {path}" if path else ""
    if node.get("additionalProperties", True) is not False:
        out.append(Finding(
            d.name, "should-fix", "schema.open_object",
            f"the schema{where} allows properties it does not name",
            "set additionalProperties: false (ToolInputs does; nested models need extra='forbid')",
        ))
    required = set(node.get("required", ()))
    for name, prop in (node.get("properties") or {}).items():
        out += _check_property(d, f"{path}.{name}" if path else name, prop, root, name in required)
    return out


def _check_property(
    d: ToolDefinition, path: str, prop: Mapping[str, Any], root: Mapping[str, Any], required: bool
) -> list[Finding]:
    out = []
    resolved = _resolve(prop, root)
    description = str(prop.get("description") or resolved.get("description") or "").strip()
    kind = resolved.get("type")
    enum = "enum" in resolved or "const" in resolved
    typed = kind is not None or enum or any(k in resolved for k in ("anyOf", "oneOf", "allOf"))
    if not description:
        out.append(Finding(
            d.name, "should-fix", "input.undescribed", f"input '{path}' has no description",
            "Field(description='<what it is>, <format or unit>') — the model reads nothing else about it",
        ))
    elif len(description.split()) < 3:
        out.append(Finding(
            d.name, "consider", "input.description_thin", f"input '{path}' is described in {description!r} only",
            "say what it is, its format or unit, and where the value comes from",
        ))
    if not typed:
        out.append(Finding(
            d.name, "should-fix", "input.untyped", f"input '{path}' has no type",
            "give it a concrete type (str, int, a Literal for a closed set), not Any",
        ))
    has_example = bool(prop.get("examples") or resolved.get("examples") or "example" in prop) or bool(
        _EXAMPLE_TEXT.search(description)
    )
    if not has_example and not enum and kind != "boolean" and kind != "object":
        out.append(Finding(
            d.name, "should-fix", "input.no_example", f"input '{path}' has no example",
            "Field(examples=[<one valid value>])",
        ))
    leaf = path.rsplit(".", 1)[-1]
    if kind == "string" and not enum:
        # A name like mode or reason hints at a closed set, unless the field is room for prose.
        prose = resolved.get("maxLength", 0) >= _PROSE_LENGTH
        if (leaf.split("_")[-1] in _CLOSED_SET_NAMES and not prose) or _OPTIONS.search(description):
            out.append(Finding(
                d.name, "consider", "input.closed_set_not_enum",
                f"input '{path}' looks like a closed set but is a free string",
                "use a Literal[...] (an enum in the schema) so the model cannot invent a value",
            ))
        if not any(k in resolved for k in ("maxLength", "pattern", "format")):
            out.append(Finding(
                d.name, "consider", "input.unbounded", f"input '{path}' is a string with no length or pattern",
                "declare max_length or a pattern, so the model sees the limit the daemon enforces",
            ))
        pattern = resolved.get("pattern")
        if isinstance(pattern, str) and not _ANCHORED.fullmatch(pattern):
            # pydantic (and JSON Schema) search a pattern anywhere in the value: "[a-z]+" lets
            # "/etc/shadow" through on its letters. (Tool files are anchored by the loader.)
            out.append(Finding(
                d.name, "should-fix", "input.pattern_unanchored",
                f"input '{path}' has the pattern {pattern!r}, which a value only has to contain",
                "anchor it: pattern=r\"^...$\", so the whole value must match",
            ))
    if kind in ("integer", "number") and not enum:
        low = any(k in resolved for k in ("minimum", "exclusiveMinimum"))
        high = any(k in resolved for k in ("maximum", "exclusiveMaximum"))
        if not (low and high):
            out.append(Finding(
                d.name, "consider", "input.unbounded", f"input '{path}' is a number with no range",
                "declare ge= and le= with the values the program accepts",
            ))
    if kind == "array":
        items = _resolve(resolved.get("items") or {}, root)
        if not items or not (items.get("type") or "enum" in items or "anyOf" in items):
            out.append(Finding(
                d.name, "should-fix", "input.untyped", f"the items of input '{path}' have no type",
                "declare list[str] (or another concrete type), not list[Any]",
            ))
        elif items.get("type") == "object":
            out += _check_object(d, items, root, f"{path}[]")
    if kind == "object" and "properties" in resolved:
        out += _check_object(d, resolved, root, path)
    if not _SNAKE.match(leaf):
        out.append(Finding(
            d.name, "consider", "input.name_style", f"input '{path}' is not snake_case",
            "name inputs in snake_case, like the tool",
        ))
    return out


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if not (isinstance(ref, str) and ref.startswith("#/")):
        return node
    target: Any = root
    for part in ref[2:].split("/"):
        target = target.get(part, {}) if isinstance(target, Mapping) else {}
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}} if isinstance(target, Mapping) else node


# --- writes, errors, output, size ----------------------------------------------------------


def _check_write(d: ToolDefinition, by_name: Mapping[str, ToolDefinition], known: set[str]) -> list[Finding]:
    out = []
    if d.commit_point not in _COMMIT_POINTS:
        out.append(Finding(
            d.name, "fix-first", "timing.commit_point_invalid",
            f"commit point {d.commit_point!r} is not one of {', '.join(_COMMIT_POINTS)}",
            "declare Timing(commit_point='spawn' | 'confirmation' | 'callback')",
        ))
    if d.deadline_s <= 0:
        out.append(Finding(
            d.name, "fix-first", "timing.deadline_invalid", f"deadline {d.deadline_s:g} s is not positive",
            "declare Timing(deadline_s=...) with the longest a correct run takes, plus margin",
        ))
    elif d.deadline_s > DEADLINE_LONG_S:
        out.append(Finding(
            d.name, "consider", "timing.deadline_long", f"deadline {d.deadline_s:g} s holds the agent that long",
            "return pending sooner (the caller's wait_s) or split the work; a status read can follow it",
        ))
    if d.side_effect == "read":
        return out
    if not d.requires_request_id:
        out.append(Finding(
            d.name, "fix-first", "write.request_id_not_required",
            f"{_a(d.side_effect)} write that does not require a request_id; a retry could do it twice",
            "every class but read requires a request_id (Tool.requires_request_id)",
        ))
    settle = d.settle
    if not settle:
        out.append(Finding(
            d.name, "fix-first", "write.settle_missing",
            "a write without a settle read: after a timeout past its commit point nobody can tell "
            "whether it took effect",
            "declare Timing(settle=SettleSpec('<system>_<object>_show', {'<input>': '$<input>'})) naming a read",
        ))
        return out
    target = str(settle.get("tool", ""))
    bound = settle.get("inputs") or {}
    own_inputs = set(d.input_schema.get("properties") or {})
    for key, value in bound.items():
        if isinstance(value, str) and value.startswith("$") and value[1:] not in own_inputs:
            out.append(Finding(
                d.name, "should-fix", "write.settle_input_unbound",
                f"the settle read's input '{key}' refers to '{value}', which is not an input of this tool",
                f"bind it to one of {', '.join(sorted(own_inputs)) or 'the inputs'} ('$name') or a literal",
            ))
    if target not in known:
        out.append(Finding(
            d.name, "should-fix", "write.settle_unknown_tool",
            f"the settle read {target!r} is not a tool here",
            "name an existing read tool of the same plugin",
        ))
    elif target in by_name:
        settle_def = by_name[target]
        if settle_def.side_effect != "read":
            out.append(Finding(
                d.name, "fix-first", "write.settle_is_write",
                f"the settle read {target} is itself a {settle_def.side_effect} write",
                "settle with a read: it runs exactly when the outcome is unknown",
            ))
        needed = set(settle_def.input_schema.get("required", ())) - set(bound)
        if needed:
            out.append(Finding(
                d.name, "should-fix", "write.settle_inputs_incomplete",
                f"the settle read {target} needs {', '.join(sorted(needed))}, which the settle spec does not bind",
                "bind every required input of the settle read",
            ))
    expect = settle.get("expect") or {}
    if expect and not any(expectations.is_relative(value) for value in expect.values()):
        out.append(Finding(
            d.name, "consider", "write.read_cannot_tell_refusal",
            "its settle read expects a state alone: where that state already held, a program that refused "
            "and one that did the job both read as no_change",
            "add a field that must move (differs_from_before, before_plus: a serial, a modification time, a "
            "count) or read the act itself; rungctl check's 'already' fixture shows what the tool reports",
        ))
    return out


def _check_heading(d: ToolDefinition) -> list[Finding]:
    """The contract's heading: a write names the observation that steps it down (else nobody
    learns the wrapper stopped fitting its program until an agent complains), the session
    names only credentials the tool declares, and the codes it names are ones it returns."""
    out = []
    heading = d.heading or {}
    table = {str(row.get("code", "")) for row in d.errors} | set(CORE_ERRORS)
    if d.side_effect != "read" and not heading.get("step_down"):
        out.append(Finding(
            d.name, "should-fix", "heading.step_down_missing",
            f"{_a(d.side_effect)} write with no step-down observation: nothing tells an operator when its "
            "program's surface changes",
            "declare Heading(step_down=(StepDown(('SURFACE_CHANGED', 'PROMPT_UNEXPECTED'), count=3),)) or in a "
            "tool file [tools.NAME.heading] step_down = [{ codes = [\"SURFACE_CHANGED\"], count = 3 }]",
        ))
    for observation in heading.get("step_down") or ():
        for code in observation.get("codes") or ():
            if code not in table:
                out.append(Finding(
                    d.name, "should-fix", "heading.step_down_code_unknown",
                    f"the step-down observation names {code}, which the tool never returns: it cannot fire",
                    f"name a code of its error table ({', '.join(sorted(c for c in table if c)[:8])}, ...)",
                ))
    session = heading.get("session")
    if session:
        undeclared = sorted(set(session.get("credentials") or ()) - set(d.credentials))
        if undeclared:
            out.append(Finding(
                d.name, "should-fix", "session.credential_undeclared",
                f"the session names {', '.join(undeclared)}, which the tool does not declare "
                f"(it declares {', '.join(d.credentials) or 'none'})",
                "name only credentials the tool uses (Tool.credentials; in a tool file: credentials, "
                "credential_files, credential_prompt, askpass), or declare the one it needs",
            ))
        expiry = str(session.get("on_expiry") or "")
        if expiry not in table:
            out.append(Finding(
                d.name, "should-fix", "session.expiry_code_unknown",
                f"the session says expiry returns {expiry}, which is not in the tool's error table",
                "name the code a call returns when the credential expires, usually AUTH_REQUIRED",
            ))
    elif d.credentials and heading:
        out.append(Finding(
            d.name, "consider", "session.missing",
            f"the tool uses {', '.join(d.credentials)} but its heading names no session",
            "declare Session(provided_by='who signs in, where the credential lives', credentials=(...))",
        ))
    rung = heading.get("rung")
    if isinstance(rung, int):
        ruled = {r.get("rung") for r in heading.get("ruled_out") or ()}
        missing = [n for n in range(1, rung) if n not in ruled]
        if missing:
            out.append(Finding(
                d.name, "consider", "heading.ruled_out_incomplete",
                f"rung {rung}, but higher rung{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                "not ruled out",
                "for each higher rung, name the test it fails: present, unattended or readable back",
            ))
    return out


def _check_errors(d: ToolDefinition) -> list[Finding]:
    out = []
    seen: set[str] = set()
    for row in d.errors:
        code = str(row.get("code", ""))
        if code in seen:
            out.append(Finding(d.name, "should-fix", "errors.duplicate", f"{code} appears twice in the error table",
                               "keep one row per code"))
        seen.add(code)
        if not _CODE_STYLE.match(code):
            out.append(Finding(d.name, "consider", "errors.code_style", f"error code {code!r} is not UPPER_SNAKE_CASE",
                               "name codes like NOT_FOUND; callers branch on them"))
        if row.get("retry") not in _RETRY:
            out.append(Finding(d.name, "should-fix", "errors.retry_invalid",
                               f"{code}: retry {row.get('retry')!r} is not yes, no or after_check",
                               "say whether a retry can help: yes | no | after_check"))
        if row.get("next_action") not in _NEXT_ACTIONS:
            out.append(Finding(d.name, "should-fix", "errors.next_action_invalid",
                               f"{code}: next_action {row.get('next_action')!r} is not a rungd next action",
                               f"use one of {', '.join(sorted(_NEXT_ACTIONS))}"))
        if code not in CORE_ERRORS and not str(row.get("hint", "")).strip():
            out.append(Finding(d.name, "should-fix", "errors.hint_missing", f"{code} has no hint",
                               "the hint is what the model reads: what a correct call looks like or what to try next"))
        if code == "TIMEOUT" and d.side_effect != "read" and row.get("retry") == "yes":
            out.append(Finding(d.name, "fix-first", "errors.timeout_blind_retry",
                               "TIMEOUT on a write says retry=yes; a blind retry after a timeout can do it twice",
                               "use ErrorRule.core('TIMEOUT'): retry after_check, next_action reconcile"))
    if "TIMEOUT" not in seen:
        out.append(Finding(
            d.name, "should-fix", "errors.timeout_missing",
            "TIMEOUT is not in the error table, though every call has a deadline",
            "add ErrorRule.core('TIMEOUT') and say in 'On error' what to do (settle first, for a write)",
        ))
    if "SURFACE_CHANGED" not in seen and d.outputs:
        out.append(Finding(
            d.name, "should-fix", "errors.surface_changed_missing",
            "SURFACE_CHANGED is not in the error table, though the tool parses output into fields",
            "add ErrorRule.core('SURFACE_CHANGED') and raise it when the program's output stops parsing",
        ))
    if "AUTH_REQUIRED" not in seen:
        out.append(Finding(
            d.name, "consider", "errors.auth_required_missing",
            "AUTH_REQUIRED is not in the error table; the linter cannot see whether the program can ask for "
            "a credential",
            "add ErrorRule.core('AUTH_REQUIRED') if it can ask (a password prompt, askpass, a token); "
            "if it never can, waive errors.auth_required_missing with the reason",
        ))
    return out


def _check_output(d: ToolDefinition) -> list[Finding]:
    out = []
    if not d.outputs:
        out.append(Finding(
            d.name, "should-fix", "output.fields_undeclared", "no output fields are declared",
            "declare outputs={'field': 'what it holds'} for what the next step needs",
        ))
    for name, text in d.outputs.items():
        if not str(text).strip():
            out.append(Finding(d.name, "consider", "output.field_undescribed", f"output '{name}' is not described",
                               "say what the field holds and its unit"))
    cap = d.cap_bytes
    if cap <= 0:
        out.append(Finding(d.name, "fix-first", "output.cap_invalid", f"result cap {cap} bytes is not positive",
                           "declare cap_bytes, e.g. 1024 for a few fields"))
    elif cap < CAP_SMALL:
        out.append(Finding(d.name, "should-fix", "output.cap_small",
                           f"a result cap of {cap} bytes leaves no room for an error's message and hint",
                           f"declare cap_bytes of at least {CAP_SMALL}"))
    elif cap > CAP_SHOULD_FIX:
        out.append(Finding(d.name, "should-fix", "output.cap_large",
                           f"a result cap of {cap:,} bytes (~{cap // 4:,} tokens) stays in context on every later pass",
                           "return the slice the next step needs, with a filter or paging, under 16 KiB"))
    elif cap > CAP_CONSIDER:
        out.append(Finding(d.name, "consider", "output.cap_large",
                           f"a result cap of {cap:,} bytes (~{cap // 4:,} tokens) is large",
                           "return the slice the next step needs; leave the rest as evidence"))
    return out


# What `rungctl new-plugin` writes where only the author knows the answer.
PLACEHOLDERS = ("FILL IN", "FILL-IN")


def _check_placeholders(d: ToolDefinition) -> list[Finding]:
    # A scaffold left unfinished would hand a model "FILL IN" as its guidance.
    found = []
    for key in ("description", "input_schema", "outputs", "errors", "settle"):
        found += [f"{key}{where}" for where in _placeholder_keys(getattr(d, key))]
    return [Finding(
        d.name, "fix-first", "text.placeholder", f"{key} still holds the scaffold's FILL IN placeholder",
        "replace it with what the program really does; see plugins/README.md",
    ) for key in found]


def _placeholder_keys(value: Any, where: str = "") -> list[str]:
    if isinstance(value, Mapping):
        return [k for key, inner in value.items() for k in _placeholder_keys(inner, f"{where}.{key}")]
    if isinstance(value, (list, tuple)):
        return [k for i, inner in enumerate(value) for k in _placeholder_keys(inner, f"{where}[{i}]")]
    if isinstance(value, str) and any(mark in value for mark in PLACEHOLDERS):
        return [where]
    return []


def _check_size(d: ToolDefinition) -> list[Finding]:
    try:
        shape = to_anthropic(d)
    except ExportError:  # reported by the name and schema checks
        shape = {"name": d.name, "description": d.description, "input_schema": d.input_schema}
    text = compact_json(shape)
    size = len(text.encode("utf-8"))
    if size <= SIZE_CONSIDER:
        return []
    rank: Rank = "should-fix" if size > SIZE_SHOULD_FIX else "consider"
    return [Finding(
        d.name, rank, "size.large",
        f"the definition is {size:,} bytes (~{estimate_tokens(text):,} tokens), sent on every model pass",
        "shorten each slot to one or two sentences; move detail into input descriptions only where it "
        "prevents a wrong call",
    )]


def _check_set(defs: list[ToolDefinition]) -> list[Finding]:
    out = []
    names = [d.name for d in defs]
    for name in sorted({n for n in names if names.count(n) > 1}):
        out.append(Finding(name, "fix-first", "name.duplicate", f"two definitions are named {name}",
                           "give each tool its own name"))
    by_name = {d.name: d for d in defs}
    unique = sorted(by_name)
    for i, a in enumerate(unique):
        for b in unique[i + 1:]:
            if not too_close(a, b):
                continue
            told = b in by_name[a].description and a in by_name[b].description
            for this, other in ((a, b), (b, a)):
                out.append(Finding(
                    this, "consider" if told else "should-fix", "name.too_close",
                    f"the name is close to {other}; a model may call one for the other",
                    "merge the two, or rename one and state the boundary in both 'Do not use when' slots",
                ))
    if len(unique) > MAX_TOOLS:
        out.append(Finding(
            SET, "consider", "set.too_many_tools",
            f"{len(unique)} tools are offered at once; selection gets worse as the set grows",
            f"give each kind of task only the tools it needs (export --tools), fewer than {MAX_TOOLS + 1}",
        ))
    return out
