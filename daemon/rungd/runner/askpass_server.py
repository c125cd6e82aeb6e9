"""The call's private folder and the askpass endpoint in it.

GIT_ASKPASS, SSH_ASKPASS and SUDO_ASKPASS point at a script in this folder that runs
``rungd.runner.askpass.main``; that helper hands the exact question to :class:`AskpassServer` over a
Unix socket in the same folder, and prints the answer only if it gets one. Credential files
a tool declares are handed to the child as in-memory files, never written to a folder.

Who may ask: every tool program runs as the daemon's uid, so no file mode keeps another
call's program out (and sudo runs the helper as yet another user, so the folder is 0711 and
the socket 0666 on purpose). The endpoint therefore reads the peer's
credentials (SO_PEERCRED) on each connection and answers only a process that descends from
this call's child, checked through the live parent chain in /proc. Neither the call tag
(``RUNGD_CALL``, an environment variable any process may set for its children) nor the
cgroup (a process of the same uid may write its pid into a delegated cgroup) proves
membership, so neither is accepted. A stranger's connection is closed unanswered; its
question never reaches this call.

A daemon has one such endpoint for all its calls (:class:`AskpassEndpoint`): one folder, one
script and one socket made at start-up, and each call registers its child with it
(:class:`CallAskpass`); a question goes to the running call its asker descends from, or to
nobody. A program run as another user (``user =``) gets a private folder of its own
(:class:`AskpassServer`), reachable by that user, as does code running without a daemon.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import fcntl
import logging
import math
import os
import secrets
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from rungd.runner import askpass
from rungd.system import proctree, trust
from rungd.system.folders import remove_or_say

log = logging.getLogger("rungd.askpass")

_UCRED = struct.Struct("3i")  # struct ucred: pid_t pid; uid_t uid; gid_t gid
# The helper is the daemon's own askpass module, copied whole and run in isolated mode (-I):
# the child's environment carries no PYTHONPATH, so importing rungd there could find another
# copy of it, or none.
_HELPER = f"#!{sys.executable} -I\n" + Path(askpass.__file__).read_text()
_SECRET_FD_MIN = 256
_MAX_DEPTH = 64  # a real call's tree is a few levels deep; a longer chain is refused
_MAX_NESTING = 128  # folders a program made one in another, removed at most this deep
_MAX_PER_CALL = 16  # questions of one call in flight at once; more are closed unanswered
_QUESTION_S = 10.0  # a connection that sends no whole question in this long is closed
_WAIT_FOR_CLAIM_S = 5.0  # how long a child's question waits for its call to claim it
_MAX_WAITING = 64

# What the watch answers a member's question with: the secret, or None to refuse it.
Answer = Callable[[str], "str | None"]


class _Secrets:
    """A call's credential files: in-memory files its child inherits (see :meth:`secret_file`)."""

    def __init__(self, owner: tuple[int, int] | None) -> None:
        self.owner = owner
        # Descriptors of credential files, for the child to inherit (see secret_file).
        self.pass_fds: list[int] = []
        # Connections of askpass helpers whose question was refused: held open, unanswered,
        # until the call's tree is killed (close).
        self._held: list[trio.socket.SocketType] = []

    def secret_file(self, label: str, secret: str) -> str:
        """A credential as a file only this call's processes hold: returns its path, ``/dev/fd/N``.

        The credential is written into an anonymous in-memory file (memfd, mode 0600) that the
        child inherits as descriptor N (see :attr:`pass_fds`). It has no name in any folder, so
        another call's program cannot find it by looking through the state folder (under the
        daemon's own uid, and as root, file modes would not stop it); it never touches a disk,
        so no crash leaves it behind. A program that closes the descriptors it inherited before
        opening the path will not find it.
        """
        fd = os.memfd_create(f"rungd-{label}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, secret.encode())
            os.fchmod(fd, 0o600)
            if self.owner is not None:
                os.fchown(fd, *self.owner)  # /dev/fd/N is opened anew, as the program's user
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                        | fcntl.F_SEAL_WRITE)
            # A number well above what programs use, and the same in the child (pass_fds keeps it).
            high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _SECRET_FD_MIN)
        finally:
            os.close(fd)
        self.pass_fds.append(high)
        return f"/dev/fd/{high}"

    def release_secrets(self) -> None:
        """Close the daemon's copies of the credential files once the child holds its own."""
        for fd in self.pass_fds:
            os.close(fd)
        self.pass_fds.clear()

    def quiet(self) -> None:
        """The call's watch has ended: answer nothing more (the kill comes next)."""

    def _close_held(self) -> None:
        self.release_secrets()
        for conn in self._held:
            conn.close()
        self._held.clear()


