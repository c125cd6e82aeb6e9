"""Evidence on request: slices by bytes, lines and pattern, capped and walked to the end;
redacted as stored; visible to the call's caller and operators only; pruned by age and size,
never a running call's; and a pruned id answers gone."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pytest
import trio

from rungd import protocol
from rungd.client import RequestRejected
from rungd.config import load_config
from rungd.protocol import EvidenceSlice
from rungd.testing import RunningDaemon, start_daemon, write_config

from tests.conftest import TEST_PLUGINS
from tests.ctl.test_ctl_cli import ctl

TOOLS = TEST_PLUGINS / "evidence_tools.py"
CAP = 1000
SECRET = "Sx9-evidence-secret-QQ7"
NOBODY = 65534
DAY = 86400


@pytest.fixture
def rungd_config_toml() -> str:
    return f"""
[plugins]
files = ["{TOOLS}"]

[evidence]
reply_bytes = {CAP}
max_total_bytes = 65536
"""


async def ask(daemon: RunningDaemon, evidence_id: str, **how: object) -> EvidenceSlice:
    return await daemon.run(lambda c: c.evidence(evidence_id, **how))


async def refused(daemon: RunningDaemon, evidence_id: str, **how: object) -> RequestRejected:
    with pytest.raises(RequestRejected) as caught:
        await ask(daemon, evidence_id, **how)
    return caught.value


async def printed(daemon: RunningDaemon, **inputs: object) -> tuple[str, bytes]:
    """Run the tool; its stdout evidence id and the file's bytes (the truth to compare with)."""
    env = await daemon.call("evidence_lines_show", inputs)
    assert env.status == "ok", env.error
    stdout = next(e for e in env.evidence if e.endswith(".stdout"))
    return stdout, (evidence_dir(daemon) / stdout).read_bytes()


def evidence_dir(daemon: RunningDaemon) -> Path:
    return daemon.config.state_dir / "evidence"


def minted(age_s: float) -> str:
    """A call id as the daemon mints them, for a call that began ``age_s`` ago."""
    return f"c{int((time.time() - age_s) * 1000):x}{secrets.token_hex(4)}"


async def walk(daemon: RunningDaemon, evidence_id: str, **first: object) -> list[EvidenceSlice]:
    """Every reply from ``first`` on, following ``next`` as a client would (keeping grep and max_bytes)."""
    keep = {k: v for k, v in first.items() if k in ("grep", "max_bytes")}
    parts = [await ask(daemon, evidence_id, **first)]
    while parts[-1].next is not None:
        step = parts[-1].next
        how = {"offset": step.offset} if step.offset is not None else {"line": step.line}
        parts.append(await ask(daemon, evidence_id, **keep, **how))
        assert len(parts) < 10_000
    return parts


async def test_reads_a_slice_by_bytes_by_lines_and_by_a_literal_pattern(rungd_daemon) -> None:
    evidence_id, truth = await printed(rungd_daemon, count=200, needle_every=50)
    lines = truth.decode().splitlines(keepends=True)

    by_bytes = await ask(rungd_daemon, evidence_id, offset=5, length=20)
    assert by_bytes.text.encode() == truth[5:25]
    assert (by_bytes.size, by_bytes.lines, by_bytes.end, by_bytes.truncated) == (len(truth), 200, 25, False)
    assert by_bytes.next.offset == 25

    by_lines = await ask(rungd_daemon, evidence_id, line=3, count=2)
    assert by_lines.text == "".join(lines[2:4])
    assert (by_lines.first_line, by_lines.next.line, by_lines.truncated) == (3, 5, False)

    found = await ask(rungd_daemon, evidence_id, grep="needle")
    assert found.text == "".join(f"{n}:{lines[n - 1]}" for n in (50, 100, 150, 200))
    assert (found.matches, found.next, found.truncated) == (4, None, False)
    # A pattern is a literal: what would be a catastrophic regular expression finds nothing, at once.
    with trio.fail_after(5):
        assert (await ask(rungd_daemon, evidence_id, grep="(x+x+)+y")).matches == 0
    assert (await ask(rungd_daemon, evidence_id, grep="x+")).matches == 0


async def test_the_cap_and_next_walk_the_whole_file_and_it_reassembles_exactly(rungd_daemon) -> None:
    evidence_id, truth = await printed(rungd_daemon, count=1500, needle_every=7)
    assert len(truth) > 20 * CAP

    by_bytes = await walk(rungd_daemon, evidence_id)
    assert "".join(p.text for p in by_bytes).encode() == truth
    assert all(len(p.text.encode()) <= CAP for p in by_bytes)
    assert by_bytes[0].truncated and by_bytes[-1].next is None

    by_lines = await walk(rungd_daemon, evidence_id, line=1)
    assert "".join(p.text for p in by_lines).encode() == truth
    assert all(p.text.endswith("\n") for p in by_lines)  # whole lines only

    matches = await walk(rungd_daemon, evidence_id, grep="needle")
    expected = [f"{n}:{line}" for n, line in enumerate(truth.decode().splitlines(keepends=True), 1) if "needle" in line]
    assert "".join(p.text for p in matches) == "".join(expected)
    assert sum(p.matches for p in matches) == 1500 // 7 and len(matches) > 1


