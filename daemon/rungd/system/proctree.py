"""Killing a call's whole process tree, and reaping the orphans the daemon adopts.

A call's child leads its own session and process group (the runner starts it with
``start_new_session=True``), but a process group is not a tree: a program may double-fork a
daemon of its own or call setsid, and so leave the group. On the deadline all of it must die,
so a :class:`Tracker` knows a call's processes by four signs, each covering what the others
miss:

- descent: every process whose parent is a member. The runner calls
  :meth:`Tracker.snapshot` every 100-200 ms while the call runs, so a grandchild that
  double-forks away after a snapshot is still known, by pid and start time, once its parent is
  gone;
- the tag: the runner puts ``RUNGD_CALL=<call_id>`` in the child's environment and every
  descendant inherits it, so an orphan born and cut loose between two snapshots is found too.
  A process may exec with another environment, so the tag is a help, not a proof;
- the process group, at the kill: an untagged process left in the call's group by a parent
  that died before a snapshot saw it;
- a cgroup, when the daemon has a cgroup v2 subtree of its own (:class:`CallCgroup`): nothing
  forks its way out of one, and ``cgroup.kill`` kills all of it at once.

Without a cgroup, one process can still escape: one that leaves the group, execs without the
tag and whose parent exits, all between two snapshots (the test suite shows this case).

What a snapshot reads depends on what the call has, never on how many processes the host has:
with a cgroup, its ``cgroup.procs``; with a subreaper (the daemon), the ``children`` files of
the call's own processes and the daemon's adopted orphans; only a tracker with neither (a test,
a library user) falls back to scanning all of ``/proc``. An orphan the daemon adopts that no
running call claims is killed by :class:`Reaper`: a process that left its call's cgroup,
session and tag on purpose dies when the call it came from has ended.

A process is identified by its pid and its start time in clock ticks since boot (field 22 of
``/proc/PID/stat``), never by its name. Those ticks never change for a process, whereas
psutil's ``create_time()`` adds the boot time as the wall clock sees it now, which shifts when
the clock is set. Signals go through a pidfd opened before the start time is checked, so a pid
reused in between never receives them.

A daemon that is a child subreaper (:func:`set_child_subreaper`) inherits the orphans of its
calls instead of pid 1, which in a container may never reap them. It must then reap them
itself, and :class:`Reaper` does so without ever taking the exit status of a child Trio waits
on.

Linux only: /proc, pidfds (kernel 5.3) and, for cgroups, ``cgroup.kill`` (kernel 5.14).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import logging
import math
import os
import re
import signal
import time
from collections import defaultdict
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple

import trio

TAG_ENV = "RUNGD_CALL"

log = logging.getLogger("rungd.proctree")

_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>

# After SIGTERM a program may take its time to clean up, so a look every 50 ms is plenty. After
# SIGKILL death takes milliseconds and should be seen at once: all dead within ~100 ms.
_GRACE_POLL_S = 0.05
_KILL_POLL_S = 0.01
# SIGKILL cannot be caught, but a process in uninterruptible sleep (a dead NFS server) dies only
# when the kernel lets it; a kill that waited longer than this reports it as a survivor.
_KILL_WAIT_S = 2.0

_DEAD_STATES = frozenset("ZX")  # zombie, or dead: nothing left but an exit status
_CALL_ID = re.compile(r"[A-Za-z0-9_-]+")


class Member(NamedTuple):
    """One process of a call: its pid and its start time in clock ticks since boot."""

    pid: int
    start: int


class Stat(NamedTuple):
    """What this module reads from ``/proc/PID/stat``."""

    state: str
    ppid: int
    pgid: int
    start: int
    session: int


def read_file(path: str | os.PathLike[str], dir_fd: int | None = None) -> bytes:
    """The whole of a small kernel file (``/proc``, cgroupfs) in four system calls.

    ``open()`` adds a stat, a terminal check and two seeks to each, and the call path reads
    a dozen such files. Read to end of file: a file made line by line (cgroup.procs, a
    process's children) comes a page at a time, and a short read is not its end.

    Args:
        dir_fd: a folder's descriptor, which a relative ``path`` starts from.

    Raises:
        OSError: as ``os.open`` and ``os.read`` (the file is gone, or not ours to read).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_stat(pid: int) -> Stat | None:
    """The stat of process ``pid``, or None when there is no such process any more."""
    try:
        data = read_file(f"/proc/{pid}/stat")
    except OSError:  # it was reaped between listing /proc and reading it
        return None
    # The command name is in parentheses and may itself contain ") ", so split after the last.
    fields = data[data.rindex(b")") + 2 :].split()
    return Stat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]), int(fields[3]))


def _scan() -> dict[int, Stat]:
    """The stat of every process on the machine (about 1 ms for a hundred processes)."""
    table: dict[int, Stat] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := read_stat(int(name))) is not None:
            table[int(name)] = stat
    return table


def _tagged(pid: int, call_id: str) -> bool:
    """Whether process ``pid`` was started with ``RUNGD_CALL=call_id`` in its environment."""
    try:
        environ = read_file(f"/proc/{pid}/environ")
    except OSError:  # gone, or another user's process (a setuid program, say)
        return False
    return f"{TAG_ENV}={call_id}".encode() in environ.split(b"\0")


