"""One launcher specification (issue 28): the Python launcher is the executable specification,
the compiled one must be indistinguishable from it.

Each launch request below goes through both launchers; the program it starts reports what it
sees of itself (descriptors, environment, folder, every resource limit, credentials and
capabilities, cgroup, session, process group, terminal, parent, signals, umask) and the two
reports must be equal. A request that cannot start must fail at the same step with the same
errno through both. Together the requests carry every field of the wire
(``rungd.runner.launcher.encode_start``): a compiled piece added later joins by being a
launcher here too.

Only values that differ from one run to the next are normalised, each where it is read: pids,
pipe inodes and the name of each run's call cgroup.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import resource
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from rungd.runner import launch
from rungd.runner import launcher as launcher_wire
from rungd.runner.limits import DEFAULT, Limits
from rungd.system import proctree

pytestmark = pytest.mark.skipif(
    launch.compiled_launcher() is None,
    reason="no compiled launcher in use here (none built from this launcher.c, or no C compiler at install): "
           "there is nothing to compare the Python launcher with")

# Run by the system interpreter: a program run as another user cannot run this test's
# interpreter (under /root). -I -S: nothing of the host's site or environment gets in.
PYTHON = "/usr/bin/python3"
LABEL_XATTR = launcher_wire.LABEL_XATTR.decode()

# What a started program sees of itself. Read before Python opens anything of its own where that
# matters (the descriptors); its own status lines are read again by /bin/cat (see STATUS_KEYS).
REPORTER = r"""
import errno, json, os, resource, select, sys