async def test_a_tiny_cap_never_splits_a_character(rungd_daemon) -> None:
    evidence_id, truth = await printed(rungd_daemon, count=12)
    parts = await walk(rungd_daemon, evidence_id, max_bytes=5)
    assert "".join(p.text for p in parts).encode() == truth
    assert not any("\ufffd" in p.text for p in parts)
    assert max(len(p.text.encode()) for p in parts) <= 5


async def test_a_seeded_secret_stays_redacted(rungd_daemon, monkeypatch) -> None:
    monkeypatch.setenv("RUNGD_CRED_FAKE_PASSWORD", SECRET)
    evidence_id, truth = await printed(rungd_daemon, count=3, leak=True)
    assert SECRET.encode() not in truth
    whole = "".join(p.text for p in await walk(rungd_daemon, evidence_id))
    assert "token=[REDACTED] end" in whole and SECRET not in whole
    assert (await ask(rungd_daemon, evidence_id, grep=SECRET)).matches == 0
    assert (await ask(rungd_daemon, evidence_id, grep=SECRET[:10])).matches == 0
    assert (await ask(rungd_daemon, evidence_id, grep="[REDACTED]")).matches == 1


@pytest.mark.parametrize("bad", ["../../etc/passwd", "x/y", "..", ".hidden.1.x", "c1.1.stdout/../../x", "c1.1.",
                                 "c1..stdout", "pruned.jsonl", "c1.1.std out", "/etc/passwd"])
async def test_a_path_like_id_is_refused(rungd_daemon, bad) -> None:
    error = await refused(rungd_daemon, bad)
    assert error.code == "BAD_INPUT" and "CALL_ID.N.LABEL" in error.hint


async def test_a_symlink_or_fifo_under_a_valid_id_is_unknown_and_never_hangs(rungd_daemon) -> None:
    folder = evidence_dir(rungd_daemon)
    link, fifo = f"{minted(0)}.1.stdout", f"{minted(0)}.1.stdout"
    (folder / link).symlink_to("/etc/passwd")
    os.mkfifo(folder / fifo)
    with trio.fail_after(10):
        for planted in (link, fifo):
            assert (await refused(rungd_daemon, planted)).code == "UNKNOWN_EVIDENCE"
        await rungd_daemon.daemon.evidence.prune()  # listing the folder does not open it either
        env = await rungd_daemon.call("evidence_lines_show", {"count": 1})
    assert env.status == "ok"


async def test_a_made_up_id_is_unknown(rungd_daemon) -> None:
    error = await refused(rungd_daemon, f"{minted(0)}.1.stdout")
    assert error.code == "UNKNOWN_EVIDENCE" and "envelope" in error.hint


async def test_a_byte_range_mixed_with_lines_is_bad_input(rungd_daemon) -> None:
    evidence_id, _ = await printed(rungd_daemon, count=2)
    assert (await refused(rungd_daemon, evidence_id, offset=0, grep="x")).code == "BAD_INPUT"


async def test_a_pruned_id_answers_gone_with_when_and_why(rungd_daemon) -> None:
    evidence_id, _ = await printed(rungd_daemon, count=5)
    old = time.time() - 8 * DAY
    os.utime(evidence_dir(rungd_daemon) / evidence_id, (old, old))
    report = await rungd_daemon.daemon.evidence.prune()
    assert report.by_age >= 1 and not (evidence_dir(rungd_daemon) / evidence_id).exists()
    error = await refused(rungd_daemon, evidence_id)
    assert error.code == "EVIDENCE_GONE"
    assert "pruned at" in str(error) and "7-day retention" in str(error) and "rungctl tail --call" in error.hint


