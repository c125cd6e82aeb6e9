"""The daemon anchors its ledger to the journal, signed; `rungctl ledger verify --anchors`
passes the real ledger and catches one rewritten consistently after the anchors left."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import trio
from rungd_ledgers import GENESIS, iter_records, verify
from rungd_ledgers.chain import seal

from rungd.config import load_config
from rungd.service.journal import JournalHandler
from rungd.testing import start_daemon, write_config
from tests.service.test_journal import parse_entry

RUNGCTL = [sys.executable, "-m", "rungd.ctl"]


@pytest.fixture
def anchor_key(short_tmp: Path) -> tuple[Path, Path]:
    if shutil.which("ssh-keygen") is None:
        pytest.skip("signed anchors need ssh-keygen (openssh-client), and it is not installed")
    key = short_tmp / "anchor_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rungd-anchor", "-f", str(key)], check=True)
    signers = short_tmp / "allowed_signers"
    signers.write_text("rungd-anchor " + (short_tmp / "anchor_key.pub").read_text())
    return key, signers


async def rungctl(*args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process([*RUNGCTL, *args], capture_stdout=True, capture_stderr=True, check=False,
                                  env={**os.environ, "RUNGD_CONFIG": ""})


def rewrite(folder: Path, seq: int) -> None:
    """What a host root can do: change one record and re-seal every record after it."""
    records = list(iter_records(folder))
    prev, lines = GENESIS, []
    for record in records:
        draft = msgspec.structs.replace(record, note="rewritten") if record.seq == seq else record
        sealed, line = seal(draft, seq=record.seq, prev=prev, time=record.time)
        prev = sealed.hash
        lines.append(line)
    for path in folder.glob("ledger-*.jsonl"):
        path.unlink()
    (folder / "ledger-000001.jsonl").write_bytes(b"".join(lines))


async def test_signed_anchors_reach_the_journal_and_catch_a_rewritten_ledger(
        short_tmp: Path, anchor_key: tuple[Path, Path]) -> None:
    key, signers = anchor_key
    journal = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await journal.bind(str(short_tmp / "journal.sock"))
    handler = JournalHandler(short_tmp / "journal.sock")
    logger = logging.getLogger("rungd.ledger")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    config = load_config(write_config(short_tmp, f"[ledger]\nanchor_every_s = 0.2\nanchor_key = \"{key}\"\n"))
    folder = config.state_dir / "ledger"
    anchors: list[dict[str, str]] = []
    try:
        async with trio.open_nursery() as nursery:
            running = await start_daemon(nursery, config)
            for number in range(3):  # each call writes records, whatever its result
                await running.call("inventory_item_show", {"item": "widget"})
            last_seq = running.daemon.audit.ledger.last_seq
            with trio.fail_after(10):
                while not anchors or int(anchors[-1]["LEDGER_SEQ"]) < last_seq:
                    fields = parse_entry(await journal.recv(1 << 16))
                    if fields.get("RUNGD_LEDGER_ANCHOR") == "1":
                        anchors.append(fields)
            running.daemon.stop()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()
        journal.close()
    assert all(fields["PRIORITY"] == "6" and "BEGIN SSH SIGNATURE" in fields["LEDGER_ANCHOR_SIGNATURE"]
               for fields in anchors)
    assert verify(folder).ok

    # What `journalctl -o json RUNGD_LEDGER_ANCHOR=1` exports: one object a line, values as strings.
    export = short_tmp / "anchors.json"
    export.write_text("".join(json.dumps(fields) + "\n" for fields in anchors))
    good = await rungctl("ledger", "verify", str(folder), "--anchors", str(export), "--allowed-signers", str(signers))
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"{len(anchors)} of {len(anchors)} anchors agree" in good.stdout.decode()

    # An anchor any local user could have logged, unsigned, is refused with allowed signers.
    forged_anchor = short_tmp / "unsigned.json"
    unsigned = {k: v for k, v in anchors[0].items() if k != "LEDGER_ANCHOR_SIGNATURE"}
    forged_anchor.write_text(json.dumps(unsigned) + "\n")
    refused = await rungctl("ledger", "verify", str(folder), "--anchors", str(forged_anchor),
                            "--allowed-signers", str(signers))
    assert refused.returncode == 1
    assert b"is not signed by a key in" in refused.stderr + refused.stdout

    rewrite(folder, seq=2)
    assert verify(folder).ok, "the rewrite is consistent: the chain alone cannot tell"
    caught = await rungctl("ledger", "verify", str(folder), "--anchors", str(export))
    assert caught.returncode == 1
    out = caught.stdout.decode()
    assert out.startswith("ledger BROKEN: ") and "contradicts anchor" in out and "was rewritten" in out, out
