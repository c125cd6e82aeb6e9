"""What a plugin hands the runner and what it gets back: the program, its declared questions,
and the finished result."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rungd.runner.limits import Limits

if TYPE_CHECKING:
    from rungd.runner.screen import Screen


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """A question the tool knows, and the answer the runner gives once the gate passed."""

    pattern: re.Pattern[str]
    answer: str
    times: int = 1


@dataclasses.dataclass(frozen=True)
class CredentialPrompt:
    """A credential question the tool declares, answered with the named credential.

    It is answered at most ``times`` in one call: asked once more, the credential was most
    likely rejected, and sending it again only risks a lockout (sudo tries three times).
    """

    pattern: re.Pattern[str]
    credential: str
    times: int = 1


def credential_file_marker(name: str) -> str:
    """What stands in an argv word for the file that will hold the credential ``name``."""
    return "{credential_file:" + name + "}"


_MARKER = re.compile(r"\{credential_file:([A-Za-z0-9_.-]+)\}")


def credential_files_named(word: str) -> list[str]:
    """The credentials ``word`` names by :func:`credential_file_marker`, for tools that read
    a tool file's argv without building it (``rungctl check`` seeds each one)."""
    return _MARKER.findall(word)


EXAMPLE_BYTES = 16 * 1024


@dataclasses.dataclass(frozen=True)
class Program:
    """How to run the program for one call. ``argv`` is complete: no shell will see it."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    env_credentials: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # ENV_VAR -> credential name: the value goes into a 0600 in-memory file the child
    # inherits, and ENV_VAR names it as /dev/fd/N (PGPASSFILE, a --password-file argument...).
    file_credentials: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # argv index -> credential name, for programs that take a password or key file as an
    # option: ``argv[i]`` holds ``credential_file_marker(name)``, which the runner replaces by
    # the /dev/fd/N of a sealed in-memory file holding the credential. Declared by index, so a
    # caller's input that spells the marker is never replaced (only these words are).
    argv_file_credentials: Mapping[int, str] = dataclasses.field(default_factory=dict)
    # Paths the tool itself wrote into argv (a script, SQL or job file): trusted as the
    # program is (rungd.system.trust.check_operand), re-checked at each call before it starts.
    fixed_paths: tuple[str, ...] = ()
    stdin: Literal["none", "eof"] | bytes = "none"
    # With bytes: close stdin once they are sent. An end the tool declared (crontab -,
    # sqlite3, chpasswd read to end-of-file), never an implicit one.
    stdin_eof: bool = False
    # The account to run as (setgid, initgroups, setuid before exec; HOME, USER, LOGNAME set
    # for it). None: the daemon's own. The caller checks the daemon may switch to it.
    user: str | None = None
    confirmations: tuple[Confirmation, ...] = ()
    credential_prompts: tuple[CredentialPrompt, ...] = ()
    askpass: tuple[CredentialPrompt, ...] = ()
    limits: Limits | None = None
    cwd: Path | None = None
    keep_bytes: int = 64 * 1024
    evidence_bytes: int = 16 * 1024 * 1024
    quiet_s: float = 0.25
    grace_s: float = 1.0
    # False for a read a write makes before or after its act: starting it is no commit point.
    commits: bool = True
    # "line": the program's controlling terminal is a pseudo-terminal the daemon holds
    # (rungd.runner.terminal), while its stdio stay pipes: what it asks on /dev/tty is seen
    # whole, and answered only as declared. "none": it has no terminal at all (opening
    # /dev/tty fails, ENXIO), for a program that behaves worse with one.
    # "screen": a full-screen program, whose stdin, stdout and stderr are that terminal too,
    # driven through ``screen``'s steps (rungd.runner.screen).
    terminal: Literal["line", "none", "screen"] = "line"
    screen: Screen | None = None
    # What this program prints when it works, with this argv: never used by a real call.
    # ``rungctl check``'s and ``rungctl eval``'s stand-ins print it in the program's place, so
    # a handler that parses a read before its act reaches the act (the first EXAMPLE_BYTES).
    example_output: str | None = None

    def __post_init__(self) -> None:
        if (self.terminal == "screen") != (self.screen is not None):
            raise ValueError('terminal = "screen" and a screen (its steps) go together')


@dataclasses.dataclass
class Completed:
    """What a finished program left behind, already redacted."""

    exit_status: int
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    answered: list[str]
    evidence: list[str]
    # What it wrote on its terminal (a warning, a progress line: what it asked stops the call).
    terminal: str = ""
    # Which stream was cut to its kept head and tail: a flood on stderr leaves a small
    # stdout whole, and a parse of it honest.
    stdout_cut: bool = False
    stderr_cut: bool = False
    # The evidence holds less than the program printed (its cap, or a full disk): "the full
    # output is in evidence" would not be true.
    evidence_cut: bool = False
    # A screen program's: the screen it ended on (redacted), the fields its steps read, and
    # whether rungd stopped it after its last step (then its exit status is rungd's doing).
    screen: str = ""
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    stopped: bool = False
    shots: list[Any] = dataclasses.field(default_factory=list)  # screen.Shot, with Screen.snapshots

    @property
    def truncated(self) -> bool:
        """Either stream was cut to its kept head and tail."""
        return self.stdout_cut or self.stderr_cut

    def stderr_tail(self, chars: int = 400) -> str:
        """The end of stderr, at most about ``chars`` characters (:func:`tail`)."""
        return tail(self.stderr, chars)


def tail(text: str, chars: int) -> str:
    """The end of ``text`` in at most ``chars`` characters, beginning where a line begins (or,
    when its last line alone is longer, where a word does, after "…"): what a program said
    last, quoted without a word cut in two."""
    text = text.strip()
    if len(text) <= chars:
        return text
    end = text[-chars:]
    newline = end.find("\n")
    if newline >= 0 and end[newline + 1:].strip():
        return end[newline + 1:].strip()
    space = end.find(" ", 0, len(end) - 1)
    return "…" + (end[space + 1:] if space >= 0 else end[1:])