async def test_retention_prunes_by_age_then_size_oldest_first_and_never_a_running_call(rungd_daemon) -> None:
    folder = evidence_dir(rungd_daemon)
    await rungd_daemon.daemon.evidence.pruned_once.wait()  # the start-up prune must not take our files
    names = {}
    for name, age_days in (("ancient", 10), ("old", 3), ("middle", 2), ("young", 1)):
        names[name] = f"{minted(age_days * DAY)}.1.stdout"
        (folder / names[name]).write_bytes(b"x" * 25_000)
        at = time.time() - age_days * DAY
        os.utime(folder / names[name], (at, at))

    async with trio.open_nursery() as nursery:
        running: list = []

        async def long_call() -> None:
            running.append(await rungd_daemon.call("evidence_lines_show", {"count": 3, "pause": 4}))

        nursery.start_soon(long_call)
        with trio.fail_after(10):
            while not (mine := [p for p in folder.glob("c*.stdout") if p.name not in names.values()]):
                await trio.sleep(0.05)
        # Older than every other file, and past the retention: still kept while its call runs.
        os.utime(mine[0], (time.time() - 30 * DAY,) * 2)
        report = await rungd_daemon.daemon.evidence.prune()
        assert not running, "the call ended before the prune: nothing was proven"
        assert mine[0].exists()
    assert (report.by_age, report.by_size) == (1, 1)  # ancient by age, then old (the oldest left) by size
    assert not (folder / names["ancient"]).exists() and not (folder / names["old"]).exists()
    assert (folder / names["middle"]).exists() and (folder / names["young"]).exists()
    assert running[0].status == "ok"
    assert "retention" in str(await refused(rungd_daemon, names["ancient"]))
    assert "max_total_bytes" in str(await refused(rungd_daemon, names["old"]))
    # Once the call has ended, an old file of it goes at the next prune.
    os.utime(mine[0], (time.time() - 30 * DAY,) * 2)
    await rungd_daemon.daemon.evidence.prune()
    assert not mine[0].exists()


async def test_calls_that_write_much_evidence_bring_the_next_prune_forward(rungd_daemon) -> None:
    # An attacker's trial: calls printing 50 MB each filled a 300 MB state folder in seconds,
    # 15 times evidence.max_total_bytes, and the ledger then refused every caller's calls,
    # because the cap was looked at every prune_every_s (600 s) only.
    folder = evidence_dir(rungd_daemon)
    await rungd_daemon.daemon.evidence.pruned_once.wait()
    for _ in range(6):
        env = await rungd_daemon.call("evidence_lines_show", {"count": 700})  # about 25 KB each
        assert env.status == "ok", env.error

    def total() -> int:
        return sum(p.stat().st_size for p in folder.glob("c*"))

    with trio.fail_after(10):
        while total() > 65536:
            await trio.sleep(0.05)


# --- who may read --------------------------------------------------------------------------


@pytest.fixture
async def shared_daemon(nursery, short_tmp: Path) -> RunningDaemon:
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another uid")
    config = load_config(write_config(short_tmp, f'[access]\nuids = [0, {NOBODY}]\n\n[plugins]\nfiles = ["{TOOLS}"]\n'))
    config = config.model_copy(update={"server": config.server.model_copy(update={"socket_mode": "0666"})})
    short_tmp.chmod(0o755)
    return await start_daemon(nursery, config)


def as_nobody(sock: Path, code: str) -> object:
    """Run ``code`` with ``c`` a client connected as uid 65534 (set after the imports);
    returns what it prints, as JSON."""
    script = ("import json, os\nfrom rungd.client import Client, RequestRejected\n"
              f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
              f"c = Client({str(sock)!r})\n"
              "def read(i, **how):\n"
              "    try:\n        return c.evidence(i, **how).text\n"
              "    except RequestRejected as e:\n        return [e.code, str(e), e.hint]\n"
              + textwrap.dedent(code))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_another_uid_cannot_tell_anothers_evidence_from_a_made_up_id(shared_daemon) -> None:
    root_id, truth = await printed(shared_daemon, count=4)
    made_up = f"{minted(0)}.1.stdout"
    seen = await trio.to_thread.run_sync(as_nobody, shared_daemon.socket, f"""
        env = c.call("evidence_lines_show", {{"count": 2}})
        own = env.evidence[0]
        print(json.dumps([read({root_id!r}), read({made_up!r}), read({root_id!r}, grep="line"), read(own), own]))
    """)
    theirs, invented, grepped, own_text, own_id = seen
    assert theirs == invented == grepped
    assert theirs[0] == "UNKNOWN_EVIDENCE"
    assert own_text.startswith("line 00001")  # a caller reads its own
    assert (await ask(shared_daemon, own_id)).text == own_text  # and an operator (root) reads anyone's

    # Once the daemon forgets the call, the ledger's received record still says whose it is.
    calls = shared_daemon.daemon.dispatcher.calls
    for call in list(calls):
        calls.drop(call)
    again = await trio.to_thread.run_sync(as_nobody, shared_daemon.socket, f"""
        print(json.dumps([read({own_id!r}), read({root_id!r})]))
    """)
    assert again[0] == own_text and again[1] == theirs

    # A pruned id of another caller is as unknown as ever: "gone" is said to its owner only.
    for evidence_id in (root_id, own_id):
        os.utime(shared_daemon.config.state_dir / "evidence" / evidence_id, (time.time() - 9 * DAY,) * 2)
    await shared_daemon.daemon.evidence.prune()
    after = await trio.to_thread.run_sync(as_nobody, shared_daemon.socket, f"""
        print(json.dumps([read({root_id!r}), read({own_id!r})]))
    """)
    assert after[0] == theirs
    assert after[1][0] == "EVIDENCE_GONE"


