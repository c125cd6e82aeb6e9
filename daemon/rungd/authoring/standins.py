"""Adverse stand-ins for a legacy program, as ``rungctl check`` uses them.

A stand-in is a small executable Python script, one per fixture, written into a throw-away
folder: it behaves the way the fixture says (hangs, floods, asks a question nobody declared,
prints a secret, acts and then dies, exits 0 having done nothing) for whatever argv it gets,
and a person can run it by hand. The role it plays (the write, or the read that verifies it)
comes from ``RUNGD_CHECK_ROLE`` in its environment, which the checked copy of the tool file
sets per tool; whether it has "acted" is a file beside it, so the read-back sees the change.

It also builds the text a stand-in prints so that a tool's parser accepts it:
``sample_text`` writes a string a regex (or a key/value, JSON or lines parser) reads back as
the wanted fields, so "the read-back shows the change" is a real read, not a shortcut.

    sample_text(parse, {"installed": "(none)"})  ->  "  Installed: (none)\\n  Candidate: x"
    write_standin(folder, "hang_after", script)   ->  folder / "hang_after"
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

try:  # Python 3.11 moved the regex parser; both names exist there, only _parser later.
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older Pythons
    import sre_parse  # type: ignore[no-redef]

ROLE_ENV = "RUNGD_CHECK_ROLE"
# The interpreter running rungd: a stand-in runs whatever PATH its tool gives it.
SHEBANG = (f"#!{sys.executable}\n" if sys.executable and not any(c.isspace() for c in sys.executable)
           else "#!/usr/bin/env python3\n")
# For a Python plugin's programs (rungd.authoring.plugin_check), set where the program is
# started: the question its first confirmation recognises, and the names (never the values)
# of the variables and files that carry its credentials.
CONFIRM_ENV = "RUNGD_CHECK_CONFIRM"
SECRET_VARS_ENV = "RUNGD_CHECK_SECRET_VARS"
SECRET_FILES_ENV = "RUNGD_CHECK_SECRET_FILES"
# What the program prints when it works (``Program.example_output``), printed in its place.
EXAMPLE_ENV = "RUNGD_CHECK_EXAMPLE"
QUESTION = "Enter the name of your first pet: "

# Characters tried, in order, when a pattern asks for "one character of this class".
_CANDIDATES = "x0a1Z_-./: \t"


class CannotSynthesize(ValueError):
    """No text was found that the tool's parser reads back as the wanted fields."""


def sample_text(parse: dict[str, Any], want: dict[str, Any]) -> str:
    """Text a tool's ``[parse]`` table turns into fields holding ``want`` (others: any value).

    Args:
        parse: the tool file's ``parse`` table as read (``kind``, ``pattern``, ``fields``,
            ``separator``); absent means kind ``none``.
        want: field name -> the value the parsed field must have.

    Returns:
        The text, ending in a newline.

    Raises:
        CannotSynthesize: the pattern has a construct this generator does not follow, or
            what it built does not parse back to ``want`` (checked, never assumed).
    """
    kind = parse.get("kind", "none")
    fields: dict[str, str] = parse.get("fields", {})
    values = {name: want.get(name, _typed_sample(kind_of)) for name, kind_of in fields.items()}
    if kind == "none":
        return "done\n"
    if kind == "lines":
        return "".join(f"{v}\n" for v in want.values()) or "line\n"
    if kind == "json":
        document: dict[str, Any] = {}
        for name, value in values.items():
            node = document
            *path, last = name.split(".")
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
        return json.dumps(document) + "\n"
    if kind == "key_value":
        separator = parse.get("separator", ":")
        return "".join(f"{name}{separator} {value}\n" for name, value in values.items())
    if kind == "columns":
        names = list(fields)
        return " ".join(names) + "\n" + " ".join(str(values[n]) for n in names) + "\n"
    pattern = parse.get("pattern")
    if kind != "regex" or not pattern:
        raise CannotSynthesize(f"parse kind {kind!r} without a pattern")
    text = _generate(pattern, {k: str(v) for k, v in want.items()})
    match = re.search(pattern, text, re.MULTILINE)
    if match is None or any(str(match.groupdict().get(k)) != str(v) for k, v in want.items()):
        raise CannotSynthesize(f"no text found that {pattern!r} reads as {want}")
    return text if text.endswith("\n") else text + "\n"