class AskpassServer(_Secrets):
    """The call's private folder: the askpass socket, the script GIT_ASKPASS, SSH_ASKPASS and
    SUDO_ASKPASS point at, and credential files. Removed when the call ends.

    For a program run without a daemon (``rungd.runner.run`` on its own): a daemon's calls
    use its :class:`AskpassEndpoint` (:meth:`AskpassEndpoint.for_call`), whose programs
    cannot replace what another call runs.

    Args:
        work_dir: the call's work folder. The private folder is always made inside it, whatever
            the length of its path, because the daemon removes it when the call ends and
            start-up sweeps every work folder after a crash: credentials never land in /tmp.
    """

    def __init__(self, work_dir: Path, owner: tuple[int, int] | None = None) -> None:
        # A program run as another user (``owner``: its uid and gid) cannot reach the state
        # folder (0700): its folder is made where that user can reach it. The folder, the
        # script and the socket stay the daemon's, so that user can replace none of them
        # (another call of the same tool runs as the same user); the program works in
        # ``workdir``, a folder inside that is that user's alone (0700). Nothing here holds a
        # secret (credential files are in memory).
        super().__init__(owner)
        where = None if owner is not None else work_dir
        self.folder = Path(tempfile.mkdtemp(prefix=".rungd-", dir=where))  # unique per run
        self.workdir = self.folder
        self.socket_path = self.folder / "s"
        self.script = self.folder / "askpass"
        self.script.write_text(_HELPER)
        # sudo runs SUDO_ASKPASS as the user who invoked it, who may not be the daemon's user:
        # that user must be able to run the helper and reach the socket. That opens nothing:
        # the folder cannot be listed, holds no secret (credential files are in memory), and
        # the socket answers only this call's processes, whoever they run as.
        self.folder.chmod(0o711)
        self.script.chmod(0o755)
        self._sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # A path too long for sun_path is bound through a descriptor of its folder
            # (askpass.socket_address); binding a local path does not block.
            with askpass.socket_address(str(self.socket_path)) as address:
                self._sock._sock.bind(address)
            self.socket_path.chmod(0o666)
            if owner is not None:
                self.workdir = self.folder / "w"
                self.workdir.mkdir(mode=0o700)
                os.chown(self.workdir, *owner)
            self._sock.listen(8)
        except OSError:
            self.close()
            raise
        self.env = {
            "GIT_ASKPASS": str(self.script),
            "SSH_ASKPASS": str(self.script),
            "SSH_ASKPASS_REQUIRE": "force",
            "SUDO_ASKPASS": str(self.script),
            askpass.SOCKET_ENV: str(self.socket_path),
        }

    def claim(self, root: proctree.Member) -> None:
        """Nothing to do: this call's own socket queues what its child asks until :meth:`serve`."""

    def listen(self, root: proctree.Member, answer: Answer) -> Callable[[], Awaitable[None]]:
        """What answers this call's questions: :meth:`serve`, a task to run beside the watch."""
        return lambda: self.serve(root, answer)

    async def serve(self, root: proctree.Member, answer: Answer) -> None:
        """Answer the askpass questions of this call's processes until the call ends.

        Args:
            root: the call's child; only its descendants are heard.
            answer: gives the secret for a question, or None to refuse it.

        Cancellation: stops at once. A helper whose question was refused is still held (its
        connection stays open, unanswered) until :meth:`close`, which comes after the kill.
        """
        async with trio.open_nursery() as nursery:
            while True:
                conn, _ = await self._sock.accept()
                pid = _peer_pid(conn)
                if pid is None or not descends_from(pid, root):
                    conn.close()  # a stranger: no answer, and nothing of it enters this call
                    continue
                nursery.start_soon(_answer_one, conn, answer, self._held)

    def close(self) -> None:
        if hasattr(self, "pass_fds"):
            self._close_held()
        self._sock.close()
        if self.workdir != self.folder:
            # What the program's account made in its folder (0700 folders of its own) is out
            # of reach of a daemon that is not root: taken back first (the CAP_CHOWN that gave
            # the folder away), so no call leaves it behind.
            with contextlib.suppress(OSError):
                parent = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    _remove_given_away(parent, self.workdir.name)
                finally:
                    os.close(parent)
        remove_or_say(self.folder, "a call's private folder")


