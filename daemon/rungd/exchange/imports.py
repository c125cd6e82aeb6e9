"""Writing an import into a legacy program's watched folder, and proving what it took.

    importer = Importer(ImportSpec(folder=state / "inbox", row_model=InvoiceRow,
                                   lock_file=state / "locks" / "inbox.lock",
                                   taken=Taken(processed=state / "processed")), watcher=watcher)
    return await importer.run(ctx, "batch-0042.csv", rows, count=count_batch,
                              verified_by="invoices of the batch counted in a fresh export (rung 3)")

The steps, and what each one guarantees:

1. Validate every row and render the whole file in memory (BAD_INPUT before anything).
2. Take our own lock (filelock), then look for the legacy program's conventions that mean
   a person has a target open (``.~lock.NAME#``, ``NAME.lck``, an open handle): LOCKED,
   naming who, and nothing is written.
3. Count the records before, through the tool's read-back.
4. Write a temporary file in the same folder (a dot name the program ignores), fsync it,
   look at the locks once more, and rename it into place, never replacing a file. All of
   it goes through one descriptor of the import folder, opened by walking from ``/``
   with no symlink followed and checked against the roots (``safe.open_folder``): a
   folder swapped for a symlink mid-import can no longer send the file elsewhere. The
   rename is the commit point: ``ctx.mark_committed()`` runs right after it, with no
   checkpoint in between, so a deadline before it is ``not_started`` (the temporary file
   is removed) and after it ``unknown``, settled by the tool's count read.
5. Wait (watchdog) until the program has taken the file: it is gone, it is in the
   processed folder, a receipt appeared, or the count moved.
6. Count again, and report ``changed`` (all records arrived), ``no_change`` (none did:
   already there, or refused), IMPORT_PARTIAL with both counts, or UNEXPECTED_STATE when
   the count moved by more than was written.

The tool declares ``Timing(commit_point="callback", settle=...)`` so the daemon turns a
deadline into the right outcome, and ``side_effect`` other than ``read``, so every call
has a request_id, passes its gate and is in the ledger like any other write.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic
import trio
from pydantic import BaseModel, TypeAdapter

from rungd.core.contract import CallContext, Result
from rungd.core.errors import BadInput, Failed, ImportPartial, Locked, UnexpectedState
from rungd.exchange import locks, patterns, safe
from rungd.exchange.formats import Csv, Format, render
from rungd.exchange.paths import Roots, checked_name
from rungd.exchange.watch import FolderIndex, Watcher, wait_for

CountFn = Callable[[CallContext], Awaitable[int]]
RENAME_NOREPLACE = 1


@dataclasses.dataclass(frozen=True)
class Taken:
    """How to tell the program has taken an import file. Any signal that is set counts.

    Args:
        gone: the file left the import folder.
        processed: a folder the program moves taken files to (same name).
        receipt: a file the program writes when done, as a template over ``{name}`` and
            ``{stem}`` (e.g. ``"{stem}.ok"``), in ``receipt_folder`` (default: the import
            folder).
        count_changed: the tool's count read-back moved (polled every ``count_poll_s``).
        poll_s: how often to look again when no event arrives.
    """

    gone: bool = True
    processed: Path | None = None
    receipt: str | None = None
    receipt_folder: Path | None = None
    count_changed: bool = False
    poll_s: float = 0.5
    count_poll_s: float = 1.0
    # After the file is taken the program may still be writing its records: poll the count
    # this long for all of them before judging.
    settle_s: float = 1.5


@dataclasses.dataclass(frozen=True)
class ImportSpec:
    """Everything a tool declares about one import folder.

    Args:
        folder: the folder the program watches.
        row_model: the pydantic model of one record; its fields (or aliases) are the columns.
        lock_file: our filelock, outside the watched folder.
        format: the file format, dialect and encoding the program reads.
        name_pattern: a regular expression every file name must fully match.
        roots: the folders the tool may touch; defaults to the import folder, the
            processed and receipt folders, and the lock file's folder.
        conventions: the legacy lock-file conventions to respect (``locks.LIBREOFFICE``...).
        lock_targets: other files a person may have open that make an import unsafe (the
            program's own data file); the import file itself is always checked.
        open_handles: also refuse while any process holds a target open (psutil).
        taken: how to tell the program has taken the file.
        temp_prefix, temp_suffix: the temporary file's name around the final one; the
            program must ignore such names (most ignore dot files).
    """

    folder: Path
    row_model: type[BaseModel]
    lock_file: Path
    format: Format = Csv()
    name_pattern: str = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
    roots: Roots | None = None
    conventions: tuple[str, ...] = locks.DEFAULT_CONVENTIONS
    lock_targets: tuple[Path, ...] = ()
    open_handles: bool = True
    taken: Taken = Taken()
    temp_prefix: str = "."
    temp_suffix: str = ".rungd-tmp"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What an import did, read back: the counts and how the program took the file."""

    file: str
    written: int
    count_before: int
    count_after: int
    taken_by: str

    @property
    def added(self) -> int:
        return self.count_after - self.count_before

    def fields(self) -> dict[str, Any]:
        return {"file": self.file, "written": self.written, "count_before": self.count_before,
                "count_after": self.count_after, "added": self.added, "taken_by": self.taken_by}


class Importer:
    """Imports through one watched folder.

    Args:
        spec: the tool's declaration.
        watcher: watches the folders so waits wake on events; without it they poll.
    """

    def __init__(self, spec: ImportSpec, *, watcher: Watcher | None = None) -> None:
        self.spec = spec
        taken = spec.taken
        folders = [spec.folder, spec.lock_file.parent]
        folders += [f for f in (taken.processed, taken.receipt_folder) if f is not None]
        self.roots = spec.roots or Roots(*folders)
        patterns.refuse({"name_pattern": spec.name_pattern}, "ImportSpec")
        self.pattern = re.compile(spec.name_pattern)
        self.columns = [(info.validation_alias if isinstance(info.validation_alias, str) else info.alias) or name
                        for name, info in spec.row_model.model_fields.items()]
        self._adapter: TypeAdapter[Any] = TypeAdapter(list[spec.row_model])  # type: ignore[name-defined]
        self.watcher = watcher

    def render(self, rows: Sequence[BaseModel | Mapping[str, Any]]) -> bytes:
        """Validate ``rows`` against the row model and render the file the program reads.

        Raises:
            BadInput: a row does not validate, or a value cannot be written in the format.
        """
        try:
            given = [r if isinstance(r, self.spec.row_model) else r.model_dump() if isinstance(r, BaseModel) else r
                     for r in rows]
            models = self._adapter.validate_python(given)
        except pydantic.ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in err["loc"])
            raise BadInput(f"row {where}: {err['msg']}",
                           hint="every row must fit the import's row model; nothing was written") from None
        values = [[getattr(m, name) for name in self.spec.row_model.model_fields] for m in models]
        return render(self.spec.format, self.columns, values)

    async def _watch(self) -> list[FolderIndex]:
        if self.watcher is None:
            return []
        taken = self.spec.taken
        folders = [self.spec.folder, *(f for f in (taken.processed, taken.receipt_folder) if f is not None)]
        return [await self.watcher.open(await safe.run(lambda f=f: self.roots.folder(f, create=True),
                                                       what="open a folder"))
                for f in folders]

    def _open_folder(self) -> int:
        """The import folder, created if missing, held open and checked against the roots."""
        self.roots.folder(self.spec.folder, create=True)
        return safe.open_folder(self.roots, self.spec.folder)

    async def run(self, ctx: CallContext, name: str, rows: Sequence[BaseModel | Mapping[str, Any]], *,
                  count: CountFn, verified_by: str,
                  after_write: Callable[[], Awaitable[Any]] | None = None) -> Result:
        """Import ``rows`` as the file ``name`` and report what the program took.

        Args:
            ctx: the call. Its tool must declare ``commit_point="callback"``.
            name: the file name in the import folder, checked against the name pattern.
            rows: the records, validated again against the row model.
            count: the read-back: how many of the relevant records the program holds now.
            verified_by: how ``count`` reads, for the envelope.
            after_write: run right after the rename, e.g. the program's one-shot "process
                imports" run for programs that do not poll on their own.

        Returns:
            ``changed`` when the count rose by the number of records written,
            ``no_change`` when it did not move.

        Raises:
            BadInput: the name or a row is invalid; nothing was touched.
            Locked: our lock, a legacy lock file or an open handle holds the folder or a
                target, or an earlier file of the same name still waits; nothing written.
            ImportPartial: the count rose by less than was written (both counts in fields).
            UnexpectedState: the count moved by more than was written, or fell.
            OutsideRoots: a folder or the file leads outside the tool's roots.

        Cancellation: before the rename, the temporary file is removed and the outcome is
        ``not_started``. After it, the file stays for the program (it may be half taken),
        and the daemon reports ``unknown`` with the tool's settle read.
        """
        if ctx.stand_in is not None:
            # rungctl check or eval's dry run: its programs are stand-ins, and a file written
            # here would be imported for real by the real program watching the folder.
            raise Failed(f"{ctx.tool.name} writes into the real import folder {self.spec.folder}, which a check "
                         "or a dry run must not; nothing was written",
                         hint="import tools are not run against stand-ins; test them with rungd.testing and a "
                         "folder of your own (plugins/README.md, section 6)", outcome="not_started")
        spec = self.spec
        checked_name(name, self.pattern, field="name")
        if not rows:
            raise BadInput("an import needs at least one record", hint="send the records to import")
        data = self.render(rows)
        # Not abandoned: the descriptor must never be lost with its thread.
        folder = await safe.run(self._open_folder, what="open the import folder", abandon=False)
        target = spec.folder / name  # for messages and open-handle probes; writes go through ``folder``
        own = locks.OwnLock(spec.lock_file)
        temp: str | None = None
        try:
            own.acquire(ctx.call_id)
            await safe.run(self.roots.child, spec.folder, name, what="look at the import folder")
            await self._refuse_if_held(target, folder)
            if await safe.run(lambda: safe.kind_of(name, dir_fd=folder), what="look at the import folder") is not None:
                raise Locked(
                    f"an earlier {name} is still waiting in the import folder for the program to take it",
                    hint="nothing was written; retry once the program has taken the earlier file",
                    fields={"holders": [{"what": "file waiting in the import folder", "who": "the program's queue"}]},
                )
            indexes = await self._watch()
            before = await count(ctx)
            temp = f"{spec.temp_prefix}{name}.{secrets.token_hex(4)}{spec.temp_suffix}"
            await safe.run(_write_synced, folder, temp, data, what="write the import file", abandon=False)
            await self._refuse_if_held(target, folder)  # a person may have opened it while we wrote
            _rename_no_replace(folder, temp, name)
            ctx.mark_committed()  # the commit point: no checkpoint between the rename and this line
            temp = None
            with trio.CancelScope(shield=True):
                await safe.run(os.fsync, folder, what="sync the import folder", abandon=False)
            if after_write is not None:
                await after_write()
            taken_by = await self._wait_taken(ctx, target, folder, before, count, indexes)
            after = await count(ctx)
            settled_by = trio.current_time() + spec.taken.settle_s
            while after - before < len(rows) and trio.current_time() < settled_by:
                await trio.sleep(min(spec.taken.count_poll_s, 0.5))
                after = await count(ctx)
        finally:
            with trio.CancelScope(shield=True):
                if temp is not None:
                    await safe.run(_remove, folder, temp, what="remove the temporary file", abandon=False)
                own.release()
                os.close(folder)
        return judge(Outcome(name, len(rows), before, after, taken_by), verified_by)

    async def _refuse_if_held(self, target: Path, folder: int) -> None:
        spec = self.spec
        found = await locks.holders([target, *spec.lock_targets], spec.conventions, handles=spec.open_handles,
                                    dir_fd=folder)
        if found:
            raise locks.locked_error(target, found)

    async def _wait_taken(self, ctx: CallContext, target: Path, folder: int, before: int, count: CountFn,
                          indexes: list[FolderIndex]) -> str:
        taken = self.spec.taken
        processed = taken.processed / target.name if taken.processed else None
        receipt = None
        if taken.receipt:
            receipt = (taken.receipt_folder or target.parent) / taken.receipt.format(name=target.name,
                                                                                     stem=target.stem)

        def check() -> str | None:
            if receipt is not None and receipt.exists():
                return "receipt"
            if processed is not None and processed.exists():
                return "processed"
            # Looked up in the held folder: a folder swapped since cannot fake "gone".
            if taken.gone and safe.kind_of(target.name, dir_fd=folder) is None:
                return "gone"
            return None

        if not taken.count_changed:
            return await wait_for(check, indexes, poll_s=taken.poll_s)
        while True:
            with trio.move_on_after(taken.count_poll_s):
                return await wait_for(check, indexes, poll_s=taken.poll_s)
            if await count(ctx) != before:
                return "count"