def confirmation_text(pattern: str) -> str:
    """A question (no trailing newline) that a ``confirm`` pattern recognises.

    Raises:
        CannotSynthesize: see ``sample_text``.
    """
    text = _generate(pattern, {})
    if re.search(pattern, text, re.MULTILINE) is None:
        raise CannotSynthesize(f"no question found that {pattern!r} recognises")
    return text.rstrip("\n")


def _typed_sample(kind: str) -> Any:
    return {"integer": 1, "number": 1.5, "boolean": "true"}.get(kind, "x")


def _generate(pattern: str, groups: dict[str, str]) -> str:
    try:
        parsed = sre_parse.parse(pattern, re.MULTILINE)
    except re.error as exc:
        raise CannotSynthesize(f"{pattern!r} does not compile: {exc}") from None
    names = {index: name for name, index in parsed.state.groupdict.items()}
    return "".join(_emit(parsed, names, groups))


def _emit(items: Any, names: dict[int, str], groups: dict[str, str]) -> list[str]:
    """The shortest text each node matches, a named group replaced by its wanted value."""
    out: list[str] = []
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name in ("NOT_LITERAL", "ANY", "IN", "CATEGORY"):
            out.append(_one_char(op, arg))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _high, inner = arg
            out.extend(_emit(inner, names, groups) * max(low, 0))
            if low == 0 and _needs_one(inner, names, groups):
                out.extend(_emit(inner, names, groups))
        elif name == "SUBPATTERN":
            group, _add, _del, inner = arg
            if group is not None and names.get(group) in groups:
                out.append(groups[names[group]])
            else:
                out.extend(_emit(inner, names, groups))
        elif name == "BRANCH":
            out.extend(_emit(arg[1][0], names, groups))
        elif name in ("AT", "ASSERT", "ASSERT_NOT"):
            continue  # anchors and lookarounds consume nothing; the final re.search checks
        elif name == "ATOMIC_GROUP":
            out.extend(_emit(arg, names, groups))
        else:
            raise CannotSynthesize(f"regex construct {name} is not followed")
    return out


def _needs_one(inner: Any, names: dict[int, str], groups: dict[str, str]) -> bool:
    # An optional part holding a wanted group must appear, or the group stays empty.
    for op, arg in inner:
        if str(op) == "SUBPATTERN" and arg[0] is not None and names.get(arg[0]) in groups:
            return True
    return False


def _one_char(op: Any, arg: Any) -> str:
    for ch in _CANDIDATES:
        if _single_matches([(op, arg)], ch):
            return ch
    raise CannotSynthesize("a character class no sample character fits")


def _single_matches(items: list[Any], ch: str) -> bool:
    code = ord(ch)
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            return code == arg
        if name == "NOT_LITERAL":
            return code != arg and ch != "\n"
        if name == "ANY":
            return ch != "\n"
        if name == "CATEGORY":
            return _category(str(arg), ch)
        if name == "IN":
            negate = any(str(o) == "NEGATE" for o, _ in arg)
            hit = any(_in_item(o, a, ch) for o, a in arg if str(o) != "NEGATE")
            # "[^:]" matches a newline too, but no sample line should hold one
            return (not hit and ch != "\n") if negate else hit
    return False


def _in_item(op: Any, arg: Any, ch: str) -> bool:
    name = str(op)
    if name == "LITERAL":
        return ord(ch) == arg
    if name == "RANGE":
        return arg[0] <= ord(ch) <= arg[1]
    if name == "CATEGORY":
        return _category(str(arg), ch)
    return False


def _category(name: str, ch: str) -> bool:
    checks = {
        "CATEGORY_DIGIT": ch.isdigit(), "CATEGORY_NOT_DIGIT": not ch.isdigit(),
        "CATEGORY_SPACE": ch.isspace(), "CATEGORY_NOT_SPACE": not ch.isspace(),
        "CATEGORY_WORD": ch.isalnum() or ch == "_", "CATEGORY_NOT_WORD": not (ch.isalnum() or ch == "_"),
    }
    return checks.get(name, False) and ch != "\n"