def _remove_given_away(parent: int, name: str, depth: int = 0) -> None:
    """Remove ``name`` in the folder ``parent`` though its owner is another account (what a
    program run as that account made in the working folder it was given), as a daemon that is
    not root and holds CAP_CHOWN: each folder is taken back before it is entered.

    Only folders change owner, each reached through a descriptor opened without following a
    link, so neither a link nor a hard link the program planted can turn the chown on a file
    elsewhere; files and links are unlinked, which their folder being ours allows. Deeper than
    ``_MAX_NESTING`` is left in place (a program can nest without end).
    """
    try:
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=parent)  # a file or a link: the folder holding it is ours
        return
    try:
        inode = f"/proc/self/fd/{handle}"  # this very folder, whatever is at its name by now
        os.chown(inode, os.geteuid(), os.getegid())
        os.chmod(inode, 0o700)
        folder = os.open(inode, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    finally:
        os.close(handle)
    try:
        if depth < _MAX_NESTING:
            for entry in list(os.scandir(folder)):
                _remove_given_away(folder, entry.name, depth + 1)
    finally:
        os.close(folder)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=parent)


async def _answer_one(conn: trio.socket.SocketType, answer: Answer, held: list[trio.socket.SocketType]) -> None:
    """Read one member's question and reply with its secret, or hold the connection in
    ``held`` (closed after the call's kill).

    Cancellation: stops at once; a held connection stays open until it is closed.
    """
    question = b""
    try:
        with trio.fail_after(_QUESTION_S):  # the helper sends it at once, then closes its side
            while len(question) < askpass.MAX_QUESTION and (chunk := await conn.recv(4096)):
                question += chunk
    except (OSError, trio.TooSlowError):
        conn.close()
        return
    except BaseException:  # the call ended meanwhile: nobody answers
        conn.close()
        raise
    try:
        secret = answer(question.decode("utf-8", "replace"))
    except Exception:  # a bug in the answer must cost this question its answer, never the daemon
        log.exception("askpass: answering a question failed; it is left unanswered")
        secret = None
    if secret is None:
        # No reply, not even "no": the helper holds the program until the kill. The connection
        # is held open too, up to a few per call (the helper holds on end of file as well, so
        # closing the rest answers nothing; it only keeps a call from taking every descriptor).
        if len(held) < _MAX_PER_CALL:
            held.append(conn)
        else:
            conn.close()
        return
    reply = b"OK\n" + secret.encode()
    try:
        while reply:
            reply = reply[await conn.send(reply):]
    except OSError:
        pass  # the helper died meanwhile
    finally:
        conn.close()


def _sealed_helper() -> int | None:
    """The helper script as a sealed in-memory file, or None where programs could not run it.

    Programs that run as the daemon's user can replace any file that user owns, so the
    helper every call's program runs is no file: a memfd that no write, truncation or growth
    can change (``F_SEAL_WRITE``... and ``F_SEAL_SEAL``), reached as
    ``/proc/<daemon>/fd/N``. Opening that path takes the right to read the daemon's state
    (PTRACE_MODE_READ): the same user, and every capability the daemon holds. A daemon that
    holds capabilities its programs lack (a non-root daemon given CAP_SETUID to run tools as
    their users) would be refused, and so would a host that forbids executable memfds: None,
    and the caller says so and uses a file.
    """
    if os.geteuid() != 0 and _capabilities(b"CapPrm") != 0:
        return None
    fd = os.memfd_create("rungd-askpass", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, _HELPER.encode())
        os.fchmod(fd, 0o755)
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        try:  # and its exec bits, where the kernel can (Linux 6.3)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals | _F_SEAL_EXEC)
        except OSError:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except OSError:
        os.close(fd)
        return None
    return fd


_F_SEAL_EXEC = 0x0020  # <linux/fcntl.h>; not in Python 3.11's fcntl