def own_children() -> set[int]:
    """This process's children, from /proc/self/task/*/children: no scan of every process.

    Children of all threads count: Trio spawns from worker threads, and a child subreaper's
    adopted orphans belong to the process as a whole (they show under its main thread).
    """
    return set(_children("self"))


def _children(pid: int | str) -> list[int]:
    """The children of process ``pid`` (of all its threads), from /proc: no scan."""
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for tid in tasks:
        try:
            children.extend(int(child) for child in read_file(f"/proc/{pid}/task/{tid}/children").split())
        except OSError:  # the thread ended meanwhile
            continue
    return children


def tagged_pids(call_id: str) -> list[int]:
    """Pids of living processes started with ``RUNGD_CALL=call_id``."""
    return [m.pid for m in _tagged_members(call_id)]


def _tagged_members(call_id: str) -> list[Member]:
    return [Member(pid, stat.start) for pid, stat in _scan().items()
            if stat.state not in _DEAD_STATES and _tagged(pid, call_id)]


def kill_tagged(call_ids: Collection[str]) -> dict[str, int]:
    """SIGKILL every living process tagged with one of ``call_ids``: what crash recovery does
    for calls a previous daemon left unfinished.

    One scan of /proc for all of them. Each process is known by pid and start time and
    signalled through a pidfd (:func:`_send`), so a pid reused since the scan is never hit.

    Returns:
        call_id -> how many processes were killed.
    """
    wanted = {f"{TAG_ENV}={call_id}".encode(): call_id for call_id in call_ids}
    killed = dict.fromkeys(call_ids, 0)
    if not wanted:
        return killed
    for pid, stat in _scan().items():
        if stat.state in _DEAD_STATES:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as file:
                environ = file.read().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            call_id = wanted.get(entry)
            if call_id is not None:
                if _send(Member(pid, stat.start), (signal.SIGKILL,)):
                    killed[call_id] += 1
                break
    return killed


def _send(member: Member, signals: tuple[signal.Signals, ...]) -> bool:
    """Send ``signals`` to ``member`` if it is still that process; True if they were sent."""
    try:
        pidfd = os.pidfd_open(member.pid)
    except ProcessLookupError:
        return False
    try:
        # The pidfd holds on to whatever process has this pid now. If that process started when
        # the member did, it is the member, and the signals reach it and nothing else, even if
        # it dies and its pid is reused meanwhile.
        stat = read_stat(member.pid)
        if stat is None or stat.start != member.start:
            return False
        for sig in signals:
            signal.pidfd_send_signal(pidfd, sig)
        return True
    except (ProcessLookupError, PermissionError):  # died meanwhile; or setuid and not ours
        return False
    finally:
        os.close(pidfd)


def set_child_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (``PR_SET_CHILD_SUBREAPER``).

    An orphan is then re-parented to the nearest living subreaper among its ancestors instead
    of pid 1, so the daemon inherits what its calls leave behind and must reap it
    (:class:`Reaper`). The setting is for the whole process and lasts until it exits.

    Returns:
        True if the kernel accepted it (Linux 3.4 and later), False otherwise.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc to load, or a libc without prctl
        return False


_CLK_TCK = os.sysconf("SC_CLK_TCK")  # the ticks /proc/PID/stat counts a start time in (USER_HZ)
_TICK_NS = 1_000_000_000 // _CLK_TCK if 1_000_000_000 % _CLK_TCK == 0 else 0  # 0: no whole tick