stdin_mode, passed = sys.argv[1], [int(fd) for fd in sys.argv[2].split(",") if fd]
listed = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
links = {}
for fd in listed:
    try:
        links[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        pass  # the listing's own descriptor, closed once listdir returned (nothing opened since)


def kind(link):
    if link.startswith("pipe:"):
        return "pipe"  # its inode differs from run to run: the kind is what is compared
    if link.startswith("socket:"):
        return "socket"
    if link.startswith("/memfd:"):
        return "memfd " + link[len("/memfd:"):]
    if link.startswith(("/dev/pts/", "/dev/tty", "/dev/ptmx")):
        return "tty " + link
    if link.startswith("anon_inode:"):
        return link
    return "file " + link


fds = {}
for fd, link in links.items():
    with open(f"/proc/self/fdinfo/{fd}") as file:
        flags = int(dict(line.split(":", 1) for line in file.read().splitlines() if ":" in line)["flags"], 8)
    fds[str(fd)] = {"kind": kind(link), "access": flags & 3, "cloexec": bool(flags & 0o2000000),
                    "isatty": os.isatty(fd)}

contents = {}
for fd in passed:
    what = fds.get(str(fd), {}).get("kind", "")
    if what == "pipe":
        contents[str(fd)] = os.read(fd, 13).decode("latin-1")
    elif what.startswith(("memfd", "file")):
        contents[str(fd)] = os.pread(fd, 64, 0).decode("latin-1")
        try:  # as a program given /dev/fd/N opens it: anew, as its own user
            with open(f"/dev/fd/{fd}", "rb") as file:
                contents[f"/dev/fd/{fd}"] = file.read(64).decode("latin-1")
        except OSError as exc:
            contents[f"/dev/fd/{fd}"] = errno.errorcode[exc.errno]

if stdin_mode == "read":
    data = b""
    while chunk := os.read(0, 65536):
        data += chunk
    stdin = data.decode("latin-1")
else:  # left open and empty: the program must not be blocked on it; what a poll says now
    stdin = "readable" if select.select([0], [], [], 0)[0] else "open, nothing to read"

with open("/proc/self/stat") as file:
    fields = file.read().rsplit(")", 1)[1].split()
pid = os.getpid()
try:
    os.close(os.open("/dev/tty", os.O_RDWR))
    tty = "opened"
except OSError as exc:
    tty = errno.errorcode[exc.errno]
with open("/proc/self/cgroup") as file:
    cgroup = [line.split(":", 2)[2] for line in file.read().splitlines() if line.startswith("0::")]
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
cwd = os.getcwd()
made = {}
for path in (cwd, os.path.dirname(cwd)):
    info = os.stat(path)
    made[path] = [oct(info.st_mode), info.st_uid, info.st_gid]
print(json.dumps({
    "cmdline": [arg.decode("latin-1") for arg in open("/proc/self/cmdline", "rb").read().split(b"\0")[:-1]],
    "exe": os.readlink("/proc/self/exe"),
    "environ": [pair.decode("latin-1") for pair in open("/proc/self/environ", "rb").read().split(b"\0")[:-1]],
    "cwd": cwd, "folders": made,
    "fds": fds, "passed": contents, "stdin": stdin,
    "rlimits": {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource)
                if name.startswith("RLIMIT_")},
    "ppid": os.getppid(), "sid_is_pid": os.getsid(0) == pid, "pgid_is_pid": os.getpgrp() == pid,
    # The controlling terminal's number differs per run (a new pseudo-terminal each): whether
    # there is one, and whether the program's group is its foreground group, are compared.
    "stat_session_is_pid": int(fields[3]) == pid, "has_tty": int(fields[4]) != 0,
    "tpgid": "its own group" if int(fields[5]) == pid else int(fields[5]), "dev_tty": tty,
    "cgroup": cgroup[0] if cgroup else None,
    # Python ignores SIGPIPE and SIGXFSZ itself as it starts: its SigIgn is not what it was given.
    "status": {key: value.strip() for key, value in status.items() if key in (
        "Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp",
        "Seccomp_filters", "SigBlk", "Umask")},
    "nice": os.getpriority(os.PRIO_PROCESS, 0),
    "oom_score_adj": open("/proc/self/oom_score_adj").read().strip(),
}, sort_keys=True))
"""

# /proc/self/status as the program was given it, read by a program that changes none of it as it
# starts (cat): the signal mask and dispositions, credentials, capabilities, umask.
STATUS_KEYS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
               "Seccomp", "Seccomp_filters", "SigBlk", "SigIgn", "SigCgt", "SigPnd", "Umask", "Cpus_allowed_list")

FDS = "<passed descriptors>"
PIPE_TEXT = b"through pipe\n"  # 13 bytes: the reporter reads exactly this many
SECRET = b"s3cret-credential"


@dataclasses.dataclass
class Request:
    """One launch request, as the daemon's runner makes them (``Launcher.spawn``'s arguments)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    limits: Limits | None = None
    user: tuple[int, int, list[int]] | None = None
    make_cwd: bool = False
    cgroup: bool = False
    label: str | None = None
    stdin: str | bytes = "eof"  # "eof": closed at once; "open": kept open, never written; bytes: sent, closed
    passed: tuple[str, ...] = ()  # descriptors passed (pass_fds): "memfd" (a credential), "pipe", "pty", "file"
    status_argv: list[str] | None = None  # how /bin/cat is named for the status read (a bare name: found on PATH)
    prepare: Callable[[], None] | None = None  # before each launcher's run: the same world for both
    terminal: str | None = None  # "pty": a terminal it makes its controlling one; "file": one that is no terminal


class Place:
    """The folder a case's files live in, readable by other users (the run-as cases)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rungd-diff-"))
        self.root.chmod(0o755)
        self.reporter = self.root / "reporter.py"
        self.reporter.write_text(REPORTER)
        self.reporter.chmod(0o644)
        self.data = self.root / "data"
        self.data.write_bytes(b"a file's bytes\n")
        self.data.chmod(0o644)
        (self.root / "private").mkdir(mode=0o700)
        (self.root / "noexec").mkdir(mode=0o755)
        (self.root / "noexec" / "true").write_text("#!/bin/sh\n")
        (self.root / "noexec" / "true").chmod(0o644)
        (self.root / "garbage").write_bytes(b"\x01\x02 not a program, no #! line\n")
        (self.root / "garbage").chmod(0o755)

    def report(self, stdin_mode: str, *, bare: bool = False) -> list[str]:
        """The reporter's argv; FDS stands for the passed descriptors' numbers (made per case)."""
        return ["python3" if bare else PYTHON, "-I", "-S", str(self.reporter), stdin_mode, FDS]

    def fresh_work(self) -> None:
        shutil.rmtree(self.root / "work", ignore_errors=True)

    def fresh_shared(self) -> None:
        """A sticky folder every account may make a folder in, as the daemon's run-as folder is."""
        self.fresh_work()
        (self.root / "work").mkdir(mode=0o755)
        (self.root / "work" / "shared").mkdir()
        (self.root / "work" / "shared").chmod(0o1733)