def pattern_text(pattern: str, first_group: str | None = None) -> str:
    """Text ``pattern`` finds, its first group holding ``first_group`` when given (a screen
    step's wait, or a field read off the screen by a pattern).

    Raises:
        CannotSynthesize: no such text was made (checked, never assumed).
    """
    try:
        parsed = sre_parse.parse(pattern, re.MULTILINE)
    except re.error as exc:
        raise CannotSynthesize(f"{pattern!r} does not compile: {exc}") from None
    names = {index: name for name, index in parsed.state.groupdict.items()}
    if first_group is not None and parsed.state.groups > 1:
        names.setdefault(1, "\0first")
    text = "".join(_emit(parsed, names, {} if first_group is None else {names.get(1, ""): first_group}))
    found = re.search(pattern, text)
    if found is None or (first_group is not None and (found.group(1) if found.re.groups else found.group(0)) != first_group):
        raise CannotSynthesize(f"no text was found that {pattern!r} reads as {first_group!r}")
    return text


# Cell attributes a wait may ask for, as the SGR codes that draw them.
_SGR = {"reverse": "7", "bold": "1", "underscore": "4", "italics": "3", "blink": "5"}
_COLOURS = ("black", "red", "green", "brown", "blue", "magenta", "cyan", "white")


def _sgr(attribute: str | None) -> str:
    if attribute is None:
        return ""
    if attribute[:3] in ("fg:", "bg:") and attribute[3:] in _COLOURS:
        return str((30 if attribute[:2] == "fg" else 40) + _COLOURS.index(attribute[3:]))
    return _SGR.get(attribute, "")


def _first_row(place: dict[str, Any], default: int = 1) -> int:
    if place.get("row") is not None:
        return int(place["row"])
    return int(place["rows"][0]) if place.get("rows") else default


def screen_frames(screen: dict[str, Any], values: dict[str, Any]) -> list[dict[str, Any]]:
    """What a stand-in draws for a screen tool's steps (its ``screen`` table as read): per step,
    the state its wait looks for and its read fields holding ``values``, whether it clears
    the screen first (a wait for something to go), and whether the step presses keys.

    Raises:
        CannotSynthesize: a pattern no text is made for.
    """
    frames = []
    for step in screen.get("steps", []):
        draw, clear = [], False
        wait = step.get("wait")
        if wait is not None:
            if wait.get("absent"):
                clear = True
            else:
                text = wait.get("text") or pattern_text(wait["pattern"])
                draw.append([_first_row(wait), wait.get("column", 1), text, _sgr(wait.get("attribute"))])
        for name, read in step.get("read", {}).items():
            value = values.get(name, _typed_sample(read.get("type", "string")))
            value = str(value).lower() if isinstance(value, bool) else str(value)
            text = pattern_text(read["pattern"], value) if read.get("pattern") else value
            draw.append([_first_row(read, 2), read.get("column", 0), text, ""])
        frames.append({"clear": clear, "draw": draw, "commit": bool(step.get("commit")),
                       "key": bool(step.get("type") is not None or step.get("credential") or step.get("keys"))})
    return frames


# --- the stand-in scripts -------------------------------------------------------------------