def installed_helper() -> Path | None:
    """The ``rungd-askpass`` script installed beside the daemon's interpreter, when root owns
    it and every folder above it (rungd.system.trust, with root as the only owner), else None.

    This is the helper for a daemon that cannot use the sealed memfd: a non-root daemon
    holding the drop-in's capabilities, as the shipped unit runs for ``user =`` tools. Its
    programs run as rungd's user or as a tool's, and neither can replace a file root owns in
    folders root owns; a script rungd's user owns is no better than one written at start.
    """
    script = Path(sys.executable).parent / "rungd-askpass"
    try:
        trust.check(script, "askpass helper", owners={0})
    except (trust.Untrusted, OSError):
        return None
    return script if os.access(script, os.X_OK) else None


def _capabilities(which: bytes) -> int:
    """This process's capability set ``which`` (b"CapPrm", b"CapEff"...), as /proc shows it."""
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(which + b":"):
                return int(line.split()[1], 16)
    return 0


class RunAsFolder:
    """Where programs run as another account work, and the askpass script they run.

    Such a program cannot reach the daemon's state folder (its own: 0700), so it works in a
    folder of /tmp, and cannot open the daemon's sealed memfd helper (``/proc/<daemon>/fd/N``
    asks for the right to read the daemon's state), so it runs a script file. Programs run as
    the daemon's own user must not be able to replace either for a call of another account:
    whatever the daemon's user owns, even for a moment, they can change (and a non-root
    daemon's user is theirs). So both are made once, as the daemon starts and before any
    program runs, and given to root: the folder (``.rungd-as-*``) sticky, writable and
    passable by all and listable by none (1733), the script in it root's (0755). A call's
    folder is made in it by the launcher as the program's account, after the switch
    (:meth:`call_folder`: a random name nobody can list or guess), so it is that account's
    from the start; :meth:`remove` takes it back (CAP_CHOWN, which a non-root daemon holds for
    ``user =`` tools) to remove it.

    Args:
        tag: names this daemon's folders (``.rungd-as-TAG-*``): what an earlier run of it left
            behind when it was killed is removed at the next start.

    Raises:
        OSError: /tmp cannot hold it, or the daemon may not give it to root.
    """

    def __init__(self, tag: str) -> None:
        prefix = f".rungd-as-{tag}-"
        _sweep(prefix)
        path = tempfile.mkdtemp(prefix=prefix)
        self._fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.path = Path(path)
        self.script = self.path / "askpass"
        try:
            script = os.open("askpass", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o755,
                             dir_fd=self._fd)
            try:
                os.write(script, _HELPER.encode())
                os.fchmod(script, 0o755)
                os.fchown(script, 0, -1)
            finally:
                os.close(script)
            os.fchmod(self._fd, 0o1733)
            os.fchown(self._fd, 0, -1)
        except OSError:
            self.close()
            raise
        # Taking a call's folder back from its account needs CAP_CHOWN (root has it unless a
        # bounding set took it away): without it, no user = call may start (it would leave
        # its folder behind).
        self.can_take_back = bool(_capabilities(b"CapEff") & 1 << _CAP_CHOWN)

    def call_folder(self) -> Path:
        """A new call's folder, not made yet: the launcher makes it as the program's account."""
        return self.path / f"c-{secrets.token_hex(16)}"

    def remove(self, folder: Path) -> None:
        """Remove a call's folder and what its account left in it (past the nesting taken
        back, what the daemon may still remove), saying what is left."""
        _remove_given_away(self._fd, folder.name)
        remove_or_say(folder, "a call's private folder")

    def close(self) -> None:
        """Remove the folder (taken back first); safe to call twice."""
        if self._fd < 0:
            return
        _remove_run_as(self._fd, self.path)
        os.close(self._fd)
        self._fd = -1