class Passed:
    """Descriptors handed to the program, made once per case so both launchers pass the very same
    numbers (a credential's memfd is put at 256 and up, as askpass_server does)."""

    def __init__(self, kinds: tuple[str, ...], place: Place, owner: tuple[int, int] | None) -> None:
        self.fds: list[int] = []
        self.kinds = kinds
        self._closing: list[int] = []
        self._pipe_w = -1
        for what in kinds:
            if what == "memfd":
                fd = os.memfd_create("rungd-diff", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
                os.write(fd, SECRET)
                os.fchmod(fd, 0o600)
                if owner is not None:
                    os.fchown(fd, *owner)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                            | fcntl.F_SEAL_WRITE)
            elif what == "pipe":
                fd, self._pipe_w = os.pipe2(os.O_CLOEXEC)
                self._closing.append(self._pipe_w)
            elif what == "pty":  # a terminal among its descriptors must not become its controlling one
                master, fd = os.openpty()
                self._closing.append(master)
            elif what == "file":
                fd = os.open(place.data, os.O_RDONLY | os.O_CLOEXEC)
            else:
                raise AssertionError(what)
            high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 256)
            os.close(fd)
            self.fds.append(high)

    def refill(self) -> None:
        if self._pipe_w >= 0:
            os.write(self._pipe_w, PIPE_TEXT)

    def close(self) -> None:
        for fd in self.fds + self._closing:
            os.close(fd)


@pytest.fixture(scope="module")
def launchers() -> Iterator[dict[str, launch.Launcher]]:
    """The specification (Python) and the compiled launcher, each a process of its own, kept for
    the module (a launcher serves many requests; so do these)."""
    both = {"python": launch.Launcher(None, compiled=False), "compiled": launch.Launcher(None, compiled=True)}
    # Started from a daemon in an unusual state, so what each launcher resets (the signal mask and
    # every disposition but SIGPIPE's) and what it passes on (the umask) is seen, not assumed:
    # a launcher that forgot either would pass this process's state on, and differ.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
    ignored = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGUSR2, signal.SIGHUP, signal.SIGXFSZ)}
    umask = os.umask(0o027)
    try:
        for launcher in both.values():
            launcher.start()
    finally:
        os.umask(umask)
        for sig, handler in ignored.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    yield both
    for launcher in both.values():
        launcher.close()


@pytest.fixture
def place() -> Iterator[Place]:
    made = Place()
    yield made
    shutil.rmtree(made.root, ignore_errors=True)


def _cgroup2_mount() -> Path | None:
    with open("/proc/self/mounts") as file:
        for line in file:
            parts = line.split()
            if parts[2] == "cgroup2":
                return Path(parts[1])
    return None


async def observe(launcher: launch.Launcher, request: Request, argv: list[str], passed: Passed,
                  feed: bool) -> dict[str, object]:
    """Start ``argv`` with every other part of ``request`` and say what came of it: the start's
    failure (errno name and step), or the exit status and what the program printed; with the
    cgroup's label and the program's cgroup relative to the call's."""
    cgroup = proctree.CallCgroup.spare() if request.cgroup else None
    if request.cgroup and cgroup is None:
        pytest.skip("no cgroup v2 hierarchy this process may make cgroups in")
    seen: dict[str, object] = {}
    terminal = -1
    held: list[int] = []
    if request.terminal == "pty":
        master, terminal = os.openpty()
        held = [master, terminal]
    elif request.terminal == "file":
        terminal = os.open(place_data(argv), os.O_RDONLY | os.O_CLOEXEC)
        held = [terminal]
    try:
        with trio.fail_after(30):
            try:
                started = await launcher.spawn(argv, request.env, request.cwd, request.limits, passed.fds,
                                               request.user, cgroup, make_cwd=request.make_cwd, label=request.label,
                                               terminal=terminal if terminal >= 0 else None)
            except launch.SpawnError as exc:  # refused by the daemon's side: nothing was sent
                return {"refused": (errno.errorcode[exc.errno], exc.filename)}
            child = started.child
            try:
                await started.exec_result()
            except launch.SpawnError as exc:
                seen["failed"] = (errno.errorcode[exc.errno], exc.filename)
            if isinstance(request.stdin, bytes) and feed and "failed" not in seen:
                await child.stdin.send_all(request.stdin)
            if request.stdin != "open":
                child.stdin.close()
            out = err = b""
            while chunk := await child.stdout.receive_some():
                out += chunk
            while chunk := await child.stderr.receive_some():
                err += chunk
            seen["status"] = await child.wait()
            child.close_pipes()
        seen["stderr"] = err.decode("utf-8", "replace")
        seen["stdout"] = out.decode("latin-1")
        if cgroup is not None:
            seen["label"] = await _label(cgroup)
            # The call cgroup is a new one each run (its leaf name differs): where the program was
            # is compared as its place relative to its call's cgroup.
            mount = _cgroup2_mount()
            assert mount is not None
            seen["call_cgroup"] = "/" + str(cgroup.path.relative_to(mount))
    finally:
        for fd in held:
            os.close(fd)
        if cgroup is not None and cgroup.path.exists():
            with trio.fail_after(10):
                await cgroup.remove_when_empty()
    return seen