# What every stand-in shares: it notes each run (so a repeat that reruns the program is seen),
# knows its role, and reads the "acted" mark. Plain Python, no imports beyond the stdlib.
_PROLOGUE = '''\
import json, os, signal, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = json.loads({script!r})
ROLE = os.environ.get("{role_env}", "")
ACTED = HERE / "acted"
with open(HERE / "runs.log", "a", encoding="utf-8") as log:
    log.write(f"{{SCRIPT['fixture']}} {{ROLE}}\\n")
me = SCRIPT["roles"].get(ROLE, {{}})
EXAMPLE = os.environ.get("{example_env}", "")


def say(text):
    sys.stdout.write(text)
    sys.stdout.flush()


def hang():
    while True:  # ignores nothing: the daemon's kill at the deadline ends it
        time.sleep(60)


def confirm():
    # The program's own "are you sure": asked, then answered by the daemon (or not at all).
    question = me["confirm"] if "confirm" in me else os.environ.get("{confirm_env}")
    if question:
        say(question)
        if not sys.stdin.readline():
            sys.exit(1)


def named(key, env):
    return SCRIPT.get(key, []) + [name for name in os.environ.get(env, "").split(",") if name]


def read_role():
    if "screen" in me:  # a screen read: its steps' states, the fields as they now are
        play(me["screen"]["after" if ACTED.exists() else "before"])
        finish()
    say(me["after"] if ACTED.exists() else me["before"])
    sys.exit(0)


# A screen program: draws with plain escape sequences, reads keys one at a time.
def screen_mode():
    import termios, tty
    try:
        tty.setcbreak(0)
        attrs = termios.tcgetattr(0)
        attrs[3] &= ~termios.ECHO
        termios.tcsetattr(0, termios.TCSANOW, attrs)
    except termios.error:
        pass
    say("\x1b[2J\x1b[H")


def at(row, column, text, sgr=""):
    say(f"\x1b[{{row + 1}};{{column + 1}}H" + (f"\x1b[{{sgr}}m" if sgr else "") + text + "\x1b[m")


def key():
    # A step's text and keys come as one write; only what is queued with them now is
    # theirs. (A pause here swallowed the next step's key when its wait was already met,
    # an absent one, and the check then waited for a screen that never came.)
    got = os.read(0, 1024)
    import select
    while select.select([0], [], [], 0)[0]:
        if not os.read(0, 1024):
            break
    return got


def play(frames, upto=None):
    """Draw each step's screen; read its keys. upto: stop after the first key ("key") or the
    commit step's key ("commit")."""
    screen_mode()
    for frame in frames:
        if frame["clear"]:
            say("\x1b[2J")
        for row, column, text, sgr in frame["draw"]:
            at(row, column, text, sgr)
        if frame["key"]:
            key()
            if upto == "key" or (upto == "commit" and frame["commit"]):
                return True
    return upto == "commit"  # no commit step: its last key committed


def finish():
    if me["screen"].get("end") == "kill":
        while True:
            key()
    sys.exit(0)


def keys_forever():
    while True:
        if not key():
            time.sleep(60)


def secrets():
    for var in named("secret_env", "{secret_vars_env}"):
        value = os.environ.get(var, "")
        say(f"debug: token={{value}}\\n")
        sys.stderr.write(f"error: auth with {{value}} failed\\n")
    for var in named("secret_files", "{secret_files_env}"):
        try:
            value = Path(os.environ.get(var, "/nonexistent")).read_text()
        except OSError:
            continue
        say(f"debug: file token={{value}}\\n")
        sys.stderr.write(f"error: {{value}}\\n")
    sys.stderr.flush()

'''

# Per fixture: what the role under test does. A read role of a write (the verify tool) always
# answers truthfully from the "acted" mark, whatever the fixture.
BEHAVIOUR: dict[str, str] = {
    "hang": "hang()",
    "hang_before": "hang()",
    "hang_after": "confirm()\nACTED.touch()\nhang()",
    "question": f"say({QUESTION!r})\nsys.stdin.readline()\nsay(me.get('ok', ''))\nsys.exit(0)",
    "flood": "line = 'flood ' * 15 + '\\n'\nfor _ in range(80000):\n    sys.stdout.write(line)\nsys.stdout.flush()\n"
             "sys.exit(0)",
    "secret": "secrets()\nsys.exit(1)",
    "acts_dies": "confirm()\nACTED.touch()\nos.kill(os.getpid(), signal.SIGKILL)",
    "noop": "confirm()\nsay(me.get('ok', ''))\nsys.exit(0)",
    # Does nothing, like noop, but what the write aims at already held: a refusal and a
    # success the read-back cannot tell apart (write_standin makes the reads say so).
    "already": "confirm()\nsay(me.get('ok', ''))\nsys.exit(0)",
    "empty": "sys.exit(0)",
}


def _already(said: dict[str, Any]) -> dict[str, Any]:
    """A read role that shows, before the act too, what it shows after it."""
    if "before" not in said:
        return said
    said = {**said, "before": said["after"]}
    if "screen" in said:
        said["screen"] = {**said["screen"], "before": said["screen"]["after"]}
    return said


# Per fixture, for a screen tool: what the role under test draws and does.
SCREEN_BEHAVIOUR: dict[str, str] = {
    "hang": "hang()",
    "hang_before": "hang()",
    "hang_after": "play(me['screen']['frames'], upto='commit')\nACTED.touch()\nhang()",
    "never": "screen_mode()\nat(1, 1, 'rungd check: a screen none of the steps expects')\nkeys_forever()",
    "dialog": "play(me['screen']['frames'], upto='key')\nsay('\\x1b[2J')\n"
              "at(5, 5, 'rungd check: an extra dialog. The configuration changed. Continue? (y/n)')\nkeys_forever()",
    "dies": "play(me['screen']['frames'], upto='key')\nsys.exit(1)",
    "flood": "screen_mode()\nn = 0\nwhile True:\n    n += 1\n    at(n % 20, 0, f'redrawing {n} ' * 4)",
    "secret": "screen_mode()\nfor n, var in enumerate(SCRIPT.get('secret_env', [])):\n"
              "    at(n + 1, 1, f'debug: token={os.environ.get(var, \"\")}')\nkeys_forever()",
    "acts_dies": "play(me['screen']['frames'], upto='commit')\nACTED.touch()\nos.kill(os.getpid(), signal.SIGKILL)",
    "noop": "play(me['screen']['frames'])\nfinish()",
    "already": "play(me['screen']['frames'])\nfinish()",
}


