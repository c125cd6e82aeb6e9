"""The programs of a tool file, and what each tool would really execute.

A tool file names one program in ``[program]`` and, when a write needs another program to
read its effect back (rm and stat, useradd and getent, crontab and crontab -l), more in
``[programs.NAME]``; a tool picks one with ``program = "NAME"``.

No shell, ever: that is judged by what the kernel would run, not by the first word. The
command's path is resolved and its symlinks followed (``/bin/sh`` may be busybox), and a
program that runs another program is looked into: exec wrappers (``nice``, ``env``,
``timeout``, ``xargs``...) are refused outright, since the only thing they add is a second
program a tool file can now name directly; ``sudo -u USER`` and ``runuser -u USER --`` are
accepted only with a literal target user, and the command they run is checked the same way;
options that make a program run a command (``find -exec``, ``tar --to-command``, ``man -P``,
``rsync -e``...) must name a literal program, which is checked too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import pwd
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from rungd.sdk import ConfigError, check_trusted, check_trusted_operand

from rungd_plugins.declarative.schema import ProgramSpec, ToolFile, ToolSpec
from rungd_plugins.declarative.templates import credential_files, placeholders

# Programs that read their arguments as code. The tool's inputs would become a script.
SHELLS = re.compile(r"(ba|rba|da|z|k|mk|pdk|c|tc|fi|a|ya|o|x)?sh|busybox|toybox|rc|es|elvish|nu|xonsh|oil")
INTERPRETERS = re.compile(
    r"(python|pypy|perl|ruby|php|lua|luajit|tclsh|wish|expect|guile|gawk|mawk|nawk|awk|node|nodejs|deno|bun"
    r"|Rscript|julia|pwsh|racket|sbcl|clisp|ocaml|ghci|runghc|jshell|groovy|scala|osascript"
    # Editors and macro languages whose scripts run shell commands (ed and ex "!", m4 syscmd, dc "!"),
    # make (a VAR=$(shell ...) argument runs it), and Python's pydoc and pdb (they run a file).
    r"|ed|ex|vi|vim|nvim|view|editor|m4|dc|make|gmake|bmake|pmake|pydoc|pdb)"
    # Distributions name them with a version or a flavour: perl5.36-x86_64-linux-gnu, vim.basic.
    r"([0-9.]*|[0-9]*[.-][A-Za-z0-9_.+-]*)")
# Programs whose own language runs commands, accepted only with the option that turns that
# off, whoever wrote the script (the tool file or an input): sed runs a shell for its "e"
# command and "s///e" and writes files for "w" (GNU sed's --sandbox refuses all three);
# sqlite3's shell runs commands for ".shell"/".system" and the SQL function edit(), reads and
# writes files for ".read"/".output"/".import", and loads extensions (-safe refuses them).
_SED_WHY = "runs shell commands and writes files from its script (the e and w commands, s///e)"
_SANDBOXED: dict[str, tuple[tuple[str, ...], str]] = {
    "sed": (("--sandbox",), _SED_WHY), "gsed": (("--sandbox",), _SED_WHY),
    "sqlite3": (("-safe", "--safe"), "runs shell commands from its input (.shell, .system, the SQL function "
                "edit()) and reads and writes any file (.read, .output, .import)"),
    # A screen tool's keys drive it: ^T runs a command (or the speller), ^R reads any file.
    **{name: (("--restricted", "-R"), "runs commands (^T Execute, its speller) and reads and writes any file "
              "it is told to") for name in ("nano", "pico")},
}
# Programs whose input is commands that reach a shell or any file, with no option that stops
# it: what they read on stdin, or from the options here, is that language, so no caller's
# input may become it. (Each with what its language can do, for the message.)
_SHELL_ESCAPE = "runs a shell (\\! or !)"
_COMMAND_CLIENTS: dict[str, tuple[tuple[str, ...], str]] = {
    "psql": (("-c", "--command"), _SHELL_ESCAPE), "mysql": (("-e", "--execute"), _SHELL_ESCAPE),
    "mariadb": (("-e", "--execute"), _SHELL_ESCAPE), "sftp": (("-b", "--batch"), _SHELL_ESCAPE),
    "ftp": ((), _SHELL_ESCAPE), "lftp": (("-c", "-e", "-f"), _SHELL_ESCAPE),
    "smbclient": (("-c", "--command"), _SHELL_ESCAPE),
    # Even with -safe: .trace FILE writes any file.
    "sqlite3": (("-cmd", "--cmd", "-init", "--init"), "writes any file (.trace) even with -safe"),
    # What they read is run later, by cron, atd or in another namespace.
    "crontab": ((), "installs commands cron runs"), "at": (("-f",), "queues commands atd runs"),
    "batch": (("-f",), "queues commands atd runs"), "ip": ((), "runs ip netns exec"),
    # Languages that read any file by name: a caller's text would print /etc/shadow back.
    **{name: ((), "reads any file it names (#include)") for name in (
        "cpp", "gcc", "cc", "c++", "g++", "clang", "clang++", "tcc", "c89", "c99")},
    "as": ((), "reads any file it names (.include, .incbin)"),
    **{name: ((), "reads any file it names (.so) and, unsafe, runs commands") for name in (
        "groff", "nroff", "troff", "tbl", "eqn", "pic", "soelim", "refer", "grog", "grap", "chem")},
    "patch": ((), "writes files and symlinks wherever the patch says"),
}
# Programs whose whole job is to run another program given on their command line.
EXEC_WRAPPERS = frozenset("""
    env nice ionice chrt taskset stdbuf timeout setsid nohup flock unbuffer script xargs parallel watch time
    strace ltrace nsenter unshare chroot setpriv capsh systemd-run prlimit numactl cgexec firejail bwrap
    fakeroot fakechroot doas pkexec su sg newgrp run-parts start-stop-daemon daemonize catchsegv valgrind gdb
    faketime torsocks proxychains proxychains4 eatmydata sshpass dbus-launch dbus-run-session xvfb-run runcon
    chpst softlimit setuidgid envdir envuidgid setlock sudoedit ssh-agent flatpak-spawn rlwrap tini dumb-init
    catatonit linux32 linux64 setarch uname26 busybox-static systemd-nspawn machinectl schroot
    logsave systemd-cat systemd-inhibit choom scriptlive ld.so
