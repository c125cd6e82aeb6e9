"""The daemon as the unit runs it: its own unprivileged user, holding only the drop-in's
CAP_SETUID, CAP_SETGID and CAP_CHOWN (ambient), with no new privileges.

The attack replayed: a `user =` call's program runs an askpass script from a folder of /tmp
(it cannot open the daemon's sealed memfd). Every tool without `user =` runs as the daemon's
own user; if that folder or script were the daemon's, even for a moment, such a program could
rename a wrapper of its own over the script and be handed the other call's credential (it
did, when each call made its own folder and gave it to root afterwards). Here one such
program watches /tmp for every `.rungd-*` folder, those there before it too, while a
`user = "nobody"` call with an askpass credential runs, and tries to rename a wrapper over
each script, write into it and unlink it: every attempt must be refused and the credential
reach the real helper only.

The rest of the suite runs the daemon as root, because this checkout's interpreter lives
under /root where no other user can run it; this module installs rungd into a venv of
Debian's /usr/bin/python3 (as the README's install does), owned by root, and runs its
`rungd serve` through setpriv as the unit would. RUNGD_UNIT_SOURCE names the checkout to
install (default: this one), so the same test can be run against another version of the code.
"""

from __future__ import annotations

import concurrent.futures
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rungd.client import Client
from rungd.core.envelope import Envelope
from rungd.testing import STUB_DESCRIPTION
from tests.conftest import FAKES

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")
USER = "rungd-unit"
NOBODY = "nobody"
SECRET = "s3cret-pass"
CAPS = "+setuid,+setgid,+chown"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("useradd") is None,
    reason="needs root, setpriv and useradd to run the daemon as its own user with the drop-in's capabilities")

# The program of a tool without `user =`: it runs as the daemon's own user. For up to
# argv[2] seconds, or until the test drops a "done" file in argv[1], it watches /tmp for the
# private folders of `user =` calls (inotify, and a glob every 2 ms besides), as a real
# attacker would: the moment one appears it waits for the askpass script in it and tries to
# replace it: rename a wrapper over it, write into it, unlink it (stopping at the first that
# works). The wrapper runs the real helper (a copy kept in argv[1]) and writes what it was
# handed to argv[1]/stolen. It prints one line per folder found and one per attempt.
STEAL = """#!/usr/bin/python3 -I
import ctypes, glob, os, select, struct, sys, time

loot, budget = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + budget
lines = []
WRAPPER = '''#!/bin/sh
out=$(/usr/bin/python3 -I {orig} "$@")
rc=$?
printf '%s\\\\n' "$out" > {loot}/stolen
printf '%s\\\\n' "$out"
exit $rc
'''
libc = ctypes.CDLL(None, use_errno=True)
watch = libc.inotify_init1(0o4000 | 0o2000000)  # IN_NONBLOCK | IN_CLOEXEC
if watch >= 0 and libc.inotify_add_watch(watch, b"/tmp", 0x100 | 0x80) < 0:  # IN_CREATE | IN_MOVED_TO
    os.close(watch)
    watch = -1


def appeared():
    names = set()
    if watch >= 0:
        try:
            data = os.read(watch, 65536)
        except BlockingIOError:
            data = b""
        at = 0
        while at + 16 <= len(data):
            length = struct.unpack_from("iIII", data, at)[3]
            name = data[at + 16:at + 16 + length].split(b"\\0", 1)[0].decode(errors="replace")
            at += 16 + length
            if name.startswith(".rungd-"):
                names.add("/tmp/" + name)
    return names | set(glob.glob("/tmp/.rungd-*"))


def owner(path):
    try:
        return os.lstat(path).st_uid
    except OSError:
        return -1


def attempt(how, script, orig):
    evil = WRAPPER.format(orig=orig, loot=loot)
    if how == "rename":
        tmp = os.path.join(os.path.dirname(script), ".w-%d-%d" % (os.getpid(), len(lines)))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
        with os.fdopen(fd, "w") as f:
            f.write(evil)
        os.rename(tmp, script)
    elif how == "write":
        with open(script, "w") as f:
            f.write(evil)
    else:
        os.unlink(script)


seen = set()  # every folder, those made before it started too (the daemon's run-as folder)
with open(os.path.join(loot, "polling"), "w") as f:
    f.write(str(os.getpid()))
polls = 0
while time.monotonic() < deadline and not os.path.exists(os.path.join(loot, "done")):
    polls += 1
    for folder in sorted(appeared() - seen):
        seen.add(folder)
        script = os.path.join(folder, "askpass")
        until = time.monotonic() + 1
        while not os.path.lexists(script) and os.path.lexists(folder) and time.monotonic() < until:
            pass  # the script comes a moment after its folder
        lines.append("found %s (folder uid %d)" % (script, owner(folder)))
        orig = os.path.join(loot, "orig-%d.py" % len(lines))
        try:
            with open(script) as f:
                text = f.read()
            with open(orig, "w") as f:
                f.write(text)
        except OSError:
            pass
        for how in ("rename", "write", "unlink"):
            try:
                attempt(how, script, orig)
            except OSError as exc:
                lines.append("%s: %s" % (how, exc.strerror))
                continue
            lines.append("%s: replaced" % how)
            break
    if watch >= 0:
        select.select([watch], [], [], 0.002)
    else:
        time.sleep(0.002)
lines.append("polls %d uid %d inotify %s" % (polls, os.getuid(), watch >= 0))
print("\\n".join(lines))
"""