def judge(outcome: Outcome, verified_by: str) -> Result:
    """Turn the counts read back into the result, or the error, the caller sees."""
    fields = outcome.fields()
    if outcome.added == outcome.written:
        return Result(fields=fields, effect="changed", verified_by=verified_by)
    if outcome.added == 0 and outcome.count_before >= outcome.written:
        # Nothing new, and the records were there already: a repeat of an import taken before.
        return Result(fields=fields, effect="no_change", verified_by=verified_by)
    if 0 <= outcome.added < outcome.written:
        raise ImportPartial(
            f"the program took {outcome.file} but added {outcome.added} of {outcome.written} records "
            f"(count {outcome.count_before} -> {outcome.count_after})",
            hint="look at the program's rejects or log for the missing records, then import only those, with a "
            "new request_id",
            outcome="done",
            fields=fields,
            effect="changed" if outcome.added else "none",
        )
    raise UnexpectedState(
        f"the count moved from {outcome.count_before} to {outcome.count_after} after writing {outcome.written} "
        "records: someone else is changing the same records",
        hint="read the records again before deciding anything",
        outcome="done",
        fields=fields,
    )


def _write_synced(folder: int, name: str, data: bytes) -> None:
    """Create ``name`` in the held ``folder`` (never an existing name, never through a
    symlink), write ``data`` and fsync it."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640, dir_fd=folder)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(folder: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass


_libc = ctypes.CDLL(None, use_errno=True)


def _rename_no_replace(folder: int, source: str, target: str) -> None:
    """Rename ``source`` to ``target`` inside the held ``folder`` atomically, failing
    (Locked) if ``target`` exists: never replace a waiting file.

    Uses renameat2(RENAME_NOREPLACE); where the filesystem lacks it, a hard link (which
    also fails on an existing name) and an unlink. One system call on a folder already
    open, so it runs in the event loop: the commit point follows it with no checkpoint.
    """
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is not None:
        if renameat2(folder, os.fsencode(source), folder, os.fsencode(target), RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            if err == errno.EEXIST:
                _remove(folder, source)
                raise Locked(f"an earlier {target} appeared in the import folder just now",
                             hint="nothing was written; retry once the program has taken the earlier file")
            raise OSError(err, os.strerror(err), target)
    try:
        os.link(source, target, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
    except FileExistsError:
        _remove(folder, source)
        raise Locked(f"an earlier {target} appeared in the import folder just now",
                     hint="nothing was written; retry once the program has taken the earlier file") from None
    _remove(folder, source)
