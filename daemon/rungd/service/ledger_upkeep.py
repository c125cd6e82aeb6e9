"""The ledger's housekeeping in the daemon: reads' records synced, anchors, and retention.

    LedgerUpkeep(audit, config).run    started in the daemon's housekeeping nursery
    sign_anchor / check_anchor_signature   ssh-keygen -Y sign / verify (argv only, no shell)

Anchors. Every ``ledger.anchor_every_s`` (and at start and stop), when the chain's head
moved, one journal entry carries ``RUNGD_LEDGER_ANCHOR=1``, ``LEDGER_SEQ``,
``LEDGER_HEAD_HASH`` and ``LEDGER_RECORD_TIME``, signed with ``ledger.anchor_key`` when one
is set (``LEDGER_ANCHOR_SIGNATURE``). The journal ships off-host; a host root who rewrites
the chain afterwards cannot rewrite the anchors already shipped, and
``rungctl ledger verify --anchors FILE`` finds the first one the copy contradicts.

Sync. Every ``FLUSH_EVERY_S``, records written without an fsync (a read's) are made durable,
if no other record's fsync did it already.

Retention. Every ``ledger.prune_every_s`` (and at start), whole files past
``ledger.keep_days`` or beyond ``ledger.max_total_bytes`` are deleted, oldest first, after a
``pruned`` record names them (``rungd_ledgers.retention``). Never a file with a record inside
``ledger.retention_days`` (the idempotency index is rebuilt from the files at start) or of a
call still running, held or unknown.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import tempfile
import time
from pathlib import Path

import trio
from rungd_ledgers import LedgerError, PruneResult, anchor_message, prune
from rungd_ledgers.anchors import SIGNATURE_NAMESPACE, Anchor

from rungd.service.audit import Audit
from rungd.config import LedgerConfig
from rungd.core.errors import RungdError
from rungd.service.gates import signing_principals, verifies

log = logging.getLogger("rungd.ledger")

SIGN_TIMEOUT_S = 10.0
# Reads' records are written without an fsync of their own (rungd.service.audit): at most this long
# passes before one makes them durable, when no write's record does it sooner.
FLUSH_EVERY_S = 1.0
_DAY = 86400.0


class LedgerUpkeep:
    """Anchors and retention for one open ledger.

    Args:
        audit: the daemon's ledger and index.
        config: the ``[ledger]`` section.
    """

    def __init__(self, audit: Audit, config: LedgerConfig) -> None:
        self.audit = audit
        self.config = config
        self._anchored_seq = 0
        # Its own threads: a prune reads whole old files and must never queue in front of
        # the ledger's appends (Audit.limiter).
        self._limiter = trio.CapacityLimiter(1)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Anchor and prune until cancelled.

        Reports ``started`` at once: the first anchor and the first prune run in the
        background, so serving never waits for them.

        Cancellation: the anchor loop sends one last anchor, shielded and bounded by
        ``SIGN_TIMEOUT_S``, so the head at shutdown leaves the host too; a prune in a
        worker thread finishes (its record and unlinks are not abandoned halfway).
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flush_loop)
            if self.config.anchor_every_s > 0:
                nursery.start_soon(self._anchor_loop)
            if self.config.keep_days is not None or self.config.max_total_bytes is not None:
                nursery.start_soon(self._prune_loop)
            task_status.started()

    async def anchor(self) -> Anchor | None:
        """Send one anchor for the current head, unless it was anchored already.

        Returns:
            The anchor sent, ``None`` when the ledger is empty or the head has not moved.

        Cancellation: may be cancelled while signing (ssh-keygen is killed); nothing is
        sent then.
        """
        # Only a durable head is shipped: a read's records wait up to a second for their fsync,
        # and an anchor that a machine crash could take back would read as tampering later.
        await self.audit.flush()
        seq, head_hash, record_time = await trio.to_thread.run_sync(lambda: self.audit.ledger.head,
                                                                    limiter=self._limiter)
        if seq == 0 or seq == self._anchored_seq:
            return None
        time_text = repr(record_time)
        signature = None
        if self.config.anchor_key is not None:
            signature = await sign_anchor(self.config.anchor_key, anchor_message(seq, head_hash, time_text))
        fields = {"RUNGD_LEDGER_ANCHOR": "1", "LEDGER_SEQ": str(seq), "LEDGER_HEAD_HASH": head_hash,
                  "LEDGER_RECORD_TIME": time_text}
        if signature is not None:
            fields["LEDGER_ANCHOR_SIGNATURE"] = signature
        log.info("ledger anchor: seq %d hash %s", seq, head_hash, extra={"journal": fields})
        self._anchored_seq = seq
        return Anchor(seq, head_hash, time_text, time.time(), signature)

    async def prune_once(self) -> None:
        """Delete the files retention allows now, and log what went and what had to stay.

        Cancellation: the worker thread is not abandoned; cancelling waits for it.
        """
        now = time.time()
        config = self.config
        index = self.audit.index

        def work() -> PruneResult:
            # Requests are remembered for the retention, while the daemon runs too, not only
            # until the next start rebuilds the index.
            index.prune(now)
            return prune(
                self.audit.ledger, now=now,
                keep_seconds=None if config.keep_days is None else config.keep_days * _DAY,
                max_total_bytes=config.max_total_bytes,
                protect_since=now - config.retention_days * _DAY,
                live_calls=index.live_call_ids(),
            )

        try:
            result = await trio.to_thread.run_sync(work, limiter=self._limiter)
        except (LedgerError, OSError) as exc:
            log.warning("ledger retention: nothing pruned this time: %s", exc)
            return
        record = result.record
        if record is not None:
            self.audit.index.apply(record)
            files = record.pruned
            log.info("ledger retention: pruned %d file(s), seq %d-%d; recorded at seq %d", len(files),
                     files[0].first_seq, files[-1].last_seq, record.seq,
                     extra={"journal": {"RUNGD_LEDGER_PRUNED": "1", "LEDGER_SEQ": str(record.seq),
                                        "LEDGER_PRUNED_THROUGH": str(files[-1].last_seq)}})
        total, kept = result.total_bytes, result.kept_because
        if config.max_total_bytes is not None and total > config.max_total_bytes and kept:
            log.warning("ledger retention: the ledger (%d bytes) stays above ledger.max_total_bytes (%d): %s; "
                        "hint: it shrinks once those records age out, or raise the bound", total,
                        config.max_total_bytes, kept)

    async def _anchor_loop(self) -> None:
        try:
            while True:
                try:
                    await self.anchor()
                except (LedgerError, OSError) as exc:
                    log.warning("ledger anchor not sent: %s", exc)
                await trio.sleep(self.config.anchor_every_s)
        finally:
            with trio.CancelScope(shield=True) as last:
                last.deadline = trio.current_time() + SIGN_TIMEOUT_S
                try:
                    await self.anchor()
                except (LedgerError, OSError) as exc:
                    log.warning("last ledger anchor not sent: %s", exc)

    async def _flush_loop(self) -> None:
        try:
            while True:
                await trio.sleep(FLUSH_EVERY_S)
                try:
                    await self.audit.flush()
                except RungdError:
                    pass  # logged by the audit; the next write's fsync tries again
        finally:
            with trio.CancelScope(shield=True), contextlib.suppress(RungdError):
                await self.audit.flush()

    async def _prune_loop(self) -> None:
        while True:
            await self.prune_once()
            await trio.sleep(self.config.prune_every_s)


async def sign_anchor(key: Path, message: bytes) -> str | None:
    """Sign ``message`` with ``ssh-keygen -Y sign`` (argv only); ``None`` and a warning on failure.

    An unsigned anchor still goes out: it is worth less than a signed one, and far more
    than none.

    Cancellation: ssh-keygen is killed and nothing is returned.
    """
    argv = ["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", SIGNATURE_NAMESPACE, "-q"]
    try:
        with trio.fail_after(SIGN_TIMEOUT_S):
            done = await trio.run_process(argv, stdin=message, capture_stdout=True, capture_stderr=True,
                                          check=False)
    except (OSError, trio.TooSlowError) as exc:
        log.warning("ledger anchor sent unsigned: ssh-keygen could not run (%s); hint: install openssh-client",
                    exc)
        return None
    if done.returncode != 0:
        log.warning("ledger anchor sent unsigned: ssh-keygen could not sign with %s: %s; hint: check "
                    "ledger.anchor_key names a private key the daemon may read", key,
                    done.stderr.decode(errors="replace").strip())
        return None
    return done.stdout.decode("ascii", "replace")


def check_anchor_signature(allowed_signers: Path, anchor: Anchor) -> str | None:
    """Check an anchor's signature; return the signer's principal, ``None`` if it is not good.

    Blocking (``ssh-keygen -Y find-principals`` then ``-Y verify``, argv only, 10 s each).

    Raises:
        OSError: ssh-keygen cannot be run.
    """
    if anchor.signature is None or anchor.time is None:
        return None
    with tempfile.TemporaryDirectory(prefix="rungctl-anchor-") as folder:
        sig = Path(folder) / "anchor.sig"
        sig.write_text(anchor.signature, encoding="ascii", errors="replace")
        try:
            principals = signing_principals(allowed_signers, sig)
            message = anchor_message(anchor.seq, anchor.hash, anchor.time)
            if principals and verifies(allowed_signers, principals[0], sig, message, SIGNATURE_NAMESPACE):
                return principals[0]
        except subprocess.TimeoutExpired:
            pass
    return None