""".split())
# The dynamic loader runs the program named in its argv: ld-linux-x86-64.so.2 and the like.
_LOADER = re.compile(r"ld(-linux[\w.-]*|-musl[\w.-]*|-[0-9.]+|64)?\.so(\.[0-9]+)*")
# Accepted only with a literal target user; the command after their options is checked.
TARGET_WRAPPERS = {
    # option -> takes a value (True) or not; a refused option maps to a reason
    "sudo": ({"-u", "--user", "-g", "--group", "-h", "--host", "-p", "--prompt", "-C", "--close-from", "-D",
              "--chdir", "-R", "--chroot", "-T", "--command-timeout", "-U", "--other-user", "-r", "--role",
              "-t", "--type"},
             {"-s": "runs a shell", "--shell": "runs a shell", "-i": "runs a login shell",
              "--login": "runs a login shell", "-e": "runs an editor", "--edit": "runs an editor"}),
    "runuser": ({"-u", "--user", "-g", "--group", "-G", "--supp-group", "-w", "--whitelist-environment"},
                {"-c": "runs its command through a shell", "--command": "runs its command through a shell",
                 "-l": "runs a login shell", "--login": "runs a login shell", "-": "runs a login shell",
                 "-s": "runs a shell", "--shell": "runs a shell", "--session-command": "runs a shell"}),
}
# The options without a value each wrapper may carry; any other option is refused (an
# option this list does not know could take a value, or run something).
_PLAIN_FLAGS = {
    "sudo": {"-n", "--non-interactive", "-E", "--preserve-env", "-H", "--set-home", "-k", "--reset-timestamp",
             "-K", "--remove-timestamp", "-S", "--stdin", "-A", "--askpass", "-P", "--preserve-groups", "-b",
             "--background"},
    "runuser": {"-m", "-p", "--preserve-environment", "-f", "--fast", "-P", "--pty"},
}


def _long_option(word: str, known: Iterable[str]) -> str | None:
    """The long option ``word`` names, as GNU getopt reads it: exactly, or by a unique prefix."""
    name = word.partition("=")[0]
    matches = [option for option in known if option.startswith("--") and option.startswith(name)]
    return name if name in matches else (matches[0] if len(matches) == 1 else None)
_USER_OPTIONS = ("-u", "--user")
# Options that make a program run another one: the value (or, for find, the words up to
# ";" or "+") names the program, which must be literal and is checked like a command.
EXEC_OPTIONS: dict[str, tuple[str, ...]] = {
    "find": ("-exec", "-execdir", "-ok", "-okdir"),
    "tar": ("--to-command", "--use-compress-program", "-I", "--checkpoint-action", "--info-script", "-F",
            "--new-volume-script", "--rsh-command", "--rmt-command"),
    "rsync": ("-e", "--rsh", "--rsync-path"),
    "zip": ("-TT", "--unzip-command"),
    "man": ("-P", "--pager", "-H", "--html"),
    # (-c and --config-env are checked on their own: see _check_git_config.)
    "git": ("--upload-pack", "--receive-pack", "--exec", "--exec-path"),
    "ssh": ("-oProxyCommand", "-oLocalCommand", "-oKnownHostsCommand"),
    "scp": ("-S", "-oProxyCommand", "-oLocalCommand", "-oKnownHostsCommand"),
    "sftp": ("-S", "-D", "-oProxyCommand", "-oLocalCommand", "-oKnownHostsCommand"),
    "dpkg": ("--pre-invoke", "--post-invoke", "--status-logger"),
    "apt-get": ("-oDPkg::Pre-Invoke", "-oDPkg::Post-Invoke", "-oAPT::Update::Pre-Invoke"),
    "sort": ("--compress-program",),
    "split": ("--filter",),
    "wget": ("--use-askpass",),
    "gpg": ("--photo-viewer",),
    "tcpdump": ("-z",),
    "logrotate": ("-m", "--mail"),
}
# apt's -o/--option keys that run programs or choose them (hooks, the dpkg binary, methods).
_APT_RUNS = re.compile(r"(?i)[^=]*(invoke|install-pkgs|dir::bin|::hook|::script|::methods?\b|proxy-auto-detect"
                       r"|dpkg::path|^dir(::[^=]*)?$|^dir=)[^=]*(=.*)?")
_IP_BATCH = re.compile(r"--?b(a(t(ch?)?)?)?")
# tar's old-style first word (no dash): its letters are options, whose values follow in order.
_TAR_OLD_STYLE = re.compile(r"[A-Za-z]+")
_FIND_END = (";", "+", "\\;")
# Long options that are whole options of their own, though another begins with their name.
_WHOLE_OPTIONS = frozenset({"--checkpoint"})
_CAP_CHOWN, _CAP_SETGID, _CAP_SETUID = 0, 6, 7


@dataclasses.dataclass(frozen=True)
class Resolved:
    """One program of a tool file, resolved: what ``Program.argv[0]`` will be."""

    key: str  # "program" or "programs.NAME", for messages
    command: Path
    spec: ProgramSpec


def resolve_all(path: Path, file: ToolFile) -> dict[str | None, Resolved]:
    """Every program of the file, keyed by its name in ``[programs]`` (None for ``[program]``).

    Raises:
        ConfigError: no program at all, a ``[program]`` without a name, a command that is not
            an executable file, or one that is a shell, an interpreter or an exec wrapper.
    """
    found: dict[str | None, Resolved] = {}
    if file.program is not None:
        if file.program.name is None:
            raise ConfigError(f"{path}: key program.name: missing; e.g. name = \"accounts\"")
        found[None] = Resolved("program", resolve_command(path, "program.command", file.program.command),
                               file.program)
    for name, spec in file.programs.items():
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise ConfigError(f"{path}: key programs.{name}: program names are lower case, e.g. [programs.stat]")
        found[name] = Resolved(f"programs.{name}", resolve_command(path, f"programs.{name}.command", spec.command),
                               spec)
    if not found:
        raise ConfigError(f"{path}: key program: missing; a tool file names its program: "
                          "[program] name = \"...\" command = \"/usr/bin/...\" (or [programs.NAME] tables)")
    return found


def program_for(path: Path, key: str, spec: ToolSpec, programs: dict[str | None, Resolved]) -> Resolved:
    """The program a tool runs: its ``program`` key, else ``[program]``, else the only one.

    Raises:
        ConfigError: the name is not a ``[programs.NAME]`` of the file, or the file has several
            and the tool names none.
    """
    named = [n for n in programs if n is not None]
    if spec.program is not None:
        if spec.program not in programs:
            raise ConfigError(f"{path}: key {key}.program: {spec.program!r} is not a [programs.NAME] of this file "
                              f"({', '.join(named) or 'none'})")
        return programs[spec.program]
    if None in programs:
        return programs[None]
    if len(named) == 1:
        return programs[named[0]]
    raise ConfigError(f"{path}: key {key}.program: missing; this file has several programs "
                      f"({', '.join(named)}): name one, e.g. program = \"{named[0]}\"")


def resolve_command(path: Path, key: str, command: str) -> Path:
    """The executable ``command`` names, refused when it would run code from its arguments.

    Raises:
        ConfigError: ``<file>: key <key>: ...`` when it is not on PATH, not an executable file,
            or is a shell, an interpreter or an exec wrapper (itself or through symlinks).
        Untrusted: someone other than root or rungd's user could replace it (rungd.system.trust).
    """
    if "/" in command:
        resolved = Path(command) if os.path.isabs(command) else (path.parent / command).resolve()
    else:
        found = shutil.which(command)
        if found is None:
            raise ConfigError(f"{path}: key {key}: {command!r} is not on PATH; "
                              "hint: install it or give its absolute path, e.g. command = \"/usr/bin/df\"")
        resolved = Path(found)
    if not (resolved.is_file() and os.access(resolved, os.X_OK)):
        raise ConfigError(f"{path}: key {key}: {resolved} is not an executable file")
    problem = refused_program(resolved)
    if problem:
        raise ConfigError(f"{path}: key {key}: {problem}")
    check_trusted(resolved, "program")
    return resolved


def refused_program(command: Path) -> str | None:
    """Why ``command`` may never be a tool's program, judged by its name and by what its
    symlinks finally point at; None when it may be."""
    names = {command.name, Path(os.path.realpath(command)).name}
    for name in sorted(names):
        if SHELLS.fullmatch(name):
            return (f"{command} is (or links to) {name}, a shell or script interpreter; rungd never runs one, "
                    "since it would read inputs as code: wrap the program itself")
        if INTERPRETERS.fullmatch(name):
            return (f"{command} is (or links to) {name}, a shell or script interpreter (its arguments or input "
                    "can be code): wrap the program itself, or the script by its own path")
        if name in EXEC_WRAPPERS or _LOADER.fullmatch(name):
            return (f"{command} is (or links to) {name}, which runs another program: name that program "
                    "instead, in [programs.NAME] if the file already has one (nice/env/timeout-like wrappers "
                    "add nothing a tool file cannot say; run as another user with user = \"NAME\")")
    return None


# Programs that read a word without a dash as options: ps (BSD options: "e" shows every
# process's environment, credentials included). An input there must be a number or an enum.
_BARE_OPTIONS = {"ps": "reads a word without a dash as BSD options (ps e prints environments)"}
# sqlite3's options that take a value (the word after them is no SQL).
_SQLITE_VALUED = frozenset("-cmd --cmd -init --init -separator --separator -newline --newline -nullvalue "
                           "--nullvalue -lookaside --lookaside -maxsize --maxsize -mmap --mmap -pagecache "
                           "--pagecache -vfs --vfs -escape --escape".split())
# Programs for which an input's value is refused at call time when it holds a character that
# turns a name into something else (see refused_value).
_VALUE_RULES: dict[str, tuple[str, str]] = {
    # procps sysctl writes whenever a word holds '=', -w or not.
    "sysctl": ("=", "a word with '=' makes sysctl set that value"),
    # libpq takes a connection string wherever it takes a database name: the caller would
    # choose the server, and the tool's password would go to it.
    **{name: ("=", "a word with '=' is a connection string: it would choose the server the credentials go to")
       for name in ("psql", "pg_dump", "pg_dumpall", "pg_restore", "pg_isready", "createdb", "dropdb",
                    "vacuumdb", "reindexdb", "clusterdb", "createuser", "dropuser", "pg_basebackup")},
}


def refused_value(command: Path, value: str) -> str | None:
    """Why ``value`` may not reach ``command`` through an input, or None (checked per call)."""
    rule = _value_rule(command)
    if rule is not None and rule[0] in value:
        return rule[1]
    return None


@functools.lru_cache(maxsize=256)
def _value_rule(command: Path) -> tuple[str, str] | None:
    return _VALUE_RULES.get(command.name) or _VALUE_RULES.get(Path(os.path.realpath(command)).name)


def _check_operands(path: Path, key: str, command: Path, spec: ToolSpec) -> None:
    """Refuse inputs where the program reads a plain word as something else than data."""
    names = {command.name, Path(os.path.realpath(command)).name}
    argv = list(spec.argv)
    for name in sorted(names & set(_BARE_OPTIONS)):
        for i, word in enumerate(argv):
            loose = [ref for ref in placeholders(word) if ref in spec.inputs
                     and spec.inputs[ref].type != "integer" and not spec.inputs[ref].enum]
            if loose:
                raise ConfigError(f"{path}: key {key}.argv[{i}]: {name} {_BARE_OPTIONS[name]}: the input "
                                  f"{loose[0]!r} must be an integer or an enum here")
    if "sqlite3" in names:
        positional = 0
        skip = False
        for i, word in enumerate(argv):
            if skip:
                skip = False
                continue
            if word.startswith("-"):
                skip = word in _SQLITE_VALUED
                continue
            positional += 1
            # After the database, each word is SQL or a dot-command: one an input begins could be
            # ".trace FILE", which writes any file even under -safe.
            if positional > 1 and word.startswith("{") and placeholders(word):
                raise ConfigError(f"{path}: key {key}.argv[{i}]: {word!r}: a SQL word that begins with an input "
                                  "could be a dot-command (.trace FILE writes any file, even with -safe): "
                                  "write the SQL in argv and put the input inside it, held to a pattern")
            # Inside SQL, a free text input could close a quote and add its own statement.
            loose = [ref for ref in placeholders(word) if positional > 1 and _free_text(spec, ref)]
            if loose:
                raise ConfigError(f"{path}: key {key}.argv[{i}]: the input {loose[0]!r} sits inside SQL with no "
                                  "pattern or enum: a quote in it would end the string and add SQL of the "
                                  "caller's; give it a pattern with no quote (e.g. ^[A-Za-z0-9 .,-]{1,64}$)")
    for i, word in enumerate(argv):
        # A URL's scheme or host from an input: the caller would choose the server (or file://),
        # and what the tool sends it.
        scheme, separator, rest = word.partition("://")
        host = rest.split("/", 1)[0]
        loose = [ref for ref in placeholders(f"{scheme}/{host}") if separator and _free_text(spec, ref)]
        if loose:
            raise ConfigError(f"{path}: key {key}.argv[{i}]: {word!r}: the input {loose[0]!r} is in the URL's "
                              "scheme or host with no pattern or enum: the caller would choose the server (and "
                              "what the tool sends it, credentials included); hold it to an enum or a pattern")


def _check_credentialed(path: Path, key: str, program: Resolved, spec: ToolSpec) -> None:
    """A tool that holds credentials takes no free text in argv: ssh {host}, mysql -h {h},
    git ls-remote {url} or --server={s} would let the caller choose where they are sent."""
    if not (spec.credentials or spec.credential_files or spec.askpass or spec.credential_prompt
            or program.spec.credentials or any(credential_files(word) for word in spec.argv)):
        return
    for i, word in enumerate(spec.argv):
        loose = [ref for ref in placeholders(word) if _free_text(spec, ref)]
        if loose:
            raise ConfigError(f"{path}: key {key}.argv[{i}]: the tool holds credentials, and the input {loose[0]!r} "
                              "is free text: it could name the host, URL or server they are sent to; hold it to a "
                              "pattern or an enum")


def _free_text(spec: ToolSpec, name: str) -> bool:
    """Whether an input is free text: a string held to no enum and no pattern."""
    declared = spec.inputs.get(name)
    return declared is not None and declared.type == "string" and not declared.enum and not declared.pattern


def check_argv(path: Path, key: str, program: Resolved, spec: ToolSpec, *, user: str | None) -> None:
    """Refuse a tool whose argv would make its program run a command rungd cannot see.

    Args:
        user: the account the tool runs as (its own ``user`` or its program's), if any.

    Raises:
        ConfigError: naming the file and ``<key>.argv[i]``.
    """
    dashed = {name for name, inp in spec.inputs.items() if inp.allow_dash}
    _check_words(path, key, program.command, list(spec.argv), 0, dashed, spec.stdin_input)
    _check_operands(path, key, program.command, spec)
    _check_credentialed(path, key, program, spec)
    owners = _owners(user)
    for i, fixed in fixed_paths(spec.argv):
        check_trusted_operand(fixed, f"path in {path} key {key}.argv[{i}]", owners=owners)


def fixed_paths(argv: Iterable[object]) -> list[tuple[int, str]]:
    """The absolute paths a tool file writes into argv itself (``-f /etc/app/report.sql``,
    ``--script=/opt/jobs/nightly.job``), with their index: what its program reads there is
    the tool file's choice as much as its arguments are, so they are trusted as it is
    (:func:`rungd.sdk.check_trusted_operand`), at load and again at each call."""
    found = []
    for i, word in enumerate(argv):
        if not isinstance(word, str) or placeholders(word) or credential_files(word):
            continue
        value = word.partition("=")[2] if word.startswith("-") else word
        if value.startswith("/"):
            found.append((i, os.path.normpath(value)))
    return found


def _check_words(path: Path, key: str, command: Path, argv: list[str], offset: int, dashed: set[str],
                 stdin_input: str | None = None) -> None:
    def fail(i: int, problem: str) -> ConfigError:
        return ConfigError(f"{path}: key {key}.argv[{offset + i}]: {problem}")

    names = {command.name, Path(os.path.realpath(command)).name}
    wrapper = next((n for n in names if n in TARGET_WRAPPERS), None)
    if wrapper is not None:
        inner, start = _wrapped(argv, wrapper, fail)
        _check_words(path, key, inner, argv[start + 1:], offset + start + 1, dashed, stdin_input)
        return
    if names & {"ssh", "slogin"}:
        _check_ssh_command(argv, fail)
    if (client := next((n for n in sorted(names) if n in _COMMAND_CLIENTS), None)) is not None:
        _check_client(client, argv, stdin_input, fail, path, key)
    if (name := next((n for n in sorted(names) if n in _SANDBOXED), None)) is not None:
        options = argv[:argv.index("--")] if "--" in argv else argv
        sandbox, does = _SANDBOXED[name]
        if not set(sandbox) & set(options):
            raise fail(0, f"{name} {does} unless it is given {sandbox[0]}: add {sandbox[0]!r} to argv")
    if "git" in names:
        _check_git_config(argv, fail)
    if names & {"dialog", "Xdialog"}:
        for i, word in enumerate(argv):
            # --prgbox TEXT COMMAND HEIGHT WIDTH: dialog runs COMMAND through a shell.
            if word == "--prgbox" and any(placeholders(w) for w in argv[i + 1:i + 3]):
                raise fail(i, f"{word!r}: dialog runs the command after it through a shell: an input there "
                              "would be code; show the program's output another way")
    if "jq" in names:  # its first word that is no option (nor an option's value) is its program
        first = _jq_filter(argv)
        if first is not None and placeholders(argv[first]):
            raise fail(first, f"{argv[first]!r}: jq's filter is a language that reads the program's environment "
                              "($ENV) and files: an input there would be code: write the filter in argv and pass "
                              "values with --arg NAME {input}")
    if names & {"apt-get", "apt", "aptitude"}:
        for i, word in enumerate(argv):
            value = _option_value(word, argv, i, ("-o", "--option", "-c", "--config-file"))
            if value is not None and (placeholders(value[0]) or _APT_RUNS.fullmatch(value[0])):
                raise fail(value[1], f"{word!r} {value[0]!r}: apt configuration that is an input, or that names "
                                     "a program apt runs (hooks, the dpkg binary, methods), is refused")
    if "tar" in names and "--force-local" not in argv:
        for i, word in enumerate(argv):
            # HOST:FILE (a colon before any '/') is a remote archive: tar runs rsh to reach it.
            # Any word an input starts before its first '/' could be one (old-style f's value too).
            head = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
            if placeholders(head.split("/", 1)[0]):
                raise fail(i, f"{word!r}: an input before the first '/' could make an archive name HOST:FILE, "
                              "which tar reaches by running a remote shell: add '--force-local' to argv")
    if "tar" in names and argv and _TAR_OLD_STYLE.fullmatch(argv[0]) and set(argv[0]) & {"I", "F"}:
        raise fail(0, f"{argv[0]!r}: tar's old-style options name a program here (I, F); write them with "
                      "dashes so rungd can read which program")
    options = next((EXEC_OPTIONS[n] for n in names if n in EXEC_OPTIONS), ())
    if not options:
        return
    for i, word in enumerate(argv):
        if whole_dash := [ref for ref in placeholders(word) if ref in dashed]:
            raise fail(i, f"the input {whole_dash[0]!r} may start with '-' (allow_dash), and this program has "
                          f"options that run commands ({', '.join(options)}): an input could add one")
        value = _option_value(word, argv, i, options)
        if value is None:
            continue
        text, at = value
        if placeholders(text):
            raise fail(at, f"{word!r} runs a command, and the command would come from an input: name a literal "
                           "program")
        if command.name == "find" or Path(os.path.realpath(command)).name == "find":
            end = next((j for j in range(i + 1, len(argv)) if argv[j] in _FIND_END), None)
            if end is None:
                raise fail(i, f"{word} needs its command ended by \";\" or \"+\"")
            inner = _which(text, lambda p: fail(at, p))
            _check_words(path, key, inner, argv[i + 2:end], offset + i + 2, dashed)
        else:
            # The value is a program (man and git run it through a shell): its first word
            # must be a program rungd would accept, with nothing shell-like around it.
            if re.search(r"[;&|`$<>(){}\\'\"*?]", text):
                raise fail(at, f"{text!r} is run through a shell by this program: give one plain program name")
            _which(text.split()[0] if text.split() else text, lambda p: fail(at, p))


# jq's options that take values: how many words follow each.
_JQ_VALUED = {"--arg": 2, "--argjson": 2, "--slurpfile": 2, "--rawfile": 2, "--indent": 1, "-L": 1,
              "--library-path": 1, "-f": 1, "--from-file": 1}


def _jq_filter(argv: list[str]) -> int | None:
    """Where jq's filter sits in ``argv`` (None: it has none, or reads it from a file)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in ("-f", "--from-file"):
            return None  # the filter is that file: literal, checked as a path like any other word
        if word == "--":
            return i + 1 if i + 1 < len(argv) else None
        if not word.startswith("-"):
            return i
        i += 1 + _JQ_VALUED.get(word, 0)
    return None


# git -c keys a tool file may set: none of them runs a program (alias.*, core.pager,
# core.sshCommand, credential.helper with a value, diff/filter drivers... all can).
# Not safe.directory: it lets git use a repository another user owns, whose configuration
# (core.fsmonitor, hooks) runs programs.
_GIT_SAFE_CONFIG = re.compile(r"(user\.(name|email)|color\.[a-z.]+|core\.quotepath|advice\.[a-z.]+|"
                              r"init\.defaultbranch|log\.[a-z.]+|i18n\.[a-z.]+)", re.IGNORECASE)
# Options that choose the repository without git's check of its owner.
_GIT_REPOSITORY = ("--git-dir", "--work-tree")


def _check_git_config(argv: list[str], fail) -> None:  # type: ignore[no-untyped-def]
    """git -c sets any configuration, including what runs programs: only keys that run none
    (and an empty credential.helper, which turns helpers off) are let through, literally."""
    for i, word in enumerate(argv):
        if word.startswith("--config-env"):
            raise fail(i, "git --config-env sets configuration from the environment; set it with -c KEY=VALUE")
        if word == "-c" or (word.startswith("-c") and not word.startswith("--")):
            at, text = (i + 1, argv[i + 1] if i + 1 < len(argv) else "") if word == "-c" else (i, word[2:])
            key, _, value = text.partition("=")
            if placeholders(text):
                raise fail(at, f"git -c {text!r}: configuration is literal, never an input")
            if key.lower() == "credential.helper" and value == "":
                continue
            if not _GIT_SAFE_CONFIG.fullmatch(key):
                raise fail(at, f"git -c {key}: a configuration key that can make git run a program (aliases, "
                               "pagers, helpers, drivers) is refused; only user.*, color.*, advice.*, "
                               "core.quotepath, init.defaultBranch, log.*, i18n.* and an empty "
                               "credential.helper may be set")
        value = _option_value(word, argv, i, _GIT_REPOSITORY)
        if value is not None and placeholders(value[0]):
            raise fail(value[1], f"{word!r}: --git-dir and --work-tree skip git's check of who owns the "
                                 "repository (its configuration runs programs); an input may not choose them: "
                                 "use -C with a pattern on the input")


# ssh options that take a value (OpenSSH ssh(1)); the first other word is the host.
_SSH_VALUED = frozenset("-B -b -c -D -E -e -F -I -i -J -L -l -m -O -o -p -Q -R -S -W -w".split())


def _check_ssh_command(argv: list[str], fail) -> None:  # type: ignore[no-untyped-def]
    """Refuse an input among the words after ssh's host: they are the remote command, which
    the remote user's shell reads (an input "a;id" would run id there)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-"):
            break
        i += 2 if word in _SSH_VALUED else 1
    for j in range(i + 1, len(argv)):
        if placeholders(argv[j]):
            raise fail(j, f"{argv[j]!r}: the words after ssh's host are a command the remote shell reads; an "
                          "input there would be code: wrap the remote program with its own tool file there")


def _check_client(name: str, argv: list[str], stdin_input: str | None, fail, path: Path,  # type: ignore[no-untyped-def]
                  key: str) -> None:
    """Refuse a caller's input as a command client's script: on stdin, or in its command option."""
    options, does = _COMMAND_CLIENTS[name]
    if stdin_input is not None:
        raise ConfigError(
            f"{path}: key {key}.stdin_input: {name} reads commands on stdin, and its language {does}: the "
            f"input {stdin_input!r} would be that language; give {name} a fixed script file instead, with the "
            "inputs as its variables or arguments")
    for i, word in enumerate(argv):
        value = _option_value(word, argv, i, options)
        if value is not None and placeholders(value[0]):
            raise fail(value[1], f"{word!r}: what {name} reads here is its command language, which {does}; an "
                                 "input there would be code: give a fixed script file instead")
    if name == "crontab":  # crontab FILE installs that file: a caller's path would be a caller's table
        for i, word in enumerate(argv):
            if placeholders(word) and not word.startswith("-") and (i == 0 or argv[i - 1] != "-u"):
                raise fail(i, f"{word!r}: crontab installs the file it is given, and cron runs its commands; an "
                              "input may name the user (-u), never the table")
    if name == "ip":
        for i, word in enumerate(argv):
            # ip takes any unique prefix: -b, -ba, --batch read a file of commands; "e" is exec
            # (ip netns exec, ip vrf exec run another program).
            if _IP_BATCH.fullmatch(word):
                raise fail(i, f"{word!r}: ip -batch runs the commands of a file (ip netns exec among them): "
                              "give ip its command in argv")
            if word in ("e", "ex", "exe", "exec"):
                raise fail(i, f"{word!r}: ip ... exec runs another program: rungd cannot see what runs there")


def _option_value(word: str, argv: list[str], i: int, options: Iterable[str]) -> tuple[str, int] | None:
    """The value of an exec option at ``argv[i]`` and where it sits, or None if it is none.

    Read as the program's option parser reads it: GNU long options by any unique prefix
    (``--to-com=sh`` is ``--to-command``), short options bundled (``-xvIsh`` is ``-I sh``),
    and ``-o NAME VALUE`` with a space as well as an ``=``.
    """
    def after(value: str) -> tuple[str, int]:
        if value:
            return value, i
        return (argv[i + 1], i + 1) if i + 1 < len(argv) else ("", i)

    for option in options:
        if word == option:
            return after("")
        if option.startswith("--") and word.startswith("--"):
            name, eq, value = word.partition("=")
            if name in _WHOLE_OPTIONS:
                continue  # an option of its own that happens to begin another's name
            if len(name) > 3 and option.startswith(name):  # the option itself, or a prefix of it
                return after(value) if eq else after("")
        if option.startswith("-o") and word.startswith(option + "="):  # ssh -oProxyCommand=...
            return word[len(option) + 1:], i
        if option.startswith("-o") and word.lower().startswith(option.lower()):  # -oProxyCommand sh..
            return word[len(option):].lstrip("= "), i
        if len(option) == 2 and word.startswith("-") and not word.startswith("--") and option[1] in word[1:]:
            # A short option, alone or bundled: what follows it in the word, or the next word.
            return after(word[word.index(option[1], 1) + 1:])
    if word in ("-o",) and i + 1 < len(argv):  # ssh/apt-get -o NAME=VALUE (or NAME VALUE) as two words
        nxt = argv[i + 1]
        name = re.split(r"[=\s]", nxt, maxsplit=1)[0].lower()
        for option in options:
            if option.startswith("-o") and name == option[2:].lower():
                return re.split(r"[=\s]", nxt, maxsplit=1)[1] if re.search(r"[=\s]", nxt) else "", i + 1
    return None


def _wrapped(argv: list[str], wrapper: str, fail) -> tuple[Path, int]:  # type: ignore[no-untyped-def]
    """The program ``sudo``/``runuser`` would run, and its index in ``argv``."""
    with_value, refused = TARGET_WRAPPERS[wrapper]
    target = None
    i = 0
    while i < len(argv):
        word = argv[i]
        option, _, inline = word.partition("=")
        if word == "--":
            i += 1
            break
        if placeholders(word):
            raise fail(i, f"{word!r}: the options of {wrapper} and the program it runs are literal, never an input")
        if not word.startswith("-") or word == "-" and wrapper != "runuser":
            break
        known = {*with_value, *refused, *_PLAIN_FLAGS[wrapper]}
        if word.startswith("--"):
            # GNU getopt takes any unique prefix: --sh is --shell.
            option = _long_option(word, known) or ""
            if not option:
                raise fail(i, f"{wrapper} {word}: not an option rungd knows {wrapper} to take safely; "
                              f"use -u USER and plain flags ({', '.join(sorted(_PLAIN_FLAGS[wrapper]))})")
        if option in refused:
            raise fail(i, f"{wrapper} {word} {refused[option]}; rungd never runs one")
        if not word.startswith("--") and len(word) > 2:
            # Short flags bundled as getopt reads them: each is a flag until one takes a value,
            # which is the rest of the word (-nuroot is -n -u root) or the next word.
            for j, char in enumerate(word[1:], start=1):
                flag = f"-{char}"
                if flag in refused:
                    raise fail(i, f"{wrapper} {word} {refused[flag]}; rungd never runs one")
                if flag in with_value:
                    option, inline = flag, word[j + 1:]
                    break
                if flag not in _PLAIN_FLAGS[wrapper]:
                    raise fail(i, f"{wrapper} {word}: {flag} is not an option rungd knows {wrapper} to take safely")
            else:
                i += 1
                continue
        elif option not in known:
            raise fail(i, f"{wrapper} {word}: not an option rungd knows {wrapper} to take safely; "
                          f"use -u USER and plain flags ({', '.join(sorted(_PLAIN_FLAGS[wrapper]))})")
        if option in with_value:
            value = inline if inline else (argv[i + 1] if i + 1 < len(argv) else "")
            if placeholders(value):
                raise fail(i if inline else i + 1, f"{value!r}: {wrapper}'s {option} is literal, never an input: "
                                                    "the model would choose whom the program runs as")
            if option in _USER_OPTIONS:
                target = value
            i += 1 if inline else 2
            continue
        i += 1
    if not target:
        raise fail(0, f"{wrapper} needs a declared target user: {wrapper} -u USER -- PROGRAM ... "
                      "(or drop it and set user = \"USER\" on the tool)")
    if i >= len(argv):
        raise fail(len(argv) - 1 if argv else 0, f"{wrapper} runs no program here; name one after its options")
    if placeholders(argv[i]):
        raise fail(i, f"the program {wrapper} runs would come from an input; name it literally")
    return _which(argv[i], lambda p: fail(i, p)), i


def _which(name: str, fail) -> Path:  # type: ignore[no-untyped-def]
    found = name if "/" in name else shutil.which(name)
    if not found or not os.access(found, os.X_OK):
        raise fail(f"{name!r} is not an executable on PATH")
    problem = refused_program(Path(found))
    if problem:
        raise fail(problem)
    check_trusted(found, "program run by another program")
    return Path(found)


def check_user(path: Path, key: str, user: str) -> None:
    """Refuse ``user = "NAME"`` unless the account exists and the daemon can switch to it.

    Raises:
        ConfigError: no such account, or the daemon is neither root nor holds CAP_SETUID and
            CAP_SETGID (it could not start the program as that user).
    """
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise ConfigError(f"{path}: key {key}: no account {user!r} on this host; create it first "
                          "(useradd --system ...) or name an existing one") from None
    if os.geteuid() == 0:
        return
    if not all(_has_capability(bit) for bit in (_CAP_SETUID, _CAP_SETGID, _CAP_CHOWN)):
        raise ConfigError(f"{path}: key {key}: running a program as {user!r} needs rungd to run as root or "
                          "hold CAP_SETUID, CAP_SETGID and CAP_CHOWN (systemd drop-in: "
                          "CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_CHOWN and "
                          "AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_CHOWN); "
                          f"it runs as uid {os.geteuid()} without them")


def _has_capability(bit: int) -> bool:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except OSError:
        return False
    return False


# What a tool file may set in a program's environment, by what the variable names (the table
# in plugins/README.md says the same):
#
#   kind                            rule                                   examples
#   a file, folder or socket        a fixed absolute path (never an input)  HOME, GNUPGHOME, SSH_AUTH_SOCK,
#                                   that passes the ownership check, for    KRB5_CONFIG, KUBECONFIG, TMPDIR,
#                                   rungd or the tool's user                *_CONFIG, *_CONFIG_FILE, *_HOME
#   any value that is a path        the same (it names a path, whatever     MYAPP_DATA=/srv/app
#                                   the variable is called)
#   a program or code to run/load   refused: programs run them through      EDITOR, PAGER, *_COMMAND, LD_*,
#                                   sh -c, past every check of argv         PYTHONPATH, NODE_OPTIONS, *_OPTS
#   a terminal or rungd's own       refused: they send processes to a       DISPLAY, GPG_TTY, PATH, RUNGD_CALL,
#                                   terminal, or steer rungd's bookkeeping  *_ASKPASS
#   anything else                   a value, as written                     LANG, TZ, PGDATABASE
#
# Whoever owns a path chooses what a program finds there, so a path owned by root or rungd's
# user is as trusted as the tool file naming it: the check is the one tool files pass.
_ENV_REFUSED = frozenset({
    # Options read from the environment, which can hold an action to run (tar's
    # --checkpoint-action from TAR_OPTIONS), and commands by another name.
    "TAR_OPTIONS", "ZIPOPT", "UNZIP", "GZIP", "XZ_OPT", "ZSTD_CLEVEL", "MANOPT",
    "GIT_EXTERNAL_DIFF", "RSYNC_RSH", "RSYNC_CONNECT_PROG", "BROWSER", "SENDMAIL", "MAKEFLAGS", "MFLAGS",
    "MAKEFILES", "MAKELEVEL", "PERL5DB", "GCONV_PATH", "PATH", "LESSKEY", "LESSKEYIN",
    "PAGER", "GIT_PAGER", "MANPAGER", "SYSTEMD_PAGER", "LESSOPEN", "LESSCLOSE", "EDITOR", "VISUAL",
    "GIT_EDITOR", "GIT_SEQUENCE_EDITOR", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_ASKPASS", "SSH_ASKPASS",
    "SUDO_ASKPASS", "BASH_ENV", "ENV", "SHELL", "PROMPT_COMMAND", "PS4",
    "PYTHONSTARTUP", "PYTHONPATH", "PYTHONHOME", "PERL5OPT", "PERL5LIB", "PERLLIB", "RUBYOPT", "RUBYLIB",
    "NODE_OPTIONS", "NODE_PATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "IFS",
    # They send a program to a terminal or a desktop session, which rungd does not give it.
    "DISPLAY", "WAYLAND_DISPLAY", "GPG_TTY", "SSH_ASKPASS_REQUIRE", "DBUS_SESSION_BUS_ADDRESS",
})
# RUNGD_CALL is the call's tag (what finds its processes), RUNGD_ASKPASS* where its questions
# go; GIT_CONFIG_KEY_n / _VALUE_n set git settings inline (core.pager...).
_ENV_REFUSED_PREFIXES = ("LD_", "GIT_CONFIG_", "DYLD_", "RUNGD_CALL", "RUNGD_ASKPASS", "BASH_FUNC_", "PYTHON",
                         "PERL", "RUBY", "LESS", "GROFF_", "GLIBC_")
_ENV_REFUSED_SUFFIXES = ("COMMAND", "_PAGER", "_EDITOR", "_ASKPASS", "_SHELL", "_OPTIONS", "_OPTS", "_OPT",
                         "_PROG", "_PROGRAM", "_RSH", "_DIFF", "_PYTHON", "_PLUGINS", "_HOOK", "_HOOKS", "_CMD")
# Harmless names the prefixes above would catch.
_ENV_ALLOWED = frozenset({"PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE", "PYTHONUTF8",
                          "PYTHONHASHSEED"})
# Names whose value is a path (or a list of them, ':'-separated) to a file, folder or socket.
_ENV_PATHS = frozenset({
    "HOME", "TMPDIR", "GNUPGHOME", "SSH_AUTH_SOCK", "KRB5_CONFIG", "KRB5CCNAME", "KRB5_KTNAME",
    "KRB5_CLIENT_KTNAME", "KUBECONFIG", "WGETRC", "CURL_HOME", "NETRC", "PSQLRC", "PGSYSCONFDIR", "PGPASSFILE",
    "PGSERVICEFILE", "MYSQL_HOME", "ODBCINI", "ODBCSYSINI", "APT_CONFIG", "OPENSSL_CONF", "SSL_CERT_FILE",
    "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY", "GIT_CONFIG", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_TEMPLATE_DIR",
    "GIT_EXEC_PATH", "JAVA_HOME", "ZDOTDIR", "TERMINFO", "TERMINFO_DIRS", "LOCPATH", "NLSPATH", "HOSTALIASES",
    "RESOLV_HOST_CONF", "PASSWORD_STORE_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME",
    "XDG_STATE_HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_DIRS", "XDG_DATA_DIRS", "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
})
_ENV_PATH_SUFFIXES = ("CONFIG", "_CONFIG_FILE", "SYSCONFDIR", "_HOME", "_DIR", "_DIRS", "_FILE", "_SOCK",
                      "_SOCKET")
# A value naming a terminal device, alone or in a list (GPG_TTY=/dev/pts/3, FOO=/dev/tty).
_TERMINAL_DEVICE = re.compile(r"(^|[:=\s])/dev/(tty|pts/|console|ptmx|vcs|vc/)")
# KRB5CCNAME=FILE:/tmp/krb5cc_0: a type, then the path.
_TYPED_PATH = re.compile(r"^[A-Z]+:(?=/)")


def _env_kind(name: str) -> str:
    upper = name.upper()
    if upper in _ENV_ALLOWED:
        return "value"
    if upper in _ENV_PATHS:
        return "path"
    if upper in _ENV_REFUSED or upper.startswith(_ENV_REFUSED_PREFIXES) or upper.endswith(_ENV_REFUSED_SUFFIXES):
        return "refused"
    if upper.endswith(_ENV_PATH_SUFFIXES) or upper.startswith("XDG_"):
        return "path"
    return "value"


def check_env(path: Path, key: str, env: dict[str, str], *, user: str | None = None, values: bool = True) -> None:
    """Refuse environment a tool file sets that would run or load another program, or name a
    path someone other than root, rungd's user or the tool's ``user`` could write (the table
    above ``_ENV_REFUSED``).

    Args:
        env: variable -> value as the tool file sets it.
        user: the account the program runs as, whose own paths (its home, its agent socket)
            may be named too.
        values: False when the values are no paths (credential names, for ``credentials``).

    Raises:
        ConfigError: naming the file, the key, the variable and what to do instead.
        Untrusted: a path it names is not owned right (the file's tools are then refused).
    """
    for name, value in env.items():
        kind = _env_kind(name)
        if kind == "refused":
            raise ConfigError(
                f"{path}: key {key}.{name}: a tool file may not set {name}: it names a program to run, code to "
                "load, or a terminal, which no refusal of argv would see; hint: pass what the program needs as "
                "arguments, or wrap it in a Python plugin whose code a reviewer reads (plugins/README.md, "
                "'Environment', lists what may be set)"
            )
        if values and _TERMINAL_DEVICE.search(value):
            # Whatever the name: a terminal named to a program sends it, or a helper it starts
            # outside the call (a key agent's PIN entry), to a terminal that is not the call's.
            raise ConfigError(
                f"{path}: key {key}.{name}: {value!r} names a terminal; a tool file may not send a program to "
                "one: rungd gives each call's program a terminal of its own, which it reaches by /dev/tty; hint: "
                "leave the variable out (the program asks on its own terminal, where rungd sees the question)")
        if values and (kind == "path" or value.startswith("/")):
            _check_env_path(path, f"{key}.{name}", value, user)


def _owners(user: str | None) -> set[int]:
    """Who may own a path a tool fixes: root, rungd's user and the account the tool runs as."""
    owners = {0, os.geteuid()}
    if user is not None:
        with contextlib.suppress(KeyError):  # a missing account is check_user's to say
            owners.add(pwd.getpwnam(user).pw_uid)
    return owners


def _check_env_path(path: Path, key: str, value: str, user: str | None) -> None:
    """A path a variable names must be fixed, absolute and owned right (rungd.system.trust): whoever
    could write it would choose what the program reads there, as a tool file does."""
    owners = _owners(user)
    for part in value.split(":") if not _TYPED_PATH.match(value) else [_TYPED_PATH.sub("", value)]:
        if "{" in part or not part.startswith("/"):
            raise ConfigError(f"{path}: key {key}: {value!r} must be a fixed absolute path (never an input), "
                              "e.g. /var/lib/rungd/home; hint: a relative path depends on the folder the "
                              "program starts in")
        target = part
        while not os.path.lexists(target):  # made later (an agent's socket): judge its folder
            target = os.path.dirname(target)
        check_trusted(target, f"path set in {path} key {key}", owners=owners)