def _remove_run_as(fd: int, path: Path) -> None:
    """Take a run-as folder back (``fd``, at ``path``) and remove it and all in it."""
    with contextlib.suppress(OSError):
        os.fchown(fd, os.geteuid(), -1)
        os.fchmod(fd, 0o700)
    with contextlib.suppress(OSError):
        for entry in list(os.scandir(fd)):
            _remove_given_away(fd, entry.name)  # a file (the script) is unlinked, a folder taken back
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _sweep(prefix: str) -> None:
    """Remove the run-as folders an earlier run of this daemon left in /tmp when it was
    killed: those named ``prefix*`` that are root's or the daemon's (a folder of that name
    someone else made is not touched, nor followed if it is a link)."""
    with contextlib.suppress(OSError), os.scandir(tempfile.gettempdir()) as entries:
        for entry in entries:
            if not entry.name.startswith(prefix):
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if os.fstat(fd).st_uid in (0, os.geteuid()):
                    _remove_run_as(fd, Path(entry.path))
            finally:
                os.close(fd)


_CAP_CHOWN = 0  # <linux/capability.h>


class AskpassEndpoint:
    """The askpass endpoint of a whole daemon: one script and socket for every call, made
    once (a call would otherwise spend most of a millisecond making and removing its own).
    A program run as another account runs the script of the daemon's :class:`RunAsFolder`,
    and asks the same socket.

    Neither can be replaced by a program, though every such program runs as the daemon's
    user: the script is a sealed memfd (:func:`_sealed_helper`) and the socket an abstract
    name, in no folder. A program that could swap the script would be run by a later call's
    program, as that call, and be handed its credential. Where the memfd cannot be used, the
    script is a file in ``folder`` and the journal says that a program could replace it.

    A connection is answered by the running call its peer descends from (:func:`_ancestors`,
    the same live parent chain and start times as :func:`descends_from`), through that call's
    :class:`CallAskpass`; a peer that descends from no running call is closed unanswered. A
    call claims its child the moment the daemon learns its pid, before its program runs; a
    peer that descends from a child of the daemon no call has claimed yet (the daemon's loop
    was busy) waits for the claim, a few seconds at most. Questions are read and answered by
    tasks of the endpoint (:meth:`run`), so a call needs no task of its own for them.

    Args:
        folder: where the script is written when it cannot be a memfd: made then (0711),
            inside the daemon's work folder, which start-up sweeps.
    """

    def __init__(self, folder: Path, *, sealed: bool = True) -> None:
        self.folder = folder
        # Programs run as another account: made now, before any program runs (RunAsFolder).
        # A daemon that may not give it to root runs no user = tool, and says why per call.
        try:
            # Tagged by the state folder: one daemon per state folder, so what carries its tag
            # and is not in use was left by an earlier run of it.
            tag = hashlib.sha256(os.fsencode(folder.resolve())).hexdigest()[:8]
            self.run_as: RunAsFolder | None = RunAsFolder(tag)
        except OSError as exc:
            # Without CAP_CHOWN (the unit without its run-as drop-in) no user = tool loads anyway.
            log.info("no folder for tools run as another user (%s): such calls fail, saying why",
                     exc.strerror or exc)
            self.run_as = None
        self._script_fd = _sealed_helper() if sealed else None
        if self._script_fd is not None:
            script = f"/proc/{os.getpid()}/fd/{self._script_fd}"
        elif self.run_as is not None:
            script = str(self.run_as.script)  # root's, in a folder root owns: as safe, a file
        elif (installed := installed_helper()) is not None:
            script = str(installed)
        else:
            folder.mkdir(mode=0o711)
            script = str(folder / "askpass")
            Path(script).write_text(_HELPER)
            Path(script).chmod(0o755)
            log.warning("askpass: the helper is the file %s, which programs run as rungd's user could replace "
                        "(this daemon holds capabilities they lack, or the host forbids executable memfds, and "
                        "rungd-askpass beside its interpreter is not root's); hint: install rungd as root "
                        "(pip install into a root-owned venv), as the README's production install does", script)
        self._sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # A random abstract name: nobody can bind it first, and nobody can replace it.
            name = f"@rungd-askpass-{os.getpid()}-{secrets.token_hex(8)}"
            with askpass.socket_address(name) as address:
                self._sock._sock.bind(address)
            self._sock.listen(64)
        except OSError:
            self.close()
            raise
        self.env = {
            "GIT_ASKPASS": script,
            "SSH_ASKPASS": script,
            "SSH_ASKPASS_REQUIRE": "force",
            "SUDO_ASKPASS": script,
            askpass.SOCKET_ENV: name,
        }
        self._calls: dict[proctree.Member, CallAskpass] = {}
        # Peers of a child no call has claimed yet: (when, their chain, the connection).
        self._waiting: list[tuple[float, list[proctree.Member], trio.socket.SocketType]] = []
        self._daemon = os.getpid()
        self._nursery: trio.Nursery | None = None

    def for_call(self, owner: tuple[int, int] | None = None) -> CallAskpass:
        """A call's handle on the endpoint (its credential files, its held helpers).

        Args:
            owner: uid and gid of the account the program runs as, when not the daemon's:
                it runs the run-as folder's script and works in a folder of its own there.

        Raises:
            PermissionError: the daemon cannot take a call's folder back from another
                account (no CAP_CHOWN), or has no run-as folder: nothing may start.
        """
        if owner is not None:
            if self.run_as is None or not self.run_as.can_take_back:
                raise PermissionError(errno.EPERM, "rungd may not take a folder back from another account")
            return CallAskpass(self, owner, self.run_as)
        if self._script_fd is not None:
            # A program may take the helper's mode away (its owner may chmod the memfd, if
            # not its exec bits): that would only stop later questions, but it costs a call
            # one syscall to give it back.
            os.fchmod(self._script_fd, 0o755)
        return CallAskpass(self)

    def close(self) -> None:
        self._sock.close()
        if self._script_fd is not None:
            os.close(self._script_fd)
            self._script_fd = None
        if getattr(self, "run_as", None) is not None:
            self.run_as.close()

    def claim(self, root: proctree.Member, call: CallAskpass) -> None:
        """Send the questions of ``root`` and its descendants to ``call`` from now on."""
        self._calls[root] = call
        waiting, self._waiting = self._waiting, []
        for since, chain, conn in waiting:
            if root in chain:
                call.take(conn)
            else:
                self._waiting.append((since, chain, conn))

    def release(self, root: proctree.Member) -> None:
        self._calls.pop(root, None)

    def answer_soon(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run ``task`` (a call's answer to one question) in the endpoint's nursery."""
        assert self._nursery is not None, "a question reaches a call only through run()"
        self._nursery.start_soon(task)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept questions and hand each to the call its asker belongs to, until cancelled.

        Never ends on a failed accept (out of descriptors, say): it says so and goes on.
        """
        try:
            async with trio.open_nursery() as self._nursery:
                task_status.started()
                while True:
                    self._expire()
                    with trio.move_on_after(_WAIT_FOR_CLAIM_S if self._waiting else math.inf):
                        try:
                            conn, _ = await self._sock.accept()
                        except OSError as exc:
                            log.warning("askpass endpoint: accept failed (%s); retrying", exc.strerror or exc)
                            await trio.sleep(0.1)
                            continue
                        self._place(conn)
        finally:
            for _, _, conn in self._waiting:
                conn.close()
            self.close()

    def _place(self, conn: trio.socket.SocketType) -> None:
        pid = _peer_pid(conn)
        chain = _ancestors(pid) if pid is not None else []
        call = next((self._calls[member] for member in chain if member in self._calls), None)
        if call is not None:
            call.take(conn)
        elif any(member.pid == self._daemon for member in chain[1:]) and len(self._waiting) < _MAX_WAITING:
            self._waiting.append((time.monotonic(), chain, conn))
        else:
            conn.close()  # a stranger: no answer, and nothing of it enters any call

    def _expire(self) -> None:
        now = time.monotonic()
        keep = []
        for entry in self._waiting:
            if now - entry[0] < _WAIT_FOR_CLAIM_S:
                keep.append(entry)
            else:
                entry[2].close()  # no call claimed it: a process of a call that has ended
        self._waiting = keep


class CallAskpass(_Secrets):
    """One call's part of the daemon's :class:`AskpassEndpoint`: the same interface as
    :class:`AskpassServer` (``env``, ``pass_fds``, ``claim``, ``listen``, ``close``), without
    a folder, and without a task of its own: its questions are answered in the endpoint's."""

    folder = None

    def __init__(self, endpoint: AskpassEndpoint, owner: tuple[int, int] | None = None,
                 run_as: RunAsFolder | None = None) -> None:
        super().__init__(owner)
        self._endpoint = endpoint
        self.env = dict(endpoint.env)
        # A program run as another account: the run-as folder's script (the daemon's memfd is
        # not its to open) and a folder of its own the launcher makes as that account.
        self._run_as = run_as
        self.workdir: Path | None = None
        if run_as is not None:
            self.workdir = run_as.call_folder()
            for var in ("GIT_ASKPASS", "SSH_ASKPASS", "SUDO_ASKPASS"):
                self.env[var] = str(run_as.script)
        self._root: proctree.Member | None = None
        self._answer: Answer | None = None
        self._early: list[trio.socket.SocketType] = []  # asked before listen()
        self._answering: set[trio.CancelScope] = set()
        self._taken = 0  # questions handed to the endpoint's nursery and not ended yet
        self._quiet = False  # the watch ended: nothing more is answered

    def claim(self, root: proctree.Member) -> None:
        """The call's child is ``root``: its questions (and its descendants') come here, from
        now on, even before :meth:`listen`."""
        self._root = root
        self._endpoint.claim(root, self)

    def listen(self, root: proctree.Member, answer: Answer) -> None:
        """Answer the questions of ``root`` and its descendants with ``answer`` from now on
        (those asked since :meth:`claim` first), until :meth:`close`; as
        :meth:`AskpassServer.serve`, at most a few at once (more are closed unanswered).
        Returns None: no task to run beside the watch."""
        if self._root != root:
            self.claim(root)
        self._answer = answer
        early, self._early = self._early, []
        for conn in early:
            self.take(conn)
        return None

    def take(self, conn: trio.socket.SocketType) -> None:
        """A question of this call's processes (from the endpoint)."""
        if self._quiet or self._taken + len(self._early) >= _MAX_PER_CALL:
            conn.close()  # a call asking faster than it is heard, or one whose watch ended
        elif self._answer is None:
            self._early.append(conn)
        else:
            self._taken += 1
            self._endpoint.answer_soon(lambda: self._answer_one(conn))

    async def _answer_one(self, conn: trio.socket.SocketType) -> None:
        try:
            with trio.CancelScope() as scope:
                if self._quiet:
                    scope.cancel()
                self._answering.add(scope)
                try:
                    assert self._answer is not None
                    await _answer_one(conn, self._answer, self._held)
                finally:
                    self._answering.discard(scope)
        finally:
            self._taken -= 1

    def quiet(self) -> None:
        """The call's watch has ended (it exited, asked what nobody answers, or its deadline
        came): answer nothing more, even during the kill's grace period. Questions under way
        are dropped unanswered; helpers already held stay held until :meth:`close`."""
        self._quiet = True
        for scope in self._answering:
            scope.cancel()
        for conn in self._early:
            conn.close()
        self._early.clear()

    def close(self) -> None:
        """Leave the endpoint; stop the answers under way, close what was not answered and
        the held helpers (after the kill)."""
        if self._root is not None:
            self._endpoint.release(self._root)
        self.quiet()
        self._close_held()
        if self._run_as is not None and self.workdir is not None:
            self._run_as.remove(self.workdir)  # what the program's account left there too
            self.workdir = None


def _peer_pid(conn: trio.socket.SocketType) -> int | None:
    """The pid of the process at the other end of ``conn``, from the kernel (SO_PEERCRED)."""
    try:
        pid, _, _ = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    return pid if pid > 0 else None  # 0: a peer in a pid namespace we cannot see


def descends_from(pid: int, root: proctree.Member) -> bool:
    """Whether process ``pid`` is ``root`` or a descendant of it, by its live parent chain.

    ``root`` is the call's child, which the runner reaps only after the call ends, so its pid
    cannot be reused meanwhile; its start time is compared all the same. A descendant orphaned
    to the daemon (a double fork) is no longer in the chain and is refused: a question is
    asked by a program that waits for the answer, whose parent is alive.
    """
    return root in _ancestors(pid)


def _ancestors(pid: int) -> list[proctree.Member]:
    """Process ``pid`` and its live ancestors (at most _MAX_DEPTH), nearest first."""
    chain = []
    for _ in range(_MAX_DEPTH):
        stat = proctree.read_stat(pid)
        if stat is None:
            break
        chain.append(proctree.Member(pid, stat.start))
        if stat.ppid <= 1:
            break
        pid = stat.ppid
    return chain