def place_data(argv: list[str]) -> str:
    """A plain file to pass where a terminal belongs: the program itself, or the reporter."""
    return next((arg for arg in argv if arg.startswith("/") and os.path.isfile(arg)), "/etc/hostname")


async def _label(cgroup: proctree.CallCgroup) -> str | None:
    """The label the launcher wrote on the cgroup; it writes it just after the pid's line, so
    give it a moment."""
    for _ in range(100):
        try:
            return os.getxattr(cgroup.path, LABEL_XATTR).decode()
        except OSError:
            await trio.sleep(0.01)
    return None


def normalise(seen: dict[str, object]) -> dict[str, object]:
    """What differs per run taken out, each said why; the rest left exactly as it was."""
    seen = dict(seen)
    call_cgroup = seen.pop("call_cgroup", None)
    report = seen.get("stdout")
    if isinstance(report, str) and report.startswith("{"):
        found = json.loads(report)
        # The parent: a pid, per run; the relation is what a launcher decides (CLONE_PARENT: the
        # daemon, here this test process).
        found["ppid"] = "the daemon" if found["ppid"] == os.getpid() else f"another process ({found['ppid']})"
        # The cgroup: each run has its own call cgroup (its leaf name is new each time).
        if call_cgroup is not None and found["cgroup"] is not None:
            found["cgroup"] = found["cgroup"].replace(call_cgroup, "<the call's cgroup>")
        seen["stdout"] = found
    elif isinstance(report, str) and report.startswith("Name:"):
        status = dict(line.split(":", 1) for line in report.splitlines())
        # Pids, memory and counters differ per run; the rest of what the program was given is here.
        seen["stdout"] = {key: status[key].strip() for key in STATUS_KEYS if key in status}
    return seen


async def both(launchers: dict[str, launch.Launcher], request: Request, passed: Passed,
               argv: list[str], *, feed: bool = True) -> dict[str, dict[str, object]]:
    seen = {}
    for name, launcher in launchers.items():
        if request.prepare is not None:
            request.prepare()
        passed.refill()
        seen[name] = normalise(await observe(launcher, request, argv, passed, feed))
    return seen


def assert_same(seen: dict[str, dict[str, object]]) -> None:
    python, compiled = seen["python"], seen["compiled"]
    if python != compiled:
        parts = sorted(set(python) | set(compiled))
        differ = {}
        for part in parts:
            a, b = python.get(part), compiled.get(part)
            if isinstance(a, dict) and isinstance(b, dict):
                keys = sorted(set(a) | set(b))
                differ[part] = {key: {"python": a.get(key), "compiled": b.get(key)} for key in keys
                                if a.get(key) != b.get(key)}
            elif a != b:
                differ[part] = {"python": a, "compiled": b}
        pytest.fail(f"the launchers differ: {json.dumps(differ, indent=1, default=str)}")


def _can_run_as_others() -> bool:
    return os.getuid() == 0 and os.path.exists(PYTHON)


def _others_groups() -> list[int]:
    """nobody's own groups, and one more (adm, 4) so the list has more than one."""
    try:
        groups = os.getgrouplist("nobody", 65534)
    except KeyError:
        groups = [65534]
    return sorted(set(groups) | {4})


def _highest(which: int) -> int:
    """The highest value a limit may be set to without CAP_SYS_RESOURCE (which a container may
    not give root): the hard limit the launchers inherit from this process."""
    return resource.getrlimit(which)[1]