def write_standin(folder: Path, fixture: str, script: dict[str, Any]) -> Path:
    """Write the stand-in for ``fixture`` as an executable file named after it.

    Args:
        folder: the throw-away folder; ``runs.log`` and the ``acted`` mark go beside it.
        fixture: a key of ``BEHAVIOUR``.
        script: ``{"fixture": name, "target": role under test, "roles": {role: {...}},
            "secret_env": [...], "secret_files": [...]}``; each role's dict holds ``before``,
            ``after``, ``ok`` (texts) and ``confirm`` (a question, or None).

    Returns:
        The script's path.
    """
    if fixture == "already":  # every read shows the state the write aims at, from the start
        script = {**script, "roles": {role: _already(said) for role, said in script["roles"].items()}}
    body = _prologue(script)
    body += "if ROLE != SCRIPT['target'] and 'before' in me:\n    read_role()\n"
    body += "if ROLE != SCRIPT['target']:\n    say(me.get('ok', ''))\n    sys.exit(0)\n"
    screen = "screen" in script["roles"].get(script["target"], {})
    body += (SCREEN_BEHAVIOUR if screen else BEHAVIOUR)[fixture] + "\n"
    path = folder / fixture
    path.write_text(SHEBANG + textwrap.dedent(body), encoding="utf-8")
    path.chmod(0o755)
    return path


def _prologue(script: dict[str, Any]) -> str:
    return _PROLOGUE.format(script=json.dumps(script), role_env=ROLE_ENV, confirm_env=CONFIRM_ENV,
                            secret_vars_env=SECRET_VARS_ENV, secret_files_env=SECRET_FILES_ENV,
                            example_env=EXAMPLE_ENV)


# A Python plugin's program, stood in for where it is started: its role is "act" (a program
# the plugin starts as its act, ``Program.commits``) or "read". A read that is not the
# fixture's target prints its ``example_output`` (nothing, when the plugin gave none: a
# fixture aimed at the act may then end at the reads before it), and nothing once the act
# has acted: what the reads show then is not known, and a state that did not move would be a
# lie a settle read believes. The fixtures that do not aim at the act play their part in every
# run, the first one included.
_READS_THEN = "if ROLE != 'act':\n    say('' if ACTED.exists() else EXAMPLE)\n    sys.exit(0)\nconfirm()\n"
PLUGIN_BEHAVIOUR: dict[str, str] = {
    "hang": "hang()",
    "hang_before": "hang()",
    "hang_after": _READS_THEN + "ACTED.touch()\nhang()",
    "question": f"say({QUESTION!r})\nsys.stdin.readline()\nsys.exit(0)",
    "flood": BEHAVIOUR["flood"],
    "secret": BEHAVIOUR["secret"],
    "acts_dies": _READS_THEN + "ACTED.touch()\nos.kill(os.getpid(), signal.SIGKILL)",
    # Does nothing and says what it says when it worked: the reads after show no change.
    "noop": _READS_THEN + "say(EXAMPLE)\nsys.exit(0)",
    # rungctl eval's dry run: does nothing, successfully, saying what the program says.
    "success": "if ROLE == 'act':\n    confirm()\n    ACTED.touch()\nsay(EXAMPLE)\nsys.exit(0)",
}


def write_plugin_standin(folder: Path, fixture: str) -> Path:
    """Write the stand-in for a Python plugin's programs under ``fixture`` (a key of
    ``PLUGIN_BEHAVIOUR``); ``runs.log`` beside it gets one line per run, ``FIXTURE ROLE``."""
    body = _prologue({"fixture": fixture, "target": "act", "roles": {}}) + PLUGIN_BEHAVIOUR[fixture] + "\n"
    path = folder / fixture
    path.write_text(SHEBANG + textwrap.dedent(body), encoding="utf-8")
    path.chmod(0o755)
    return path