@dataclass
class Unit:
    venv: Path  # root's venv of /usr/bin/python3 with rungd installed
    user: str
    uid: int
    gid: int


def _tool(name: str, command: Path, argv: list[str], extra: str = "") -> str:
    words = ", ".join(f'"{word}"' for word in argv)
    return (f'[programs.{name}]\ncommand = "{command}"\n{extra}\n[tools.{name}]\nprogram = "{name}"\n'
            f'argv = [{words}]\ndeadline_s = 60\n[tools.{name}.description]\n{STUB_DESCRIPTION}'
            f'[tools.{name}.parse]\nkind = "lines"\n')


@pytest.fixture(scope="module")
def unit() -> Iterator[Unit]:
    """rungd installed into a root-owned venv of /usr/bin/python3, and the unit's system user."""
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"{SYSTEM_PYTHON} is missing: no interpreter the daemon's user can run")
    source = Path(os.environ.get("RUNGD_UNIT_SOURCE", ROOT))
    top = Path(tempfile.mkdtemp(prefix="rungd-unit-venv-"))
    try:
        top.chmod(0o755)  # rungd's own code: root's, in folders only root writes, reachable by all
        venv = top / "venv"
        made = subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", str(venv)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"{SYSTEM_PYTHON} cannot make a venv (Debian: apt-get install python3-venv): "
                        f"{made.stderr.strip()[-300:]}")
        installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(source)],
                                   capture_output=True, text=True, timeout=300)
        assert installed.returncode == 0, f"pip install {source} failed: {installed.stderr[-2000:]}"
        try:
            pwd.getpwnam(USER)
        except KeyError:
            subprocess.run(["useradd", "-r", "-U", "-M", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", USER],
                           check=True, capture_output=True)
        entry = pwd.getpwnam(USER)
        yield Unit(venv, USER, entry.pw_uid, entry.pw_gid)
    finally:
        shutil.rmtree(top, ignore_errors=True)


class UnitDaemon:
    """``rungd serve`` started the way the unit with the run-as drop-in starts it."""

    def __init__(self, unit: Unit, folder: Path, config: Path, socket: Path) -> None:
        self.unit, self.folder, self.config, self.socket = unit, folder, config, socket
        self.log = folder / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, caps: str = CAPS) -> None:
        """``caps``: the capabilities it holds; none for the unit without the run-as drop-in."""
        held = ([f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set=-all,{caps}"] if caps
                else ["--inh-caps=-all", "--bounding-set=-all"])
        with open(self.log, "wb") as output:
            self.proc = subprocess.Popen(
                ["env", "-i", "PATH=/usr/bin:/bin", f"HOME={self.folder / 'state'}",
                 "setpriv", f"--reuid={self.unit.user}", f"--regid={self.unit.user}", "--init-groups",
                 *held, "--no-new-privs",
                 str(self.unit.venv / "bin" / "rungd"), "serve", "--config", str(self.config)],
                stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            assert self.proc.poll() is None, f"the daemon exited at start: {self.log_tail()}"
            assert time.monotonic() < deadline, f"the daemon never listened: {self.log_tail()}"
            time.sleep(0.05)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _setup(unit: Unit, folder: Path) -> tuple[UnitDaemon, Path, Path]:
    """Config, tools, programs and credentials laid out as an install would: the daemon's
    inputs root's (or its own, for the state and the 0600 credentials), every folder above
    them writable by root alone. Returns the daemon (not started), the act file and the loot
    folder."""
    folder.chmod(0o755)
    programs = folder / "programs"
    programs.mkdir(mode=0o755)
    asker = programs / "askpass_asker"
    text = (FAKES / "askpass_asker").read_text().split("\n", 1)[1]
    asker.write_text("#!/usr/bin/python3\n" + text)
    asker.chmod(0o755)
    steal = programs / "steal"
    steal.write_text(STEAL)
    steal.chmod(0o755)

    acts = folder / "acts"  # the key tool's program (nobody) writes here; the thief cannot
    acts.mkdir(mode=0o755)
    os.chown(acts, pwd.getpwnam(NOBODY).pw_uid, -1)
    act = acts / "acted"
    loot = folder / "loot"  # the thief (the daemon's user) and its wrapper (nobody) write here
    loot.mkdir()
    loot.chmod(0o1777)  # sticky: a folder a tool names in its argv may be

    tools = (_tool("key_list_show", asker, ["--ask", "Passphrase:", "--act", str(act)], f'user = "{NOBODY}"\n')
             + '[[tools.key_list_show.askpass]]\npattern = "^Passphrase:"\ncredential = "deploy"\n\n'
             + _tool("steal_list_show", steal, [str(loot), "40"]))
    return _lay_out(unit, folder, tools), act, loot


def _lay_out(unit: Unit, folder: Path, tools_text: str) -> UnitDaemon:
    """The daemon's state, socket folder, credentials, tool file and config, as an install
    lays them out (the state and credentials its own, the rest root's); not started."""
    state = folder / "state"
    state.mkdir(mode=0o700)
    os.chown(state, unit.uid, unit.gid)
    run = folder / "run"
    run.mkdir(mode=0o755)
    os.chown(run, unit.uid, unit.gid)
    creds = folder / "credentials.toml"
    creds.write_text(f'deploy = "{SECRET}"\n')
    creds.chmod(0o600)
    os.chown(creds, unit.uid, unit.gid)
    tools = folder / "tools"
    tools.mkdir(mode=0o755)
    (tools / "unit.toml").write_text(tools_text)
    socket = run / "rungd.sock"
    config = folder / "rungd.toml"
    config.write_text(f'[server]\nsocket = "{socket}"\nshutdown_grace_s = 2\n\n[state]\ndir = "{state}"\n\n'
                      '[access]\nuids = [0]  # the test calls as root, as a member of rungd-callers would\n\n'
                      f'[plugins]\ntool_dirs = ["{tools}"]\n\n[credentials]\nfile = "{creds}"\n')
    return UnitDaemon(unit, folder, config, socket)


# Asks for a secret on its terminal as `user = "nobody"`: a process the daemon (another user,
# without CAP_SYS_PTRACE) may not look into, so no syscall says it reads; its echo does.
UNSEEN_ASKER = """#!/usr/bin/python3 -I
import os, termios
tty = os.open("/dev/tty", os.O_RDWR)
attrs = termios.tcgetattr(tty)
attrs[3] &= ~termios.ECHO
termios.tcsetattr(tty, termios.TCSANOW, attrs)
os.write(tty, b"Token for the release vault: ")
os.read(tty, 100)
"""


def _call_one(unit: Unit, name: str, program: str, extra: str = "", caps: str = CAPS) -> tuple[Envelope, str]:
    """Run the daemon as the unit does (holding ``caps``) with one tool, ``name``, whose
    program is the script ``program`` (a line of TOML ``extra`` beside it); call it once.

    Returns:
        Its envelope, and the daemon's log.
    """
    folder = Path(tempfile.mkdtemp(prefix="rungd-unit-"))
    try:
        folder.chmod(0o755)
        programs = folder / "programs"
        programs.mkdir(mode=0o755)
        script = programs / name
        script.write_text(program)
        script.chmod(0o755)
        daemon = _lay_out(unit, folder, _tool(name, script, [], extra))
        daemon.start(caps)
        try:
            with Client(daemon.socket, timeout=90) as client:
                return client.call(name, {}, wait_s=60), daemon.log_tail()
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_secret_asked_by_a_process_the_daemon_may_not_look_into_is_seen_by_the_terminals_echo(unit: Unit) -> None:
    env, log = _call_one(unit, "vault_token_show", UNSEEN_ASKER, f'user = "{NOBODY}"\n')
    assert env.error is not None and env.error.code == "AUTH_REQUIRED", (env, log)
    assert env.fields["question"] == "Token for the release vault:" and env.fields["echo"] == "off"
    assert env.elapsed_ms < 20_000, env  # seen, not a wait for its 60 s deadline


def test_a_program_run_as_the_daemons_user_cannot_reach_into_the_daemon(unit: Unit) -> None:
    # Without the run-as drop-in the daemon holds no capability, so only its being
    # undumpable keeps a program of its own user out of /proc/<daemon>/fd: another call's
    # stdin to write answers into, its output to read, a launcher's pipe to forge a start's
    # verdict in (tests/fakes/daemon_peeker).
    peeker = "#!/usr/bin/python3 -I\n" + (FAKES / "daemon_peeker").read_text().split("\n", 1)[1]
    env, log = _call_one(unit, "peeker_fds_show", peeker, caps="")
    assert env.status == "ok", (env.error, log[-800:])
    assert env.fields["lines"] == ["denied"], env.fields


def _wait_for(path: Path, seconds: float, what: str, daemon: UnitDaemon) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{what}: {daemon.log_tail()}"
        time.sleep(0.02)


def _private_folders() -> set[str]:
    return {path for path in os.listdir("/tmp") if path.startswith(".rungd-")}


def test_a_program_run_as_the_daemons_user_cannot_swap_a_user_calls_askpass_helper(unit: Unit) -> None:
    folder = Path(tempfile.mkdtemp(prefix="rungd-unit-"))
    before = _private_folders()
    try:
        key, steal, act, loot = _race(unit, folder)
        assert steal.status == "ok", steal.error
        lines = steal.fields["lines"]
        stolen = loot / "stolen"
        assert key.status == "ok", (key.error, lines)
        acted = act.read_text() if act.exists() else None
        assert acted == f"secret length {len(SECRET)}\n", (acted, lines)  # the real helper answered
        # A "found ... (folder uid <the daemon's>)" line means the thief reached the folder
        # before it was given away, and could replace what was in it.
        assert not stolen.exists() or SECRET not in stolen.read_text(), f"the thief's wrapper was handed the secret: {lines}"
        assert SECRET not in repr(steal.fields) and SECRET not in repr(key.fields)
        assert lines[-1].startswith("polls ") and f" uid {unit.uid} " in lines[-1], lines  # the daemon's user
        # The race really happened: the thief found the call's folder while the call ran...
        found = [number for number, line in enumerate(lines) if line.startswith("found /tmp/.rungd-")]
        assert found, f"the steal tool never saw the key tool's private folder: {lines}"
        # ...and the file system refused every way of replacing the script, in every folder
        # of this daemon it found (another rungd on the host may have left folders of its
        # own in /tmp, which are not this test's to judge).
        found = [number for number in found if lines[number].split()[1].split("/")[2] not in before]
        assert found, f"the steal tool never saw this daemon's folder: {lines}"
        for number in found:
            tries = lines[number + 1:number + 4]
            assert [line.split(":")[0] for line in tries] == ["rename", "write", "unlink"], lines
            assert all(line.endswith(("Permission denied", "Operation not permitted")) for line in tries), lines
        assert not stolen.exists(), lines
        assert not {name for name in _private_folders() - before
                    if os.lstat(f"/tmp/{name}").st_uid in (0, unit.uid)}, "the private folder was left in /tmp"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _race(unit: Unit, folder: Path) -> tuple[Envelope, Envelope, Path, Path]:
    """Start the thief, and once it watches, the `user =` call: both envelopes, the act file
    and the loot folder. The daemon is stopped before this returns, whatever happened."""
    daemon, act, loot = _setup(unit, folder)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        daemon.start()
        with Client(daemon.socket, timeout=90) as client:
            tools = {summary.name for summary in client.list_tools()}
        assert {"key_list_show", "steal_list_show"} <= tools, daemon.log_tail()

        def steal_call() -> Envelope:
            with Client(daemon.socket, timeout=90) as thief:
                return thief.call("steal_list_show", {}, wait_s=60)

        stealing = pool.submit(steal_call)
        _wait_for(loot / "polling", 30, "the steal tool never started polling", daemon)
        time.sleep(0.3)  # a hundred polls in before the call it waits for starts
        with Client(daemon.socket, timeout=90) as client:
            key = client.call("key_list_show", {}, wait_s=60)
        (loot / "done").write_text("")
        return key, stealing.result(timeout=90), act, loot
    finally:
        (loot / "done").write_text("")  # the thief stops at once, whatever failed
        daemon.stop()
        pool.shutdown(wait=True, cancel_futures=True)
