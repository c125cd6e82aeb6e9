"""Reading a legacy program's export: the newest complete file, checked, typed, filtered, capped.

    export = Export(ExportSpec(folder=state / "exports", pattern=r"invoices-\\d{8}T\\d{6}Z\\.csv",
                               row_model=Invoice, format=Csv(delimiter=";", encoding="cp1252"),
                               max_age_s=86400), watcher=watcher)
    read = await export.read(ctx, filters=[Filter("status", "eq", "open")], cap=20)
    return read.result(narrow="add customer or date_from")

What ``read`` does, in order, before any row is returned:

1. Locate the newest file whose name matches the pattern (the watch index when there is
   one, else one listing), inside the tool's roots.
2. Wait until it is complete: size and mtime unchanged for ``stable_s``, no writer lock
   file, the done-marker present if the tool names one, and no process holding it open
   for writing. A half-written export is never read.
3. Check the header against the row model: SURFACE_CHANGED with the diff.
4. Take ``as_of`` from the mtime, the file name or a preamble line; STALE_EXPORT (or a
   ``stale`` flag) when it is older than ``max_age_s``.
5. Stream the rows in batches in worker threads: validate and type them (bad rows counted
   and sampled), filter them, keep at most ``cap`` for the answer and write every match to
   an evidence file for a program to read. Memory stays flat whatever the file's size.

If the file changes while it is read, the read fails rather than mixing two exports.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import errno
import fnmatch
import json
import os
import re
import stat
import threading
import time
import zoneinfo
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
import trio
from pydantic import BaseModel

from rungd.core.contract import CallContext, Result
from rungd.core.errors import NextAction, Retry, StaleExport, SurfaceChanged, UnexpectedState
from rungd.exchange import locks, patterns, safe
from rungd.exchange.formats import Csv, Format, JsonLines, Limits, Reader, Stopped, open_reader
from rungd.exchange.paths import Roots
from rungd.exchange.rows import BadRow, Binding, Filter, Predicate, RowSchema
from rungd.exchange.watch import FolderIndex, Watcher, changed, wait_for

BATCH = 1000
STEP_BATCHES = 64  # batches per worker-thread hop: about 50 ms of work between checkpoints
BAD_KEPT = 1000  # bad rows kept for the evidence file; all are counted


@dataclasses.dataclass(frozen=True)
class Complete:
    """When an export file counts as completely written.

    Args:
        stable_s: size and mtime must stay unchanged this long.
        lock_names: lock files a writer keeps beside the export while writing, as
            templates over ``{name}`` and ``{stem}`` (e.g. ``"{name}.lck"``).
        done_marker: a file the writer creates when it has finished, e.g. ``"{stem}.done"``.
        open_handles: no process may hold the file open for writing (psutil).
        poll_s: how often to look again when no event arrives.
    """

    stable_s: float = 1.0
    lock_names: tuple[str, ...] = ()
    done_marker: str | None = None
    open_handles: bool = True
    poll_s: float = 0.2


@dataclasses.dataclass(frozen=True)
class AsOf:
    """Where the time of an export's data comes from.

    Args:
        source: ``mtime`` (the file's modification time), ``name`` (a timestamp in the
            file name) or ``preamble`` (a line before the header, e.g. "Exported 2024-05-01
            10:00").
        pattern: for ``name`` and ``preamble``, a regular expression whose first group is
            the timestamp.
        format: a ``strptime`` format for that group; None reads ISO 8601.
        tz: the zone of a timestamp without one (an IANA name); None is the host's zone.
    """

    source: Literal["mtime", "name", "preamble"] = "mtime"
    pattern: str | None = None
    format: str | None = None
    tz: str | None = None


@dataclasses.dataclass(frozen=True)
class ExportSpec:
    """Everything a tool declares about one export.

    Args:
        folder: where the program writes its exports (inside ``roots``).
        pattern: a regular expression a file name must fully match (``glob("stock-*.csv")``
            turns a shell pattern into one; ``re.escape(name)`` names one fixed file).
        row_model: the pydantic model of one row; its fields (or aliases) are the columns.
        format: the file format, dialect and encoding.
        roots: the folders the tool may touch; defaults to ``folder`` alone.
        complete: when a file counts as completely written.
        as_of: where the data's time comes from.
        max_age_s: how old the data may be; None accepts any age.
        stale: ``refuse`` (STALE_EXPORT) or ``flag`` (rows returned with ``stale: true``).
        stale_hint: what to tell a caller whose export is stale (or missing).
        stale_retry, stale_next_action: what STALE_EXPORT tells the caller to do: the
            tool decides (``repair`` when an input such as ``fresh=true`` helps).
        extra_columns: whether columns the model does not know change the surface.
        newest_by: ``mtime`` or ``name`` (for names that sort by time).
        max_bad_rows: more bad rows than this is SURFACE_CHANGED; None only counts them.
        bad_samples: bad rows quoted in the answer.
        evidence: the format of the evidence file holding every matching row.
        limits: the longest line, widest header and largest file read; beyond them the
            read is SURFACE_CHANGED naming the limit.
    """

    folder: Path
    pattern: str
    row_model: type[BaseModel]
    format: Format = Csv()
    roots: Roots | None = None
    complete: Complete = Complete()
    as_of: AsOf = AsOf()
    max_age_s: float | None = None
    stale: Literal["refuse", "flag"] = "refuse"
    stale_hint: str = "ask the program for a fresh export, or wait for its next scheduled one"
    stale_retry: Retry = "no"
    stale_next_action: NextAction = "stop"
    extra_columns: Literal["refuse", "ignore"] = "refuse"
    newest_by: Literal["mtime", "name"] = "mtime"
    max_bad_rows: int | None = None
    bad_samples: int = 5
    evidence: Literal["csv", "jsonl"] = "csv"
    limits: Limits = Limits()


@dataclasses.dataclass
class ExportRead:
    """What one read of an export found.

    Attributes:
        export: the file's name (never its path).
        as_of: the data's time, ISO 8601 in UTC.
        age_s: how old that was when read.
        stale: older than the tool allows (only with ``stale="flag"``).
        rows: the first matching rows, typed and JSON-ready, at most the cap.
        matched: how many rows passed the filters.
        scanned: how many records the file held.
        bad_rows: how many records were rejected; ``bad_samples`` quotes the first ones.
        evidence: the evidence ids of the full result (and of the bad rows, if any).
        encoding: the encoding the file was read with.
    """

    export: str
    as_of: str
    age_s: float
    stale: bool
    rows: list[dict[str, Any]]
    matched: int
    scanned: int
    bad_rows: int
    bad_samples: list[dict[str, Any]]
    evidence: list[str]
    encoding: str

    @property
    def truncated(self) -> bool:
        return self.matched > len(self.rows)

    def fields(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "returned": len(self.rows),
            "matched": self.matched,
            "scanned": self.scanned,
            "bad_rows": self.bad_rows,
            "bad_samples": self.bad_samples,
            "export": self.export,
            "stale": self.stale,
        }

    def result(self, *, narrow: str = "add filters") -> Result:
        """The tool's Result: fields, as_of, truncated with how to narrow, evidence."""
        hint = None
        if self.truncated:
            hint = (f"{self.matched} rows matched and {len(self.rows)} are returned; {narrow}, or read all of "
                    f"them with the evidence request (rungctl evidence {self.evidence[0]} --all)")
        return Result(fields=self.fields(), as_of=self.as_of, truncated=self.truncated, narrow=hint,
                      evidence=list(self.evidence))


def glob(pattern: str) -> str:
    """A shell pattern (``invoices-*.csv``) as the regular expression ``ExportSpec`` takes."""
    return fnmatch.translate(pattern)


def _utc(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class Export:
    """One export a tool reads, with its compiled row schema and (optionally) a watch.

    Args:
        spec: the tool's declaration.
        watcher: watches the export folder so locating the newest file is a lookup and
            waits wake on events; without it the folder is listed on each read.
    """

    def __init__(self, spec: ExportSpec, *, watcher: Watcher | None = None) -> None:
        self.spec = spec
        self.roots = spec.roots or Roots(spec.folder)
        patterns.refuse({"pattern": spec.pattern, "as_of.pattern": spec.as_of.pattern}, "ExportSpec")
        self.pattern = re.compile(spec.pattern)
        self.schema = RowSchema(spec.row_model)
        self.watcher = watcher

    async def index(self) -> FolderIndex | None:
        """The watch index of the export folder, opened on first use (None without a watcher).

        Cancellation: the first opening lists the folder in a worker thread; a cancelled
        caller does not wait for it.
        """
        if self.watcher is None:
            return None
        return await self.watcher.open(await self._folder())

    async def _folder(self) -> Path:
        return await safe.run(lambda: self.roots.folder(self.spec.folder, create=True), what="open the export folder")

    async def newest(self) -> Path | None:
        """The newest file matching the pattern, complete or still being written; None if none.

        With a watch this is a lookup in the index (plus a ``stat`` of files being
        written); without one, a listing of the folder in a worker thread.

        Raises:
            OutsideRoots: the folder or the file leads outside the tool's roots.

        Cancellation: safe at any point; nothing is changed.
        """
        folder = await self._folder()
        index = await self.index()
        if index is not None:
            by_name = self.spec.newest_by == "name"
            entry = index.newest(self.pattern, by=self.spec.newest_by)
            writing = index.writing(self.pattern)

            def pick() -> str | None:
                candidates = [((entry.name if by_name else entry.mtime_ns, entry.name), entry.name)] if entry else []
                # A newer export being written right now is the one to wait for, not to skip.
                for name in writing:
                    try:
                        st = os.lstat(folder / name)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                        candidates.append(((name if by_name else st.st_mtime_ns, name), name))
                return max(candidates)[1] if candidates else None

            def catch_up() -> str | None:
                # The index hears of a new file a moment after it appears (the watch's own
                # thread): a folder changed after its newest known export may hold one it has
                # not heard of yet, being written right now. Then the folder is listed.
                if entry is None or os.stat(folder).st_mtime_ns > entry.mtime_ns:
                    return self._scan_newest(folder)
                return entry.name

            name = await safe.run(pick if writing else catch_up, what="look at the export folder")
        else:
            name = await safe.run(self._scan_newest, folder, what="list the export folder")
        return await safe.run(self.roots.child, folder, name, what="look at the export") if name else None

    def _scan_newest(self, folder: Path) -> str | None:
        best: tuple[Any, str] | None = None
        with os.scandir(folder) as it:
            for item in it:
                if not self.pattern.fullmatch(item.name):
                    continue
                try:
                    if not (item.is_file(follow_symlinks=False) or item.is_symlink()):
                        continue  # a FIFO, socket, device or folder is never an export
                    key = item.stat(follow_symlinks=False).st_mtime_ns if self.spec.newest_by == "mtime" else 0
                except FileNotFoundError:
                    continue
                candidate = ((key, item.name), item.name)
                if best is None or candidate[0] > best[0]:
                    best = candidate
        return best[1] if best else None

    async def wait_newer(self, than: Path | None, trigger: Callable[[], Awaitable[Any]]) -> Path:
        """Ask the program for a fresh export and wait until a newer file appears.

        Args:
            than: the newest file before asking (``await export.newest()``).
            trigger: asks for it: runs the program through ``rungd.runner``, or writes the
                trigger file the program polls.

        Returns:
            The new file. It may still be being written; ``read`` waits for it.

        Cancellation: the call's deadline ends the wait; nothing needs undoing.
        """
        index = await self.index()  # opened first, so the new file's events are not missed

        def seen() -> tuple[str, int] | None:
            try:
                return (than.name, os.lstat(than).st_mtime_ns) if than is not None else None
            except FileNotFoundError:
                return None

        before = await safe.run(seen, what="look at the export folder")
        await trigger()

        def newer(names: Sequence[str]) -> Path | None:
            for name in names:
                try:
                    mtime = os.lstat(self.spec.folder / name).st_mtime_ns
                except FileNotFoundError:
                    continue
                if before is None or (name != before[0] and mtime >= before[1]) or mtime > before[1]:
                    return self.roots.child(self.spec.folder, name)
            return None

        if index is not None:
            def check() -> Path | None:
                entry = index.newest(self.pattern, by=self.spec.newest_by)
                return newer(([entry.name] if entry else []) + index.writing(self.pattern))

            return await wait_for(check, [index], poll_s=self.spec.complete.poll_s)
        while True:
            found = await safe.run(self._scan_newest, self.spec.folder, what="list the export folder")
            if (path := await safe.run(newer, [found] if found else [], what="look at the export")) is not None:
                return path
            await trio.sleep(self.spec.complete.poll_s)

    async def read(self, ctx: CallContext, *, filters: Sequence[Filter] = (), cap: int = 20,
                   cap_bytes: int = 2400, path: Path | None = None) -> ExportRead:
        """Read the newest complete export (or ``path``), check it, filter it, cap it.

        Args:
            ctx: the call; evidence files are created through it.
            filters: typed conditions, all of which a row must meet.
            cap: at most this many rows in the answer.
            cap_bytes: and at most about this many bytes of them (JSON), so the envelope
                keeps its other fields.
            path: a file ``wait_newer`` returned, instead of the newest.

        Raises:
            StaleExport: there is no export yet, or it is older than ``max_age_s``.
            SurfaceChanged: the header differs from the row model (no row was read), the
                file no longer decodes or parses, or more rows are bad than allowed.
            UnexpectedState: the file changed while it was being read.
            OutsideRoots: the file leads outside the tool's roots.
            BadInput: a filter's value is not valid for its field.

        Cancellation: the deadline may end the wait for completeness or the read between
        two batches (a batch in a worker thread finishes first); the file is closed, and
        the evidence written so far stays on disk, listed in the call's envelope.
        """
        predicate = Predicate(self.schema, filters)
        for _ in range(3):
            target = path or await self.newest()
            if target is None:
                raise StaleExport(
                    f"there is no export matching {self.spec.pattern!r} yet",
                    hint=self.spec.stale_hint,
                    retry=self.spec.stale_retry,
                    next_action=self.spec.stale_next_action,
                )
            try:
                # Until just before the deadline, to say why: a writer that stopped mid-export
                # leaves a file that never completes, and the deadline alone would say nothing.
                with trio.move_on_at(ctx.deadline - 0.5) as waiting:
                    st = await self.wait_complete(target)
                if waiting.cancelled_caught:
                    raise StaleExport(f"the newest export {target.name} was still not complete at the call's "
                                      f"deadline: {await safe.run(self._incomplete, target, what='look at the export')}",
                                      hint="a writer still at work, or one that stopped mid-export; if it stays so "
                                      "the operator must finish or remove that file; retry later",
                                      retry="yes", next_action="retry_later")
                return await self._read(ctx, target, st, predicate, cap, cap_bytes)
            except FileNotFoundError:
                if path is not None:
                    break
                continue  # rotated away while we waited: take the newest again
        raise UnexpectedState(
            "the export disappeared while it was being read",
            hint="the program may be rotating its exports; retry in a moment",
            retry="yes",
            next_action="retry_later",
        )

    async def wait_complete(self, path: Path) -> os.stat_result:
        """Wait until ``path`` is completely written; return its final ``stat``.

        Raises:
            FileNotFoundError: it vanished while we waited.

        Cancellation: safe at any point; the call's deadline bounds the wait.
        """
        complete = self.spec.complete
        index = await self.index()
        await safe.run(self.roots.check, path, what="look at the export")
        settled: tuple[tuple[int, int, int], float] | None = None
        while True:
            st, unlocked = await safe.run(self._probe, path, what="look at the export")
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            now = time.monotonic()
            if settled is None or settled[0] != key:
                settled = (key, now)
            ready = now - settled[1] >= complete.stable_s and unlocked
            if ready and complete.open_handles:
                ready = not await locks.holders([path], (), handles=True, writers_only=True)
                if ready and (await safe.run(_stat, path, what="look at the export")).st_mtime_ns != st.st_mtime_ns:
                    ready = False
            if ready:
                return st
            remaining = max(0.0, complete.stable_s - (now - settled[1]))
            wake = min(complete.poll_s, remaining) if remaining > 0 else complete.poll_s
            if index is not None:
                await changed([index], wake)
            else:
                await trio.sleep(wake)

    def _probe(self, path: Path) -> tuple[os.stat_result, bool]:
        """The export's ``stat``, and whether no lock file or missing done-marker says it is
        still being written. Blocking (a few ``stat`` calls): run it in a worker thread.

        Raises:
            NotAFile: it is (or leads to) a FIFO, socket, device, folder, or a symlink loop
                or dangling symlink.
            FileNotFoundError: it is gone.
        """
        st = _stat(path)
        return st, self._being_written(path) is None

    def _being_written(self, path: Path) -> str | None:
        """What says ``path`` is still being written (a lock file, a missing done-marker), in
        words; None when nothing does. Blocking: run it in a worker thread."""
        complete = self.spec.complete
        if complete.lock_names and locks.lock_files(path, complete.lock_names):
            return "a writer's lock file is beside it"
        if complete.done_marker:
            marker = path.with_name(complete.done_marker.format(name=path.name, stem=path.stem))
            if safe.kind_of(marker) is None:
                return f"its done marker {marker.name} is missing"
        return None

    def _incomplete(self, path: Path) -> str:
        """Why ``path`` does not count as complete now, in words. Blocking: run it in a
        worker thread."""
        return self._being_written(path) or (f"it kept changing for less than {self.spec.complete.stable_s:g} s "
                                             "at a time, or a process held it open to write")

    def _open(self, path: Path, st: os.stat_result) -> int:
        """Open the export found complete, never blocking; check what was opened.

        Raises:
            NotAFile: it is no longer a regular file.
            OutsideRoots: what was opened lies outside the roots.
            FileNotFoundError: it was replaced since it was found complete.
        """
        # Follow a symlink only when it is one the roots check let through.
        fd = safe.open_regular(path, follow=os.path.islink(path))
        try:
            self.roots.check_open(fd, path)
            if os.fstat(fd).st_ino != st.st_ino:
                raise FileNotFoundError(path)  # replaced since it was found complete: take the newest again
        except BaseException:
            os.close(fd)
            raise
        return fd

    async def _read(self, ctx: CallContext, path: Path, st: os.stat_result, predicate: Predicate, cap: int,
                    cap_bytes: int) -> ExportRead:
        # Not abandoned: a descriptor must never be lost with its thread.
        fd = await safe.run(self._open, path, st, what="open the export", abandon=False)
        scan = _Scan(self, path, fd, predicate, cap, cap_bytes)
        try:
            await scan.hop(scan.open)  # the header is checked here, before any row
            as_of, age = await scan.hop(self._as_of, path, st, scan.preamble)
            stale = self.spec.max_age_s is not None and age > self.spec.max_age_s
            if stale and self.spec.stale == "refuse":
                raise StaleExport(
                    f"the newest export ({path.name}) holds data as of {as_of}, {_age(age)} old; the tool accepts "
                    f"at most {_age(self.spec.max_age_s or 0)}",
                    hint=self.spec.stale_hint,
                    retry=self.spec.stale_retry,
                    next_action=self.spec.stale_next_action,
                    fields={"export": path.name, "as_of": as_of, "age_s": round(age)},
                )
            evidence_id, evidence_path = ctx.evidence_path(f"rows.{self.spec.evidence}")
            await scan.hop(scan.start_evidence, evidence_path)
            while not await scan.hop(scan.step, STEP_BATCHES):
                pass
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(scan.close, limiter=safe.limiter())
        final = scan.final
        if final is None or (final.st_size, final.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            raise UnexpectedState(
                f"{path.name} changed while it was being read",
                hint="the program rewrote its export in place; retry: the next read waits for it to settle",
                retry="yes",
                next_action="retry_later",
            )
        evidence = [evidence_id]
        if scan.bad_kept:
            bad_id, bad_path = ctx.evidence_path("bad_rows.jsonl")
            await trio.to_thread.run_sync(_write_bad, bad_path, scan.bad_kept, scan.bad_count, limiter=safe.limiter())
            evidence.append(bad_id)
        return ExportRead(
            export=path.name, as_of=as_of, age_s=age, stale=stale, rows=scan.rows, matched=scan.matched,
            scanned=scan.scanned, bad_rows=scan.bad_count,
            bad_samples=[b.sample() for b in scan.bad_kept[: self.spec.bad_samples]],
            evidence=evidence, encoding=scan.encoding,
        )

    def _as_of(self, path: Path, st: os.stat_result, preamble: list[str]) -> tuple[str, float]:
        rule = self.spec.as_of
        if rule.source == "mtime":
            ts = st.st_mtime
        else:
            text = path.name if rule.source == "name" else "\n".join(preamble)
            match = re.search(rule.pattern or r"(.+)", text, re.MULTILINE)
            if match is None:
                raise SurfaceChanged(
                    f"the {rule.source} of {path.name} no longer holds the export time the tool looks for",
                    hint=f"expected a match for {rule.pattern!r} in {text[:120]!r}; a person must update the tool",
                    outcome="done",
                )
            ts = self._parse_time(match.group(1), path.name)
        return _utc(ts), max(0.0, time.time() - ts)

    def _parse_time(self, text: str, name: str) -> float:
        rule = self.spec.as_of
        try:
            when = (datetime.datetime.strptime(text, rule.format) if rule.format
                    else datetime.datetime.fromisoformat(text))
        except ValueError:
            raise SurfaceChanged(
                f"the export time {text!r} in {name} does not parse",
                hint=f"expected {rule.format or 'ISO 8601'}; a person must update the tool",
                outcome="done",
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=zoneinfo.ZoneInfo(rule.tz)) if rule.tz else when.astimezone()
        return when.timestamp()


def _stat(path: Path) -> os.stat_result:
    """``stat`` of an export, following a symlink; anything but a regular file is NOT_A_FILE."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise safe.NotAFile(f"{path.name!r} in the tool's folder is a symlink to nothing") from None
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise safe.not_a_file(path.name, None) from None
        raise
    if not stat.S_ISREG(st.st_mode):
        raise safe.not_a_file(path.name, st.st_mode)
    return st


def _age(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds:.0f} s"


def _write_bad(path: Path, bad: list[BadRow], total: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row.sample(), ensure_ascii=False) + "\n" for row in bad)
        if total > len(bad):
            f.write(json.dumps({"note": f"{total - len(bad)} more bad rows were counted, not kept"}) + "\n")


class _Scan:
    """One pass over an export, run step by step in worker threads.

    Holds the open file, the bound schema, the answer rows and the evidence writer; each
    ``step`` handles a bounded number of batches so the Trio side can be cancelled between.
    A hop is abandoned at once when the call is cancelled; ``stop`` then makes the thread
    end at its next read or batch, and ``close`` waits for it (bounded) before closing the
    file, so a deadline ends a read of any size within about one batch.
    """

    def __init__(self, export: Export, path: Path, fd: int, predicate: Predicate, cap: int, cap_bytes: int) -> None:
        self.export = export
        self.spec = export.spec
        self.path = path
        self.fd = fd
        self.predicate = predicate
        self.cap = cap
        self.cap_bytes = cap_bytes
        self.final: os.stat_result | None = None  # the file as it was when we finished
        self.preamble: list[str] = []
        self.encoding = ""
        self.reader: Reader | None = None
        self.binding: Binding | None = None
        self.rows: list[dict[str, Any]] = []
        self.row_bytes = 0
        self.matched = 0
        self.scanned = 0
        self.bad_count = 0
        self.bad_kept: list[BadRow] = []
        self._context: Any = None
        self._fd_given = False
        self._batches: Any = None
        self._out: Any = None
        self._write: Callable[[Any], Any] | None = None
        self._plain = False
        self._encode = msgspec.json.Encoder().encode
        self.stop = threading.Event()
        self._busy = threading.Lock()  # held by the thread of the current hop

    async def hop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one step of the scan in a worker thread of rung 3's limiter.

        Raises:
            SurfaceChanged: the step found the export changed (or past a limit).

        Cancellation: the thread is abandoned at once and told to stop; it ends at its next
        read or batch, and ``close`` waits for it.
        """

        def guarded() -> Any:
            with self._busy:
                if self.stop.is_set():
                    raise Stopped
                return fn(*args)

        try:
            return await trio.to_thread.run_sync(guarded, abandon_on_cancel=True, limiter=safe.limiter())
        except trio.Cancelled:
            self.stop.set()
            raise

    def open(self) -> None:
        """Open the file, read preamble and header, bind the schema (SurfaceChanged here)."""
        fmt = self.spec.format
        context = open_reader(fmt, self.path, fd=self.fd, limits=self.spec.limits, stop=self.stop)
        self._fd_given = True  # from here on the reader closes the file, even if opening fails
        self.reader = context.__enter__()
        self._context = context
        self.binding = self.export.schema.bind(
            self.reader.header, extra=self.spec.extra_columns, where=self.path.name,
            text=not isinstance(fmt, JsonLines),
        )
        self.preamble = self.reader.preamble
        self.encoding = self.reader.encoding
        self._batches = self.reader.batches(BATCH, width=self.binding.width)

    def start_evidence(self, path: Path) -> None:
        """Open the evidence file every matching row goes to."""
        self._out = open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115 - closed in close()
        fmt = self.spec.format
        self._plain = isinstance(fmt, Csv) and fmt.delimiter == ","
        if self.spec.evidence == "csv":
            writer = csv.writer(self._out)
            writer.writerow(self.export.schema.names)
            self._write = writer.writerows
        else:
            self._write = None

    def step(self, batches: int) -> bool:
        """Handle up to ``batches`` batches; True when the file is done."""
        assert self.binding is not None and self._batches is not None
        for _ in range(batches):
            if self.stop.is_set():
                raise Stopped
            batch = next(self._batches, None)
            if batch is None:
                return True
            checked = self.binding.check(batch, self.scanned + 1)
            self.scanned += len(batch)
            if checked.bad:
                self._count_bad(checked.bad)
            keep = self.predicate.apply(checked)
            if not keep:
                continue
            self.matched += len(keep)
            room = self.cap - len(self.rows)
            if room > 0 and self.row_bytes < self.cap_bytes:
                for i in keep[:room]:
                    row = checked.row(i)
                    self.row_bytes += len(self._encode(row))
                    if self.row_bytes > self.cap_bytes and self.rows:
                        self.row_bytes = self.cap_bytes
                        break
                    self.rows.append(row)
            if self._write is not None:
                if self._plain and checked.plain:
                    # Plain cells hold no quote, comma or line break: as lines, they are
                    # exactly what csv.writer would write, at a fraction of its cost.
                    self._out.write("\r\n".join(checked.lines(keep)) + "\r\n")
                else:
                    self._write(checked.raw(keep))
            else:
                self._out.write("".join(self._encode(checked.row(i)).decode() + "\n" for i in keep))
        return False

    def _count_bad(self, bad: list[BadRow]) -> None:
        self.bad_count += len(bad)
        room = BAD_KEPT - len(self.bad_kept)
        if room > 0:
            self.bad_kept.extend(bad[:room])
        limit = self.spec.max_bad_rows
        if limit is not None and self.bad_count > limit:
            first = self.bad_kept[0]
            raise SurfaceChanged(
                f"more than {limit} records of {self.path.name} do not fit the row model (first: record "
                f"{first.record}, {first.column or 'shape'}: {first.message})",
                hint="the program's export changed in a way the header does not show; a person must compare a "
                "row with the tool's row model",
                outcome="done",
                fields={"bad_rows": self.bad_count, "bad_samples": [b.sample() for b in self.bad_kept[:3]]},
            )

    def close(self) -> None:
        """Close the evidence file and the export, once no hop's thread uses them.

        A thread still busy after the stop flag (a read stuck in the kernel) keeps the
        file: closing a descriptor another thread reads could close a reused number.
        """
        self.stop.set()
        if not self._busy.acquire(timeout=safe.FILE_OP_S):
            return
        try:
            self._close()
        finally:
            self._busy.release()

    def _close(self) -> None:
        if self._out is not None:
            self._out.close()
        try:
            self.final = os.fstat(self.fd)
        except OSError:
            self.final = None
        if self._context is not None:
            self._context.__exit__(None, None, None)
        elif not self._fd_given:
            os.close(self.fd)