NOBODY = (65534, 65534)
_PATH = "/usr/bin:/bin"

# Every success case is (what it exercises, how to make its request from its place).
SUCCESS: dict[str, Callable[[Place], Request]] = {
    # The least a request can say: no PATH at all (cat is found on the launcher's default path).
    "bare": lambda p: Request(argv=p.report("read"), env={}, cwd="/", status_argv=["cat", "/proc/self/status"]),
    # Every field at once, as root: a bare program name looked up on the request's PATH, an
    # environment of awkward strings, a folder the launcher makes (nested, trailing slash), stdin
    # bytes, four kinds of passed descriptor above the soft limit it sets, every limit, a cgroup
    # and its label.
    "everything": lambda p: Request(
        argv=p.report("read", bare=True) + ["ä", "\udcff", "", "a b"],
        env={"PATH": f"/nonexistent:{_PATH}", "LANG": "C.UTF-8", "EMPTY": "", "EQ": "a=b=c", "RAW": "\udcff\udcfe",
             "SPACE": " x ", "=LEADING": "equals"},
        cwd=str(p.root / "work" / "made" / "deep") + "/", make_cwd=True,
        limits=Limits(cpu_s=30, address_space_bytes=4 << 30, open_files=200, processes=4096,
                      file_size_bytes=1 << 20, core_bytes=0, no_new_privs=True),
        cgroup=True, label="c-diff-everything", stdin=b"line one\nline two\n\x00\xff\n",
        passed=("memfd", "pipe", "pty", "file"), status_argv=["cat", "/proc/self/status"], prepare=p.fresh_work),
    # Run as another user and groups, a credential memfd it owns, stdin left open, a cgroup.
    "as nobody": lambda p: Request(
        argv=p.report("open"), env={"PATH": _PATH, "HOME": "/nonexistent"}, cwd=str(p.root),
        limits=Limits(open_files=512, processes=256, core_bytes=0, no_new_privs=False),
        user=(*NOBODY, _others_groups()), cgroup=True, label="c-diff-nobody", stdin="open",
        passed=("memfd", "file")),
    # A folder the launcher makes for another account: made as that account (after the switch),
    # so it is the account's from the start, in a sticky folder as the daemon's run-as one is.
    "a folder made as its user": lambda p: Request(
        argv=p.report("read"), env={}, cwd=str(p.root / "work" / "shared" / "call") + "/", make_cwd=True,
        user=(*NOBODY, [65534]), stdin=b"", prepare=p.fresh_shared),
    # Run as another user with no supplementary group at all, and no_new_privs.
    "as nobody, no groups": lambda p: Request(
        argv=p.report("read"), env={}, cwd="/", limits=Limits(no_new_privs=True), user=(*NOBODY, []),
        stdin=b"", passed=("pipe",)),
    # Limits at their extremes: the highest each may be set to (RLIM_INFINITY, no limit, where the
    # launcher's own hard limit is that) and zero.
    "limits at the extremes": lambda p: Request(
        argv=p.report("read"), env={"PATH": _PATH}, cwd="/tmp",
        limits=Limits(cpu_s=_highest(resource.RLIMIT_CPU), address_space_bytes=_highest(resource.RLIMIT_AS),
                      open_files=64, processes=_highest(resource.RLIMIT_NPROC), file_size_bytes=0,
                      core_bytes=_highest(resource.RLIMIT_CORE), no_new_privs=False)),
    # What every call gets unless configured otherwise; a folder given relative (to the launcher's /).
    "the daemon's defaults": lambda p: Request(argv=p.report("read"), env={"PATH": _PATH}, cwd="tmp",
                                               limits=DEFAULT, stdin=b"x" * 100_000),
    # The daemon's pseudo-terminal as the controlling terminal (no descriptor of it kept), with
    # a terminal among the passed descriptors beside it, as root and as another user.
    "a controlling terminal": lambda p: Request(argv=p.report("read"), env={"PATH": _PATH}, cwd="/",
                                                terminal="pty", passed=("pty",), cgroup=True, label="c-diff-tty"),
    "a controlling terminal, as nobody": lambda p: Request(argv=p.report("open"), env={}, cwd="/", terminal="pty",
                                                           user=(*NOBODY, [65534]), stdin="open"),
    # A folder that exists already, made "again": nothing changes, the program starts there.
    "folder already there": lambda p: Request(argv=p.report("read"), env={}, cwd=str(p.root), make_cwd=True),
}
RUN_AS = {"as nobody", "as nobody, no groups", "a folder made as its user", "a controlling terminal, as nobody"}


