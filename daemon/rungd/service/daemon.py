"""The daemon's lifecycle: load plugins, bind the socket, serve, and stop cleanly.

    Daemon(config)          plugins loaded, tools collected (start-up errors raise here)
    await daemon.serve()    socket bound and listening, then ``task_status.started(daemon)``
    daemon.stop()           stop accepting, let calls finish within the grace period,
                            interrupt the rest, remove the socket, return
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import hashlib
import logging
import os
import resource
import signal
from pathlib import Path
from typing import Any

import trio

from rungd.system import proctree, sdnotify, trust
from rungd.system.folders import remove_or_say
from rungd.service.audit import Audit
from rungd.config import Config, load_config
from rungd.core.contract import Caller, Tool
from rungd.service.credentials import CredentialStore
from rungd.service.engine import Dispatcher
from rungd.service.engine.recovery import recover
from rungd.core.envelope import Envelope
from rungd.service.evidence import EvidenceStore
from rungd.service.gates import check_gates, is_operator
from rungd.service.ledger_upkeep import LedgerUpkeep
from rungd.service.plugins import Hooks
from rungd.runner import launch
from rungd.runner.askpass_server import AskpassEndpoint
from rungd.service.server import (Connection, ConnectionLimits, FrameBudget, Replies, bind_unix_socket,
                                  serve_connections)
from rungd.service.stepdown import StepDownWatch

log = logging.getLogger("rungd")


# The config sections a reload applies; the others (the socket, state, ledger, credentials,
# limits, ...) are read at start only.
RELOADED = ("plugins", "access", "gates")


class Daemon:
    """One running rungd.

    Args:
        config: the validated configuration.
        stand_in: the throw-away daemon of ``rungctl check`` or ``rungctl eval``'s dry run
            only (rungd.authoring.plugin_check): every tool as ``stand_in.tool(tool)`` makes
            it (deadlines cut, no gate of its own), every program a call starts through
            ``run()`` replaced by ``stand_in.program``, no import written, no observer told.

    Raises:
        PluginError: a plugin failed to load, misspelled a hook, or two plugins registered
            the same tool name.
        ConfigError: a tool file or the credentials file is invalid.
        Untrusted: the config, the signers or anchor key, or rungd's own code is not owned
            right (:func:`check_sources`). A tool file or program not owned right is no
            start-up error: its tools are left out and logged (``hooks.refused``).
    """

    def __init__(self, config: Config, *, stand_in: Any = None) -> None:
        self.config = config
        check_sources(config)
        self.hooks = Hooks.load(config)
        self.pm = self.hooks.pm
        self.tools = self.hooks.collect_tools(config)
        self._stand_in = stand_in
        if stand_in is not None:
            self.tools = {name: dataclasses.replace(reg, tool=stand_in.tool(reg.tool))
                          for name, reg in self.tools.items()}
        _log_refused(self.hooks)
        check_gates([reg.tool for reg in self.tools.values()], config)
        self.credentials = CredentialStore(config.credentials.file, self.hooks)
        self.audit: Audit | None = None
        self.socket_path = config.server.socket
        self.dispatcher: Dispatcher | None = None
        self.evidence: EvidenceStore | None = None
        self.step_downs: StepDownWatch | None = None
        self._stop = trio.Event()
        self._replies = Replies()
        self._frames = FrameBudget()
        self._limits = ConnectionLimits(config.server.max_connections, config.server.max_connections_per_uid)

    def stop(self) -> None:
        """Ask the daemon to shut down. Safe to call more than once, from the loop's thread."""
        self._stop.set()

    async def serve(self, *, task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until ``stop`` is called.

        Reports ``started`` once the socket is listening, so a caller that ``start``-ed
        it can connect at once.

        Cancellation: cancelling ``serve`` skips the grace period: calls are interrupted at
        once (their process trees are still killed) and the socket is removed.
        """
        server = self.config.server
        state = self.config.state_dir
        _private_folders(state)
        _raise_descriptor_limit()
        _out_of_reach()
        ledger = self.config.ledger
        self.audit = Audit(state / "ledger", retention_s=ledger.retention_days * 86400,
                           rotate_bytes=ledger.rotate_bytes, reserve_bytes=ledger.reserve_bytes)
        recovered = recover(self.audit, {name: reg.tool for name, reg in self.tools.items()})
        # One subtree of call cgroups per daemon, named by its state folder (one daemon per
        # state folder): a restart finds what its last run left, and no other daemon's.
        cgroup_tag = hashlib.sha256(os.fsencode(state.resolve())).hexdigest()[:12]
        proctree.sweep_cgroups(recovered, cgroup_tag)
        # Every call of an earlier run is over: sweep their work folders (and any credential
        # file a crash left in one), then make the folder anew, private.
        with contextlib.suppress(FileNotFoundError):  # one by one: what cannot go keeps nothing else
            for entry in os.scandir(state / "work"):
                remove_or_say(entry.path, "a work folder an earlier run left")
        _private_folders(state)
        sock = bind_unix_socket(self.socket_path, int(server.socket_mode, 8), server.socket_group)
        # Orphans of a call's tree (a double fork) are re-parented to us, not to init, so
        # the kill can find them and nothing outlives its call unreaped.
        if not proctree.set_child_subreaper():
            log.warning("cannot become a child subreaper; orphans of calls are tracked by tag only")
        reaper = proctree.Reaper(set())
        reaper.cgroup_tag = cgroup_tag
        try:
            async with trio.open_nursery() as housekeeping, trio.open_nursery() as calls_nursery:
                await housekeeping.start(reaper.run)
                askpass = AskpassEndpoint(state / "work" / ".askpass")
                await housekeeping.start(askpass.run)
                await housekeeping.start(sdnotify.run_watchdog)
                self.dispatcher = Dispatcher(
                    self.tools, self.config, self._observe, self.credentials, self.audit, calls_nursery,
                    reaper=reaper, askpass=askpass, stand_in=self._stand_in,
                )
                self.dispatcher.use(self.config, self.tools, self.hooks.refused)
                # Evidence is pruned by age and size at start-up and every prune_every_s,
                # in threads of its own; serving does not wait for the first prune.
                self.evidence = EvidenceStore(self.config, self.dispatcher.calls, max_frame=server.max_frame_bytes)
                await housekeeping.start(self.evidence.run)
                self.dispatcher.evidence_written = self.evidence.finished
                # Ledger anchors to the journal and retention of old ledger files.
                await housekeeping.start(LedgerUpkeep(self.audit, self.config.ledger).run)
                # Step-down observations: rebuilt from the ledger's finished records, then
                # fed every final result (_observe); admission refuses a suspended tool.
                self.step_downs = StepDownWatch(
                    self._tool_named, self.audit, suspend=self.config.step_down.suspend,
                    is_operator=lambda caller: is_operator(caller, self.config))
                await trio.to_thread.run_sync(self.step_downs.replay, state / "ledger")
                await housekeeping.start(self.step_downs.run)
                self.dispatcher.watch_step_downs(self.step_downs)
                async with trio.open_nursery() as connections:
                    accepting = trio.CancelScope()
                    connections.start_soon(self._accept, accepting, sock, connections)
                    log.info("listening on %s with %d tools", self.socket_path, len(self.tools))
                    task_status.started(self)
                    sdnotify.ready(status=f"listening on {self.socket_path} with {len(self.tools)} tools")
                    await self._stop.wait()
                    sdnotify.stopping(status="stopping: letting running calls finish")
                    log.info("stopping: no new connections; letting running calls finish")
                    accepting.cancel()  # serve_connections closes the socket on its way out
                    self._unlink_socket()
                    await self.dispatcher.shutdown(server.shutdown_grace_s)
                    with trio.move_on_after(2):  # let answers to finished calls go out
                        await self._replies.wait_quiet()
                    connections.cancel_scope.cancel()
                housekeeping.cancel_scope.cancel()
        finally:
            self._unlink_socket()
            self.audit.close()
            log.info("stopped")

    async def _accept(
        self, scope: trio.CancelScope, sock: trio.socket.SocketType, connections: trio.Nursery
    ) -> None:
        with scope:
            await serve_connections(sock, self._handle, connections)

    async def _handle(self, stream: trio.SocketStream) -> None:
        """Serve one connection behind a wall: whatever happens in it ends there.

        Cancellation: at shutdown, after calls ended; the stream is closed either way.
        """
        assert self.dispatcher is not None
        try:
            connection = Connection(stream, self.dispatcher, self.config.server, self._replies, self._frames,
                                    evidence=self.evidence)
        except OSError:  # gone before we could ask the kernel who it was
            await trio.aclose_forcefully(stream)
            return
        uid = connection.caller.uid
        refused = self._limits.admit(uid)
        if refused is not None:
            await connection.refuse(refused)
            return
        try:
            await connection.serve()
        except Exception:  # a bug may cost this connection, never the daemon or another caller
            log.exception("connection of uid %d failed", uid, extra={"caller_uid": uid})
            await trio.aclose_forcefully(stream)
        finally:
            self._limits.leave(uid)

    def _observe(self, tool: str, envelope: Envelope, caller: Caller) -> None:
        # Through self.hooks at call time: a reload swaps them. A check's or a dry run's
        # results are not the host's: the plugins' observers (a pager, a metrics push) never
        # see them.
        if self._stand_in is None:
            self.hooks.observe_result(tool, envelope, caller)
        if self.step_downs is not None:
            try:
                self.step_downs.observe(tool, envelope)
            except Exception:  # a bug here must cost a step-down signal, never a caller's answer
                log.exception("step-down evaluation failed", extra={"tool": tool, "call_id": envelope.call_id})

    def _tool_named(self, name: str) -> Tool | None:
        reg = self.tools.get(name)  # through self.tools at call time: a reload swaps them
        return reg.tool if reg is not None else None

    def reload(self) -> None:
        """Read the config file again and load the plugins and tool files it names (SIGHUP,
        ``systemctl reload rungd``).

        Its [plugins], [access] and [gates] apply at once: new calls see the new tools, who
        may call them and which gate holds them; running and held calls keep the tool and
        gate they started with, so no approval is dropped. Any other section that changed
        applies at the next start, and the journal says which. A config, plugin or tool file
        that fails to load leaves everything as it was, and the journal says why.
        """
        try:
            config = load_config(self.config.loaded_from)  # as at start: $RUNGD_SOCKET and all
            check_sources(config)
            hooks = Hooks.load(config)
            tools = hooks.collect_tools(config)
            check_gates([reg.tool for reg in tools.values()], config)
        except Exception as exc:  # whatever a plugin raises, the daemon keeps serving as before
            log.error("reload failed, nothing changed: %s", exc)
            return
        later = [f"[{name}]" for name in Config.model_fields
                 if name not in RELOADED and getattr(config, name) != getattr(self.config, name)]
        if later:
            log.warning("reload: %s changed in %s and apply at the next start only (systemctl restart rungd); "
                        "[plugins], [access] and [gates] are applied now", ", ".join(later), config.source)
        self.config = self.config.model_copy(update={name: getattr(config, name) for name in RELOADED})
        before = self.tools
        self.hooks, self.pm, self.tools = hooks, hooks.pm, tools
        _log_refused(hooks)
        self.credentials.use_plugins(hooks)
        if self.evidence is not None:
            self.evidence.config = self.config
        changes = None
        if self.dispatcher is not None:
            self.dispatcher.use(self.config, tools, hooks.refused)
            changes = self.dispatcher.note_reload(before, tools)
        log.info("reloaded %s: %d tools%s", self.config.source, len(tools), f" ({changes})" if changes else "")

    def _unlink_socket(self) -> None:
        self.socket_path.unlink(missing_ok=True)


def check_sources(config: Config) -> None:
    """Refuse a config whose own files decide what runs but are not owned right.

    The config file, ``gates.allowed_signers`` (who may approve), ``ledger.anchor_key`` and
    rungd's own code and launcher must pass :func:`rungd.system.trust.check`: unlike one tool file,
    none of them can be left out while the rest serves. A missing one is said where it is used.

    Raises:
        Untrusted: every such file that fails, one line each.
    """
    named = [(config.file, "config"), (config.gates.allowed_signers, "gates.allowed_signers"),
             (config.ledger.anchor_key, "ledger.anchor_key"), *launch.own_files()]
    problems: list[trust.Untrusted] = []
    for path, what in named:
        if path is None:
            continue
        try:
            trust.check(path, what)
        except trust.Untrusted as exc:
            problems.append(exc)
        except OSError:
            continue
    if problems:
        first = problems[0]
        raise trust.Untrusted("\n".join(str(exc) for exc in problems), path=first.path, culprit=first.culprit)


def _log_refused(hooks: Hooks) -> None:
    for problem in hooks.refused:
        log.error("refused: %s", problem)


def _private_folders(state: Path) -> None:
    """State, evidence and work folders are private by their own modes, whatever the umask.

    The state folder is 0750: the ledger inside is for the daemon's group (auditors tail it);
    evidence and work (scratch, credential files) are the daemon's alone.
    """
    for folder, mode in ((state, 0o750), (state / "ledger", 0o750), (state / "evidence", 0o700),
                         (state / "work", 0o700)):
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, mode)


def _out_of_reach() -> None:
    """Make the daemon undumpable (``PR_SET_DUMPABLE`` 0), as sshd does: a program a call runs
    as the daemon's own user could otherwise open the daemon's descriptors through
    ``/proc/<pid>/fd`` (write into another call's stdin, read its output, forge what a
    launcher's pipe says of a start) or read its memory; only a process with CAP_SYS_PTRACE
    still can. No core dump can then hold a credential either. Each program a call runs is
    dumpable again by its own exec."""
    if _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("cannot make the daemon undumpable (%s): programs running as its user could reach its "
                    "descriptors through /proc", os.strerror(ctypes.get_errno()))


_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_DUMPABLE = 4


def _raise_descriptor_limit(wanted: int = 16384) -> None:
    """Allow more open files than the usual 1,024: every connection costs one and every call
    a few (``server.max_connections`` must fit with room for calls). Not more: programs the calls run inherit it, and some still close every possible
    descriptor one by one at start."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# Every signal whose default is to end the process, and what the daemon does with it instead.
# SIGQUIT keeps its default (quit with a core dump, which the unit turns off): an operator's
# deliberate last resort.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD_SIGNALS = (signal.SIGHUP,)
IGNORED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)


async def run_until_signalled(daemon: Daemon, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully; reload on SIGHUP.

    SIGUSR1, SIGUSR2 and SIGALRM would end the process silently by default: they are caught,
    logged and ignored. Reports ``started`` once the socket is listening and the signals
    are caught.
    """
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(*STOP_SIGNALS, *RELOAD_SIGNALS, *IGNORED_SIGNALS) as signals:
            await nursery.start(daemon.serve)
            # What start-up made (tool files, plugins, the request index) lives until the next
            # reload: kept out of the collector's full passes, which walked all of it every few
            # hundred calls (a pause of tens of milliseconds). Refcounting still frees it.
            gc.freeze()
            task_status.started()
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum in RELOAD_SIGNALS:
                    log.info("received %s: reloading plugins and tool files", name)
                    daemon.reload()
                    # What the reload dropped may be cycles kept out of collection: one full
                    # pass frees them, then the new set is frozen in turn.
                    gc.unfreeze()
                    gc.collect()
                    gc.freeze()
                elif signum in IGNORED_SIGNALS:
                    log.warning("received %s: ignored (SIGTERM stops rungd, SIGHUP reloads it)", name)
                else:
                    log.info("received %s", name)
                    daemon.stop()
                    break