def boottime_ns() -> int:
    """Now on the clock a process's start time is counted on (CLOCK_BOOTTIME)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def start_between(before_ns: int, after_ns: int) -> int | None:
    """The start time ``/proc/PID/stat`` gives a process made between two :func:`boottime_ns`
    readings, when both fall in the same clock tick (10 ms where USER_HZ is 100, as on every
    common Linux; a spawn takes a fraction of one): the kernel counts it from that same clock,
    in whole ticks. None when they straddle a tick (or the tick is not a whole number of
    nanoseconds): then it must be read.

    A read of ``/proc/PID/stat`` costs a call tens of microseconds; the daemon's own time
    namespace offsets the clock and that file alike.
    """
    if not _TICK_NS:
        return None
    tick = before_ns // _TICK_NS
    return tick if after_ns // _TICK_NS == tick else None


class Tracker:
    """The processes of one call, known by pid and start time so that the kill can find them.

    The runner creates it right after spawning the call's child, before anything waits for
    that child, and calls :meth:`snapshot` every 100-200 ms while the call runs. What a
    snapshot reads grows with the call, not with the host (see the module docstring): the
    cgroup's process list, the ``children`` of the call's processes, and the orphans this
    process adopted as a subreaper. Only a tracker with neither a cgroup nor ``subreaper``
    scans every process, as a library user without a daemon would need.

    Args:
        call_id: the call's id, which the runner also put in the child's environment as
            ``RUNGD_CALL``.
        root_pid: the call's child.
        cgroup: the call's cgroup, if it has one; its processes are members too.
        subreaper: this process is a child subreaper (:func:`set_child_subreaper`), so the
            call's orphans are its children and no scan of /proc is needed to find them.
        start: the root's start time in clock ticks, when the caller knows it exactly (the
            launcher's spawn does, nearly always: :func:`start_between`); else it is read.

    Raises:
        ProcessLookupError: ``root_pid`` names no process (it was already reaped); asked
            only without ``start``.
    """

    def __init__(self, call_id: str, root_pid: int, *, cgroup: CallCgroup | None = None,
                 subreaper: bool = False, start: int | None = None) -> None:
        stat = None
        if start is None:
            stat = read_stat(root_pid)
            if stat is None:
                raise ProcessLookupError(
                    f"process {root_pid} does not exist; create the Tracker right after spawning "
                    "the call's child, before waiting for it"
                )
            start = stat.start
        self.call_id = call_id
        self.root = Member(root_pid, start)
        self.cgroup = cgroup
        self.subreaper = subreaper
        # Each member's stat as last read (the root's at construction, or None when its start
        # came from the spawn); every snapshot reads them all again.
        self._members: dict[Member, Stat | None] = {self.root: stat}

    def snapshot(self, *, group: int | None = None) -> None:
        """Record every process of the call that exists now, and forget those reaped since.

        A process is a member if it is a member already (same pid, same start time), carries
        the call's tag, is in the call's cgroup, is in process group ``group`` while a member
        is too (so the group id is still the call's), or descends from any of those.

        Args:
            group: the call's process group, or None to leave groups out. The kill passes it,
                so that it also waits for untagged group members born after the last snapshot
                whose parent is gone.
        """
        if self.cgroup is None and not self.subreaper:
            self._snapshot_by_scan(group)
            return
        found: dict[int, Stat] = {}
        todo: list[int] = []

        def take(pid: int, stat: Stat | None) -> None:
            if stat is not None and pid not in found and stat.start >= self.root.start:
                found[pid] = stat
                todo.append(pid)

        for member in self._members:
            stat = read_stat(member.pid)
            if stat is not None and stat.start == member.start:
                take(member.pid, stat)
        if self.cgroup is not None:
            for pid in self.cgroup.pids():
                if pid not in found:
                    take(pid, read_stat(pid))
        if self.subreaper:
            # An orphan of the call was re-parented to us: it is one of our own children.
            for pid in own_children():
                if pid not in found and (stat := read_stat(pid)) is not None \
                        and self._claims_orphan(pid, stat, group):
                    take(pid, stat)
        while todo:
            for child in _children(todo.pop()):
                if child not in found:
                    take(child, read_stat(child))
        self._members = {Member(pid, stat.start): stat for pid, stat in found.items()}

    def _claims_orphan(self, pid: int, stat: Stat, group: int | None) -> bool:
        if stat.start < self.root.start or stat.state in _DEAD_STATES:
            return False
        # The root leads the call's session and group, and is reaped only after the call
        # ends, so neither id can belong to a stranger meanwhile.
        return (stat.session == self.root.pid or stat.pgid in (self.root.pid, group)
                or _tagged(pid, self.call_id))

    def claims(self, pid: int) -> bool:
        """Whether process ``pid``, an orphan this process adopted, belongs to this call now."""
        stat = read_stat(pid)
        if stat is None:
            return False
        if Member(pid, stat.start) in self._members or self._claims_orphan(pid, stat, None):
            return True
        return self.cgroup is not None and pid in self.cgroup.pids()

    def _snapshot_by_scan(self, group: int | None) -> None:
        # Every process of the call started no earlier than its root, so older ones are skipped;
        # that also keeps the environ reads to the few processes started since.
        table = {pid: stat for pid, stat in _scan().items() if stat.start >= self.root.start}
        found = {pid for pid, start in self._members if pid in table and table[pid].start == start}
        found.update(pid for pid in table if pid not in found and _tagged(pid, self.call_id))
        if self.cgroup is not None:
            found.update(pid for pid in self.cgroup.pids() if pid in table)
        if group is not None and any(table[pid].pgid == group for pid in found):
            found.update(pid for pid, stat in table.items() if stat.pgid == group)
        children = defaultdict(list)
        for pid, stat in table.items():
            children[stat.ppid].append(pid)
        todo = list(found)
        while todo:
            for child in children[todo.pop()]:
                if child not in found:
                    found.add(child)
                    todo.append(child)
        self._members = {Member(pid, table[pid].start): table[pid] for pid in found}

    def members(self) -> list[Member]:
        """Every process of the call as of the last snapshot, zombies included."""
        return sorted(self._members)

    def alive(self) -> list[Member]:
        """The members that were alive at the last snapshot: zombies count as dead."""
        # A root whose stat was never read (its start came from the spawn) was alive then.
        return sorted(m for m, stat in self._members.items() if stat is None or stat.state not in _DEAD_STATES)

    def holds_group(self, pgid: int) -> bool:
        """Whether a member, a zombie included, is in process group ``pgid`` (at the last snapshot).

        Only then is signalling the group safe: a group id is not reused while any process, even
        an unreaped zombie, is in the group, but once the call's group is empty its id may
        belong to a stranger.
        """
        # A root whose stat was never read is in no group yet, as far as the tracker knows.
        return any(stat is not None and stat.pgid == pgid for stat in self._members.values())


@dataclasses.dataclass(frozen=True, slots=True)
class KillReport:
    """What :func:`kill_tree` did.

    Attributes:
        method: ``"cgroup"`` when the call's cgroup was killed as well, else ``"signals"``.
        signalled: how many distinct processes were signalled one by one (processes reached
            only through the process group or the cgroup are not counted).
        survivors: pids still alive at the end; empty unless a process could not be killed.
        elapsed_ms: from the start of the kill until all were dead (or it gave up).
        after_sigkill_ms: from SIGKILL until all were dead; None if SIGTERM was enough.
    """

    method: Literal["signals", "cgroup"]
    signalled: int
    survivors: list[int]
    elapsed_ms: float
    after_sigkill_ms: float | None


def _signal_round(
    tracker: Tracker,
    pgid: int | None,
    signals: tuple[signal.Signals, ...],
    sent: set[Member],
    *,
    group: bool,
) -> None:
    """Send ``signals`` to every living member not in ``sent`` (adding it), and to the group."""
    if group and pgid is not None and tracker.holds_group(pgid):
        for sig in signals:
            # The group emptied meanwhile; or only a process we may not signal is left in
            # it (a setuid helper): its members are still signalled one by one below.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
    for member in tracker.alive():
        if member not in sent and _send(member, signals):
            sent.add(member)


async def kill_tree(tracker: Tracker, *, grace_s: float, pgid: int | None) -> KillReport:
    """Kill every process of a call: SIGTERM, up to ``grace_s`` to exit, then SIGKILL.

    SIGTERM (with SIGCONT, so a stopped process can act on it) goes to the process group and to
    every member of the tracker, after a fresh snapshot. While the grace period runs, members
    that appear (a handler may fork on its way out) get SIGTERM too. Whatever is alive when it
    ends gets SIGKILL: the call's cgroup through ``cgroup.kill``, the group, and every member,
    again in rounds every 10 ms, since a process may fork between a snapshot and its death.
    Zombies count as dead: reaping them is for whoever is their parent (Trio for the call's
    child, :class:`Reaper` for adopted orphans).

    Args:
        tracker: the call's processes.
        grace_s: how long the processes may take to exit after SIGTERM; 0 kills at once.
        pgid: the call's process group (its child's pid, when started in a new session), or
            None. It is signalled, and its processes waited for, only while a member, even a
            zombie, is in it.

    Returns:
        What was done; ``survivors`` is empty unless a process outlived SIGKILL by 2 s.

    **Cancellation:** none: the kill runs shielded and always finishes, within ``grace_s``
    plus about 2 s, so it is safe to call from a task that was just cancelled. The Trio loop
    is blocked only for each snapshot, whose cost grows with the call (see :class:`Tracker`).
    """
    with trio.CancelScope(shield=True):
        started = time.monotonic()
        term_sent: set[Member] = set()
        kill_sent: set[Member] = set()
        tracker.snapshot(group=pgid)
        if grace_s > 0:
            _signal_round(tracker, pgid, (signal.SIGTERM, signal.SIGCONT), term_sent, group=True)
            deadline = started + grace_s
            while tracker.alive() and (left := deadline - time.monotonic()) > 0:
                await trio.sleep(min(_GRACE_POLL_S, left))
                tracker.snapshot(group=pgid)
                # The group had its SIGTERM: a second one may read as "force quit" to a program.
                _signal_round(
                    tracker, pgid, (signal.SIGTERM, signal.SIGCONT), term_sent, group=False
                )
        after_sigkill_ms = None

        def left() -> bool:
            # A process killed through the cgroup counts until it has run its exit: the
            # cgroup can be removed only once it is empty.
            return bool(tracker.alive()) or (tracker.cgroup is not None and tracker.cgroup.populated())

        if left():
            sigkill_at = time.monotonic()
            if tracker.cgroup is not None:
                tracker.cgroup.kill()
            while left() and time.monotonic() - sigkill_at < _KILL_WAIT_S:
                _signal_round(tracker, pgid, (signal.SIGKILL,), kill_sent, group=True)
                await trio.sleep(_KILL_POLL_S)
                tracker.snapshot(group=pgid)
            after_sigkill_ms = (time.monotonic() - sigkill_at) * 1000
        return KillReport(
            method="signals" if tracker.cgroup is None else "cgroup",
            signalled=len(term_sent | kill_sent),
            survivors=[member.pid for member in tracker.alive()],
            elapsed_ms=(time.monotonic() - started) * 1000,
            after_sigkill_ms=after_sigkill_ms,
        )


_OWN_CGROUP: dict[tuple[int, str], Path | None] = {}


def _own_cgroup() -> Path | None:
    """The directory of this process's cgroup v2, or None without a cgroup v2 hierarchy.

    Found once per process and cgroup: the daemon's own cgroup does not change under it, and
    finding it reads the mount table and its cgroup's process list, whose length grows with
    the host when the daemon sits in the root cgroup. ``/proc/self/cgroup`` (one short line) is
    read every time, so a daemon moved to another cgroup finds its new one.
    """
    try:
        cgroups = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    key = (os.getpid(), cgroups)
    if key not in _OWN_CGROUP:
        if len(_OWN_CGROUP) > 16:
            _OWN_CGROUP.clear()
        _OWN_CGROUP[key] = _find_own_cgroup(cgroups.splitlines())
    return _OWN_CGROUP[key]


def _find_own_cgroup(cgroups: list[str]) -> Path | None:
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    relative = next((line[3:] for line in cgroups if line.startswith("0::")), None)
    # A mountinfo line: "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [TAGS] - FSTYPE SOURCE ..."
    mount_point = next(
        (line.split()[4] for line in mounts if line.split(" - ")[1].startswith("cgroup2 ")), None
    )
    if relative is None or mount_point is None:
        return None
    path = Path(mount_point, relative.lstrip("/"))
    # A hierarchy mounted from a subtree, or another cgroup namespace, would make that join
    # wrong; the directory is ours only if it lists this process.
    try:
        return path if str(os.getpid()) in (path / "cgroup.procs").read_text().split() else None
    except OSError:
        return None


# On a call cgroup: the call it holds, or held last (written by the runner's launcher, which
# names it too: rungd.runner.launcher.LABEL_XATTR).
_LABEL_XATTR = "user.rungd.call"
# On a daemon's subtree: the pid of the process that made it (a test run counts its own).
OWNER_XATTR = "user.rungd.pid"


def calls_subtree(tag: str | None = None) -> Path | None:
    """Where call cgroups go: the subtree ``rungd-d<tag>`` of one daemon (its tag comes from
    its state folder, so a restart finds what the last run left, and two daemons sharing a
    cgroup never touch each other's calls or spares), or ``rungd-p<pid>`` for code running
    without a daemon; under the daemon's own cgroup. Not made here (:meth:`CallCgroup.create`
    makes it with its first call's cgroup). None without a cgroup v2 hierarchy."""
    base = _own_cgroup()
    if base is None:
        return None
    return base / (f"rungd-d{tag}" if tag is not None else f"rungd-p{os.getpid()}")


def _make_subtree(path: Path) -> None:
    """Make a daemon's subtree, saying which process made it. No controller is enabled in
    it, so the daemon's own cgroup may hold the daemon and this subtree both."""
    path.mkdir(exist_ok=True)
    with contextlib.suppress(OSError):  # no user attributes on cgroups before 5.7
        os.setxattr(path, OWNER_XATTR, str(os.getpid()).encode())


def remove_subtree(tag: str | None) -> bool:
    """Remove a daemon's subtree once its calls' cgroups are gone (at stop); True if it went."""
    subtree = calls_subtree(tag)
    try:
        if subtree is not None:
            subtree.rmdir()
            return True
    except OSError:  # a call's cgroup is still in it (a process stuck), or it was never made
        pass
    return False


class CallCgroup:
    """A cgroup v2 holding one call's processes, made under the daemon's own.

    It needs a cgroup the daemon may create children in: under systemd, ``Delegate=yes`` in
    the unit; as root, any cgroup v2 hierarchy. No controller is enabled, so the rule that a
    cgroup with controllers for its children may hold no processes of its own does not apply,
    and the daemon can stay where it is.

    A call's program is born in it: the runner's launcher makes it with ``clone3``'s
    ``CLONE_INTO_CGROUP`` (``rungd.runner.launch``), so nothing the program forks is ever
    outside it. Such a spare cgroup is named ``rungd-s<random>`` and, as each call's program
    is made in it, labelled with the call's id by the launcher (the ``user.rungd.call``
    extended attribute: a cgroup v2 cannot be renamed); start-up recovery reads either. One
    left empty by its call is dated and kept for the next call, which relabels it.

    Every method fails softly (None or False): without a cgroup the kill still works by
    signals.

    Args:
        path: the cgroup's directory.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        # As strings, made once: a call reads and writes these a few times, and a spare
        # cgroup serves many calls.
        self._dir = str(path)
        # Its folder and its cgroup.events, opened at first use and held until it is removed
        # (:meth:`close`): a spare cgroup serves many calls, and each call reads its files
        # and has a program made in it; a walk of the long cgroupfs path each time cost a
        # call tens of microseconds on the loop.
        self._fd = self._events_fd = -1
        # Written to cgroup.kill once: the kernel (6.18 here) then kills every process born into
        # it with CLONE_INTO_CGROUP, so such a cgroup is never given to another call.
        self.killed = False
        self.dated = -math.inf  # when (time.monotonic) the daemon last set its mtime, keeping it

    @classmethod
    def create(cls, call_id: str, tag: str | None = None) -> CallCgroup | None:
        """Make the cgroup ``rungd-<call_id>`` in the daemon's subtree (:func:`calls_subtree`).

        Args:
            tag: the daemon's (:func:`calls_subtree`); None for code running without one.

        Returns:
            The cgroup; None without a writable cgroup v2 hierarchy, or on a kernel without
            ``cgroup.kill`` (before 5.14).

        Raises:
            ValueError: ``call_id`` is not made of letters, digits, ``-`` and ``_``.
        """
        if not _CALL_ID.fullmatch(call_id):
            raise ValueError(
                f"call id {call_id!r} cannot name a cgroup; use letters, digits, - and _"
            )
        subtree = calls_subtree(tag)
        if subtree is None:
            return None
        path = subtree / f"rungd-{call_id}"
        try:
            try:
                path.mkdir()
            except FileNotFoundError:  # the subtree is made with its first call's cgroup (or again)
                _make_subtree(subtree)
                path.mkdir()
        except OSError:  # not delegated to us, or read-only
            return None
        if not (path / "cgroup.kill").exists():
            path.rmdir()
            return None
        return cls(path)

    def fd(self) -> int:
        """A descriptor of its folder (close-on-exec), held until :meth:`close`: the launcher
        makes a program in the cgroup through it (``CLONE_INTO_CGROUP``).

        Raises:
            OSError: it is gone, or the daemon is out of descriptors.
        """
        if self._fd < 0:
            self._fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self._fd

    def close(self) -> None:
        """Let go of the descriptors it holds (when removed, or no longer kept); safe twice.
        Not locked: the reaper's worker thread touches only retired cgroups, which no call
        holds any more."""
        for fd in (self._fd, self._events_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._events_fd = -1

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    @classmethod
    def spare(cls, tag: str | None = None) -> CallCgroup | None:
        """A cgroup for a call not known yet, ``rungd-s<random>`` (the launcher labels it with
        the call whose program it makes there)."""
        return cls.create(f"s{os.urandom(8).hex()}", tag)

    def reusable(self, events: bytes | None = None) -> bool:
        """Whether it is as it was made: never killed, empty, not frozen, no cgroup inside it,
        no controller enabled for children. A program of the call may have changed any of that.

        Args:
            events: its ``cgroup.events`` as :meth:`events` read them just now, if they were.
        """
        if self.killed:
            return False
        try:
            # A cgroup's folder links its children's (as any folder its subfolders): 2 links
            # means none, where cgroup.stat's nr_descendants would cost a file's read.
            if os.fstat(self.fd()).st_nlink != 2:
                return False
            if events is None:
                events = self._read_events()
            controllers = read_file("cgroup.subtree_control", dir_fd=self.fd())
        except OSError:
            return False
        return b"populated 0" in events and b"frozen 0" in events and not controllers.strip()

    def call_id(self) -> str:
        """The call this cgroup holds: its label, else the id in its name."""
        try:
            return os.getxattr(self.path, _LABEL_XATTR).decode()
        except OSError:
            return self.path.name.removeprefix("rungd-")

    def add(self, pid: int) -> bool:
        """Move process ``pid`` into the cgroup; its later children are born there.

        Returns:
            False if it could not be moved (it exited, or we may not move it).
        """
        try:
            (self.path / "cgroup.procs").write_text(f"{pid}\n")
        except OSError:
            return False
        return True

    def pids(self) -> list[int]:
        """The processes in the cgroup now; exited ones are not listed, even unreaped."""
        try:
            return [int(pid) for pid in read_file("cgroup.procs", dir_fd=self.fd()).split()]
        except OSError:  # removed
            return []

    def populated(self, events: bytes | None = None) -> bool:
        """Whether a process (or a thread of one whose leader exited) still lives in it, or
        may: one whose ``cgroup.events`` cannot be read now (EMFILE) counts as populated.

        ``cgroup.kill`` only sends SIGKILL: the processes die a moment later, and until then
        the cgroup cannot be removed.

        Args:
            events: its ``cgroup.events`` as :meth:`events` read them just now, if they were.
        """
        if events is None:
            try:
                events = self.events()
            except OSError:  # cannot tell now: as if a process were there
                return True
        return b"populated 1" in events

    def events(self) -> bytes:
        """Its ``cgroup.events`` now (populated, frozen); empty once it is removed.

        Raises:
            OSError: they cannot be read now (the daemon is out of descriptors, say).
        """
        try:
            return self._read_events()
        except OSError as exc:
            if isinstance(exc, (FileNotFoundError, NotADirectoryError)) or exc.errno == errno.ENODEV:
                return b""  # removed: nothing lives in it
            raise

    def _read_events(self) -> bytes:
        """cgroup.events, read again from its start through the descriptor held (cgroupfs
        makes the text anew at each read from offset 0)."""
        if self._events_fd < 0:
            self._events_fd = os.open("cgroup.events", os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.fd())
        return os.pread(self._events_fd, 4096, 0)

    def kill(self) -> bool:
        """SIGKILL every process in the cgroup, including those forked while it happens.

        Returns:
            False if the kernel refused.
        """
        self.killed = True
        try:
            (self.path / "cgroup.kill").write_text("1\n")
        except OSError:
            return False
        return True

    def remove(self) -> bool:
        """Remove the cgroup; it must hold no living process.

        Returns:
            False if it could not be removed (still populated, or already gone).
        """
        try:
            self.path.rmdir()
        except OSError:
            return False
        self.close()
        return True

    async def remove_when_empty(self, timeout_s: float = _KILL_WAIT_S) -> bool:
        """Wait (bounded) until the cgroup is empty, then remove it.

        Removal right after a kill used to fail with EBUSY: ``cgroup.kill`` and SIGKILL are
        asynchronous, and a process counts until it has run its exit. That is why call cgroups
        were left behind; the wait here is what removes them.

        Returns:
            False if a process outlived ``timeout_s`` (stuck in the kernel): the cgroup stays,
            and the next start-up sweeps it.

        **Cancellation:** none; the caller shields it.
        """
        deadline = time.monotonic() + timeout_s
        while self.populated() and time.monotonic() < deadline:
            await trio.sleep(_KILL_POLL_S / 5)
        removed = self.remove()
        if not removed and self.path.exists():
            log.warning("call cgroup %s could not be removed: a process in it outlived SIGKILL", self.path)
        return removed


# An empty call cgroup younger than this may be one another daemon in the same cgroup (a
# test run, a second instance) just made for a call it is starting: leave it.
_SWEEP_MIN_AGE_S = 60.0


def sweep_cgroups(recovered: Collection[str], tag: str | None = None) -> int:
    """Remove the call cgroups an earlier run of this daemon left in its subtree (a crash, a
    kill), and what code running without a daemon left beside the subtrees.

    In the daemon's own subtree (``tag``), every cgroup is an earlier run's: one whose call
    is among ``recovered`` (the calls this daemon's ledger says a previous run left
    unfinished) is killed (``cgroup.kill``) if it still holds processes; every empty one is
    removed. One that holds processes and is no recovered call's stays (a program that moved
    itself there). Beside it, what holds calls or processes (another daemon's subtree, a
    process's ``rungd-p<pid>``) is never touched; what is empty and a minute old (the subtree
    of a daemon killed outright, a call cgroup of the older layout) is removed.
    Removal waits, bounded, for the kernel to empty it; a process stuck in the kernel keeps
    its cgroup, and the next start tries again.

    Args:
        recovered: call_ids recovery just finished as interrupted.
        tag: the daemon's subtree (:func:`calls_subtree`).

    Returns:
        How many were removed.
    """
    base = _own_cgroup()
    if base is None:
        return 0
    removed = 0
    subtree = calls_subtree(tag)
    for path in base.glob("rungd-*"):
        if path == subtree:
            continue  # this daemon's: swept below, and kept for its calls
        # Another daemon's subtree, a process's, or a call cgroup of the older layout: one
        # that holds cgroups or processes is in use; an empty one a minute old is what a
        # killed daemon left (a live daemon's subtree always holds its next call's spare).
        if CallCgroup(path).pids() or any(path.glob("rungd-*")):
            continue
        with contextlib.suppress(OSError):
            if time.time() - path.stat().st_mtime >= _SWEEP_MIN_AGE_S:
                removed += CallCgroup(path).remove()
    if subtree is None or tag is None or not subtree.is_dir():
        return removed
    for path in subtree.glob("rungd-*"):
        cgroup = CallCgroup(path)
        if cgroup.call_id() in recovered:
            # Ours, from a run that crashed: kill what it holds (recovery's kill by tag may
            # have emptied it already) and remove it, however young.
            if cgroup.pids():
                cgroup.kill()
                deadline = time.monotonic() + _KILL_WAIT_S
                while cgroup.pids() and time.monotonic() < deadline:
                    time.sleep(_KILL_POLL_S)
            removed += cgroup.remove()
        elif not cgroup.pids():
            removed += cgroup.remove()  # this daemon's, and no call of it runs yet
    return removed


# Per process, as being a subreaper is: the calls running in this process (call_id -> tracker)
# and the children something in it spawned and waits for (a launcher, before it knows its
# reaper). Every Reaper of the process consults both, so a second one (tests run several
# daemons in one process) never takes another's call for strays.
RUNNING: dict[str, Tracker] = {}
SPAWNED: set[int] = set()
_SPAWNS_IN_FLIGHT = [0]


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """Hold off every reaper of this process while a child is made and not yet in SPAWNED.

    A program made by the launcher (CLONE_PARENT) is this process's child from its first
    instruction, before anyone here knows its pid; a reaper that looked then would take it for
    a stray. Process-wide, as being a subreaper is: tests and ``rungctl check`` run several
    daemons in one process.
    """
    _SPAWNS_IN_FLIGHT[0] += 1
    try:
        yield
    finally:
        _SPAWNS_IN_FLIGHT[0] -= 1


class Reaper:
    """Reaps the zombies the daemon adopted as a child subreaper, and no others.

    Orphans of a call's tree become children of the daemon (:func:`set_child_subreaper`); when
    they die someone must wait for them or they stay zombies. The daemon's own children are
    another matter: Trio waits for each one with ``waitpid(pid)`` once its pidfd reports the
    exit, and a child reaped before that makes Trio report exit status 0 whatever it was. So
    the reaper never calls ``waitpid(-1)``: it finds zombie children in /proc and waits for
    each by pid, skipping every pid in ``owned``.

    Children in the daemon's own session (spawned without a new session, as plugins and
    ``subprocess.run`` do by default) are never reaped here. Every child the runner spawns in
    a session of its own must be registered like this::

        with proctree.spawning():
            process = await trio.lowlevel.open_process(...)
            owned.add(process.pid)
        ...
        await process.wait()
        owned.discard(process.pid)

    :func:`spawning` matters: Trio spawns in a worker thread, so a child can exist, and even
    exit, before its pid is known; no reaping happens while a spawn is in flight.

    Strays: an adopted orphan that is still alive and that no running call claims (see
    :attr:`calls` and :meth:`Tracker.claims`) came from a call that has ended; it left its
    call's cgroup, session and tag on purpose (or its call's kill missed it), and it is killed.
    The runner registers each call's tracker in :attr:`calls` before its program starts and
    removes it after the call's kill.

    Args:
        owned: the pids of the daemon's own children, which their spawner waits for; the
            reaper reads it, the spawners keep it up to date.
        interval_s: how often to look for zombies without being poked.
        kill_strays: kill adopted orphans no running call claims (the daemon does).
    """

    def __init__(self, owned: set[int], *, interval_s: float = 0.5, kill_strays: bool = True) -> None:
        self.owned = owned
        self.calls = RUNNING
        self.launchers: Any = None  # the runner's launchers (rungd.runner.launch), made lazily
        self.cgroup_tag: str | None = None  # the daemon's subtree of call cgroups (calls_subtree)
        # Call cgroups whose call has ended: removing one takes the kernel milliseconds (an
        # RCU grace period), so it is done here, in a worker thread, not on the call's path.
        self._retired: list[CallCgroup] = []
        self._interval_s = interval_s
        self._kill_strays = kill_strays
        self._stopped = False
        self._poked = trio.Event()

    def retire(self, cgroup: CallCgroup) -> None:
        """Remove ``cgroup`` soon (off the call's path), once it is empty; at once if the
        reaper has stopped (what cannot be removed then is left to the next start's sweep)."""
        if self._stopped:
            self._remove_retired([cgroup])
            return
        self._retired.append(cgroup)
        self._poked.set()

    def _remove_retired(self, cgroups: list[CallCgroup]) -> list[CallCgroup]:
        """Remove the empty ones; return those still populated (a process dying slowly)."""
        left = []
        for cgroup in cgroups:
            if cgroup.populated() or not (cgroup.remove() or not cgroup.path.exists()):
                left.append(cgroup)
        return left

    def poke(self) -> None:
        """Ask for a reaping pass now, e.g. after a kill; safe to call from the Trio thread only."""
        self._poked.set()

    def reap(self) -> list[int]:
        """Reap every zombie child of this process that is not owned.

        Returns:
            The pids reaped; none while a spawn is in flight.
        """
        if _SPAWNS_IN_FLIGHT[0]:
            return []
        reaped = []
        # Calls run in sessions of their own; a child in the daemon's own session was started
        # by other code of the daemon (a plugin's subprocess.run, ssh-keygen for a signature)
        # and whoever started it waits for it: reaping it would steal its exit status.
        own_session = os.getsid(0)
        for pid in own_children():
            stat = read_stat(pid)
            if stat is None or pid in self.owned or pid in SPAWNED or stat.session == own_session:
                continue
            if stat.state == "Z":
                with contextlib.suppress(ChildProcessError):  # reaped by someone else meanwhile
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        reaped.append(pid)
            elif self._kill_strays and not any(tracker.claims(pid) for tracker in self.calls.values()):
                if _send(Member(pid, stat.start), (signal.SIGKILL,)):
                    log.warning("killed process %s: it outlived the call it came from", pid)
                    self._poked.set()  # reap it (and kill what it leaves) at once
        return reaped

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reap every ``interval_s``, and whenever poked, until cancelled.

        Args:
            task_status: reports started at once, for ``nursery.start``.

        **Cancellation:** it just stops, never in the middle of a pass; orphans that die after
        that stay zombies until the daemon exits.
        """
        task_status.started()
        try:
            while True:
                self.reap()
                if self.launchers is not None:
                    # The next call's cgroup is made here, after the call that used the last
                    # one was answered (a mkdir in cgroupfs can take the kernel milliseconds);
                    # a launcher that died is started again.
                    await self.launchers.refill()
                if self._retired:
                    retired, self._retired = self._retired, []
                    left = await trio.to_thread.run_sync(self._remove_retired, retired)
                    self._retired.extend(cgroup for cgroup in left if cgroup.path.exists())
                with trio.move_on_after(self._interval_s):
                    await self._poked.wait()
                self._poked = trio.Event()
        finally:
            # What is left is removed now; a cgroup a process is stuck in stays for the
            # next start-up's sweep.
            self._stopped = True
            self._remove_retired(self._retired)
            # The runner's launcher (rungd.runner.launch) lives as long as the daemon: it
            # exits, and the spare cgroup goes, when the daemon stops.
            if (launchers := getattr(self, "launchers", None)) is not None:
                launchers.close()