# --- rungctl evidence ----------------------------------------------------------------------


async def test_rungctl_evidence_prints_a_slice_says_what_was_cut_and_all_reassembles(rungd_daemon) -> None:
    evidence_id, truth = await printed(rungd_daemon, count=300, needle_every=100)
    sock = str(rungd_daemon.socket)
    first = await ctl("evidence", evidence_id, "--socket", sock)
    assert first.returncode == 0, first.stderr
    assert first.stdout == truth[:len(first.stdout)] and 0 < len(first.stdout) <= CAP
    status = first.stderr.decode()
    assert status.count("\n") == 1 and "cut at the reply cap" in status
    assert f"next: rungctl evidence {evidence_id} --bytes {len(first.stdout)}:" in status

    whole = await ctl("evidence", evidence_id, "--all", "--socket", sock)
    assert whole.stdout == truth and "end of file" in whole.stderr.decode()

    lines = await ctl("evidence", evidence_id, "--lines", "2:1", "--socket", sock)
    assert lines.stdout == truth.splitlines(keepends=True)[1]
    assert "--lines 3:" in lines.stderr.decode()
    past = await ctl("evidence", evidence_id, "--lines", "999999:5", "--socket", sock)
    assert past.returncode == 0 and past.stdout == b""
    assert f"line 999999 is past the end: it has {len(truth.splitlines())}" in past.stderr.decode()

    found = await ctl("evidence", evidence_id, "--grep", "needle", "--json", "--socket", sock)
    assert json.loads(found.stdout)["matches"] == 3

    mixed = await ctl("evidence", evidence_id, "--bytes", "0:10", "--grep", "x", "--socket", sock)
    bad_range = await ctl("evidence", evidence_id, "--lines", "a:b", "--socket", sock)
    unknown = await ctl("evidence", f"{minted(0)}.1.stdout", "--socket", sock)
    for done in (mixed, bad_range):
        assert done.returncode == 2 and b"hint:" in done.stderr and done.stderr.count(b"\n") == 1
    assert unknown.returncode == 1 and b"UNKNOWN_EVIDENCE" in unknown.stderr and b"hint:" in unknown.stderr


def test_a_request_carries_only_the_fields_given() -> None:
    # Optional fields are left out on the wire, so an agent in any language sends only what it means.
    body = protocol.frame(protocol.Evidence(evidence_id="c1.1.stdout", line=3))[4:]
    assert msgspec.msgpack.decode(body) == {"type": "evidence", "evidence_id": "c1.1.stdout", "line": 3}
    assert protocol.REPLY_TO[protocol.Evidence] is EvidenceSlice


async def test_rungctl_evidence_shows_a_programs_escapes_on_a_terminal_and_keeps_them_in_a_pipe(
        rungd_daemon) -> None:
    # What a program printed is the data it was handed (a file, a remote answer): on an
    # operator's terminal its escapes are shown, never run; a pipe or file gets the bytes.
    stored = "ok\tfine\n\x1b]0;OWNED\x07\x1b[2Jgone\n"
    evidence_id = f"{minted(0)}.1.stdout"
    (evidence_dir(rungd_daemon) / evidence_id).write_text(stored)
    sock = str(rungd_daemon.socket)

    def on_a_terminal(*more: str) -> bytes:
        leader, follower = os.openpty()
        try:
            subprocess.run([sys.executable, "-m", "rungd.ctl", "evidence", evidence_id, "--socket", sock, *more],
                           stdout=follower, stderr=subprocess.DEVNULL, check=True, timeout=30)
            os.close(follower)
            out = b""
            while True:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # EIO: the terminal's other end is closed and drained
                    break
                if not chunk:
                    break
                out += chunk
            return out
        finally:
            os.close(leader)

    shown = await trio.to_thread.run_sync(on_a_terminal)
    assert b"\x1b" not in shown and b"\x07" not in shown
    assert b"\\x1b]0;OWNED\\x07\\x1b[2Jgone" in shown and b"ok\tfine" in shown
    assert b"\x1b]0;OWNED" in await trio.to_thread.run_sync(on_a_terminal, "--raw")
    piped = await ctl("evidence", evidence_id, "--socket", sock)
    assert piped.stdout == stored.encode()