def _case_params(cases: dict[str, object], run_as: set[str]) -> list[object]:
    return [pytest.param(name, id=name.replace(" ", "-").replace(",", ""),
                         marks=[pytest.mark.skipif(not _can_run_as_others(),
                                                   reason=f"needs root and {PYTHON} (another user cannot run "
                                                          "this test's interpreter)")] if name in run_as else [])
            for name in cases]


@pytest.mark.parametrize("case", _case_params(SUCCESS, RUN_AS))
async def test_a_program_sees_the_same_of_itself_through_both_launchers(launchers, place, case: str) -> None:
    request = SUCCESS[case](place)
    owner = request.user[:2] if request.user is not None else None
    passed = Passed(request.passed, place, owner)
    try:
        fds = ",".join(map(str, passed.fds))
        argv = [fds if arg == FDS else arg for arg in request.argv]  # the reporter reads what it was passed
        seen = await both(launchers, request, passed, argv)
        status_seen = await both(launchers, request, passed, request.status_argv or ["/bin/cat", "/proc/self/status"],
                                 feed=False)
    finally:
        passed.close()
    # It ran, and said all it sees, through the specification: the comparison compares something.
    python = seen["python"]
    assert python["status"] == 0 and python["stderr"] == "", python
    assert isinstance(python["stdout"], dict) and python["stdout"]["ppid"] == "the daemon"
    assert status_seen["python"]["status"] == 0 and set(status_seen["python"]["stdout"]) == set(STATUS_KEYS)
    report = python["stdout"]
    if request.terminal == "pty":  # its controlling terminal, reached by /dev/tty, with no descriptor of it kept
        assert (report["has_tty"], report["dev_tty"], report["tpgid"]) == (True, "opened", "its own group"), report
        assert [fd for fd, what in report["fds"].items() if what["kind"].startswith("tty")] == passed_ptys(passed)
    else:
        assert (report["has_tty"], report["dev_tty"]) == (False, "ENXIO"), report
    if request.label is not None:
        assert python["label"] == request.label
        assert python["stdout"]["cgroup"] == "<the call's cgroup>"
    assert_same(seen)
    assert_same(status_seen)


def passed_ptys(passed: Passed) -> list[str]:
    """The numbers of the terminals among the passed descriptors (the "pty" kind)."""
    return [str(fd) for fd, what in zip(passed.fds, passed.kinds) if what == "pty"]


def _nofile_above(hard: bool) -> int:
    """A descriptor limit no process may set: above fs.nr_open (even root), or above the hard limit
    the launcher holds (a user without CAP_SYS_RESOURCE)."""
    if hard:
        return resource.getrlimit(resource.RLIMIT_NOFILE)[1] + 1
    return int(Path("/proc/sys/fs/nr_open").read_text()) + 1


# Every failure case: a request whose start fails in the new process, at one step.
FAILURE: dict[str, Callable[[Place], Request]] = {
    "no such program": lambda p: Request(argv=["/nonexistent/program"], env={}, cwd="/"),
    "no such program on PATH": lambda p: Request(argv=["rungd-no-such-program"],
                                                 env={"PATH": f"/nonexistent::{_PATH}"}, cwd="/"),
    "only a file that is not executable on PATH": lambda p: Request(argv=["true"], env={"PATH": str(p.root / "noexec")},
                                                                    cwd="/"),
    "not a program (no #! line)": lambda p: Request(argv=[str(p.root / "garbage")], env={}, cwd="/"),
    "a folder as the program": lambda p: Request(argv=[str(p.root)], env={}, cwd="/"),
    "an empty program name": lambda p: Request(argv=[""], env={"PATH": _PATH}, cwd="/"),
    "no such folder": lambda p: Request(argv=["/bin/true"], env={}, cwd=str(p.root / "gone")),
    "an empty folder name": lambda p: Request(argv=["/bin/true"], env={}, cwd=""),
    "a file as the folder": lambda p: Request(argv=["/bin/true"], env={}, cwd=str(p.data)),
    "a folder to make under a file": lambda p: Request(argv=["/bin/true"], env={}, cwd=str(p.data / "x"),
                                                       make_cwd=True),
    "a folder to make, named empty": lambda p: Request(argv=["/bin/true"], env={}, cwd="", make_cwd=True),
    "a folder its user may not enter": lambda p: Request(argv=["/bin/true"], env={}, cwd=str(p.root / "private"),
                                                         user=(*NOBODY, [65534])),
    "a folder made for another user": lambda p: Request(argv=["/bin/true"], env={}, cwd=str(p.root / "work" / "u"),
                                                        make_cwd=True, user=(*NOBODY, [65534]), prepare=p.fresh_work),
    "a descriptor limit above fs.nr_open": lambda p: Request(argv=["/bin/true"], env={}, cwd="/",
                                                             limits=Limits(open_files=_nofile_above(hard=False))),
    "a user raising its hard limit": lambda p: Request(argv=["/bin/true"], env={}, cwd="/",
                                                       limits=Limits(open_files=_nofile_above(hard=True)),
                                                       user=(*NOBODY, [65534])),
    "a terminal that is no terminal": lambda p: Request(argv=["/bin/true"], env={}, cwd="/", terminal="file"),
    "a limit and a missing program: the limit first": lambda p: Request(
        argv=["/nonexistent/program"], env={}, cwd="/", limits=Limits(open_files=_nofile_above(hard=False))),
}
FAILURE_RUN_AS = {"a folder its user may not enter", "a folder made for another user", "a user raising its hard limit"}
# Where the two launchers differ, each with the difference exactly: an xfail(strict=True), so
# the day it is fixed the test says so. (Empty: launcher.c now fails an empty program name
# EINVAL at exec, as launcher.py does.)
KNOWN_DIFFERENCES: dict[str, str] = {}


def _failure_params() -> list[object]:
    params = []
    for param in _case_params(FAILURE, FAILURE_RUN_AS):
        name = param.values[0]
        marks = list(param.marks)
        if name in KNOWN_DIFFERENCES:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_DIFFERENCES[name]))
        params.append(pytest.param(name, id=param.id, marks=marks))
    return params


@pytest.mark.parametrize("case", _failure_params())
async def test_a_start_that_cannot_succeed_fails_at_the_same_step_with_the_same_errno(
        launchers, place, case: str) -> None:
    request = FAILURE[case](place)
    passed = Passed((), place, None)
    try:
        seen = await both(launchers, request, passed, request.argv)
    finally:
        passed.close()
    python = seen["python"]
    # The specification failed it in the new process (not the daemon's side), which exited 127.
    assert "failed" in python and python["status"] == 127 and python["stdout"] == "", python
    assert_same(seen)


def FAILURE_REQUESTS(place: Place) -> list[Request]:  # noqa: N802 - read as the table it makes
    return [make(place) for make in FAILURE.values()]


def test_the_cases_carry_every_field_of_the_wire(place) -> None:
    """A field added to the wire (or a limit to Limits) must join a case here."""
    requests = [make(place) for make in SUCCESS.values()]
    assert set(launcher_wire.decode(launcher_wire.encode_start(
        [b"x"], {}, b"/", mkdir=True, limits=DEFAULT.wire(), user=(1, 1, [1]), targets=[0, 1, 2, -1], cgroup=True,
        label=b"c-1"))) == {"targets", "user", "limits", "cwd", "argv", "env", "mkdir", "cgroup", "label"}
    for field in dataclasses.fields(Limits):
        assert any(r.limits is not None and getattr(r.limits, field.name) not in (None, False) for r in requests), field
    assert any(r.limits is not None and not r.limits.no_new_privs for r in requests)
    assert {what for r in requests for what in r.passed} == {"memfd", "pipe", "pty", "file"}  # targets
    assert {r.stdin if isinstance(r.stdin, str) else "bytes" for r in requests} == {"eof", "open", "bytes"}
    assert any(r.make_cwd for r in requests) and any(r.cgroup and r.label for r in requests)
    assert any(r.terminal == "pty" for r in requests) and any(r.terminal == "file" for r in FAILURE_REQUESTS(place))
    assert any(r.user and not r.user[2] for r in requests) and any(r.user and len(r.user[2]) > 1 for r in requests)
    assert any("PATH" not in r.env for r in requests) and any(r.argv[0] == "python3" for r in requests)
