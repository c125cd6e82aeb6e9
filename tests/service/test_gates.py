"""Gates against a real daemon: held calls run only after another operator says so.

The tests run as root (an operator); the approving operator is uid 65534, reached by a
client process that drops to that uid before connecting, so the daemon learns it from
SO_PEERCRED exactly as it would in production.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from rungd_ledgers import iter_records

from rungd.client import Client, RequestRejected
from rungd.config import load_config
from rungd.service.gates import approval_message
from rungd.testing import start_daemon, write_config
from tests.conftest import TEST_PLUGINS

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as a second uid")

OPERATOR = 65534
CONFIRM = {"program": "confirm", "confirm": True}


def config_toml(extra: str = "", ttl: float = 60, plugins: tuple[str, ...] = ("fake_tools.py",)) -> str:
    files = ", ".join(f'"{TEST_PLUGINS / name}"' for name in plugins)
    return f"""
[server]
socket_mode = "0666"

[access]
uids = [0, {OPERATOR}]

[gates]
approval_ttl_s = {ttl}
operator_uids = [{OPERATOR}]
{extra}

[plugins]
files = [{files}]
"""


async def daemon_for(nursery, short_tmp: Path, toml: str):
    # write_config writes [server] and [state]; merge our [server] keys into it.
    path = write_config(short_tmp, "")
    text = path.read_text().replace("[server]\n", "[server]\nsocket_mode = \"0666\"\n", 1)
    path.write_text(text + toml.replace('[server]\nsocket_mode = "0666"\n', ""))
    short_tmp.chmod(0o755)
    return await start_daemon(nursery, load_config(path))


async def as_operator(socket: Path, code: str) -> dict:
    """Run ``code`` (with ``c``, a connected Client) as uid 65534; returns its JSON print."""
    script = (
        "import json, os\nfrom rungd.client import Client, RequestRejected\nfrom rungd.service.gates import sign\n"
        f"os.setgroups([]); os.setgid({OPERATOR}); os.setuid({OPERATOR})\n"
        f"c = Client({str(socket)!r})\n" + code
    )
    done = await trio.run_process([sys.executable, "-c", script], capture_stdout=True)
    return json.loads(done.stdout)


def ledger_events(daemon, call_id: str) -> list[str]:
    return [r.event for r in iter_records(daemon.config.state_dir / "ledger") if r.call_id == call_id]


async def test_review_gate_holds_until_another_operator_approves_then_runs_once(nursery, short_tmp) -> None:
    daemon = await daemon_for(nursery, short_tmp, config_toml())
    held = await daemon.call("fake_records_delete", CONFIRM, request_id="g1", wait_s=0.2)
    assert (held.status, held.next_action, held.outcome) == ("pending", "wait_approval", "not_started")
    assert ledger_events(daemon, held.call_id) == ["received", "held"]  # nothing ran
    listed = await as_operator(daemon.socket, "print(json.dumps([h.call_id for h in c.pending()]))")
    assert listed == [held.call_id]
    # The caller cannot approve its own call, even as root.
    with pytest.raises(RequestRejected) as caught:
        await daemon.run(Client.approve, held.call_id)
    assert caught.value.code == "DENIED"
    verdict = await as_operator(
        daemon.socket, f"print(json.dumps(c.approve({held.call_id!r}, reason='ticket OPS-88: cleanup').verdict))")
    assert verdict == "approved"
    [approved] = [r for r in iter_records(daemon.config.state_dir / "ledger")
                  if r.call_id == held.call_id and r.event == "approved"]
    assert (approved.approver_uid, approved.note) == (OPERATOR, "ticket OPS-88: cleanup")  # why, kept
    done = await daemon.run(Client.wait, held.call_id, 20)
    assert done.status == "ok", done.error
    assert len(done.fields["answered"]) == 1  # the confirmation was answered, once, after approval
    assert ledger_events(daemon, held.call_id) == ["received", "held", "approved", "dispatched", "answered",
                                                   "finished"]  # the answer given after approval is on record
    again = await daemon.call("fake_records_delete", CONFIRM, request_id="g1")
    assert again.effect == "existing" and again.status == "ok"  # answered from the ledger, not held again
    assert ledger_events(daemon, held.call_id).count("dispatched") == 1
    daemon.daemon.stop()


async def test_a_repeat_of_a_held_request_says_it_waits_for_approval_not_that_it_runs(nursery, short_tmp) -> None:
    daemon = await daemon_for(nursery, short_tmp, config_toml())
    held = await daemon.call("fake_records_delete", CONFIRM, request_id="g9", wait_s=0.1)
    repeat = await daemon.call("fake_records_delete", CONFIRM, request_id="g9", wait_s=0.1)
    assert repeat.call_id != held.call_id
    assert (repeat.status, repeat.outcome, repeat.next_action) == ("pending", "not_started", "wait_approval")
    assert f"a repeat of {held.call_id}, which is held" in repeat.narrow
    assert f"rungctl approve {held.call_id}" in repeat.narrow and "running" not in repeat.narrow
    note = [r.note for r in iter_records(daemon.config.state_dir / "ledger") if r.call_id == repeat.call_id][0]
    assert note == f"repeat of {held.call_id}, held at its review gate"
    await as_operator(daemon.socket, f"print(json.dumps(c.approve({held.call_id!r}).verdict))")
    done = await daemon.run(Client.wait, repeat.call_id, 20)
    assert (done.status, done.effect) == ("ok", "existing")  # the first call's result; nothing ran twice
    assert ledger_events(daemon, held.call_id).count("dispatched") == 1
    assert "dispatched" not in ledger_events(daemon, repeat.call_id)
    daemon.daemon.stop()


async def test_a_caller_withdraws_its_own_held_call_but_never_approves_it(nursery, short_tmp) -> None:
    daemon = await daemon_for(nursery, short_tmp, config_toml())
    held = await daemon.call("fake_records_delete", CONFIRM, request_id="g8", wait_s=0.1)
    with pytest.raises(RequestRejected) as caught:
        await daemon.run(Client.approve, held.call_id)
    assert caught.value.code == "DENIED" and "withdraw" in caught.value.hint
    decision = await daemon.run(lambda c: c.deny(held.call_id, "asked for the wrong table"))
    assert decision.verdict == "denied"
    done = await daemon.run(Client.wait, held.call_id, 10)
    assert (done.error.code, done.outcome) == ("GATE_DENIED", "not_started")
    assert "its caller withdrew the call" in done.error.message and "asked for the wrong table" in done.error.message
    denied = [r for r in iter_records(daemon.config.state_dir / "ledger")
              if r.call_id == held.call_id and r.event == "denied"]
    assert denied[0].note == "withdrawn by its caller: asked for the wrong table"
    assert "dispatched" not in ledger_events(daemon, held.call_id)
    daemon.daemon.stop()


async def test_denied_call_never_runs(nursery, short_tmp) -> None:
    daemon = await daemon_for(nursery, short_tmp, config_toml())
    held = await daemon.call("fake_records_delete", CONFIRM, request_id="g2", wait_s=0.1)
    await as_operator(daemon.socket, f"print(json.dumps(c.deny({held.call_id!r}, 'not today').verdict))")
    done = await daemon.run(Client.wait, held.call_id, 10)
    assert (done.error.code, done.outcome, done.next_action) == ("GATE_DENIED", "not_started", "stop")
    assert "not today" in done.error.message
    assert "dispatched" not in ledger_events(daemon, held.call_id)
    daemon.daemon.stop()


async def test_expired_approval_never_runs(nursery, short_tmp) -> None:
    daemon = await daemon_for(nursery, short_tmp, config_toml(ttl=0.5))
    done = await daemon.call("fake_records_delete", CONFIRM, request_id="g3", wait_s=10)
    assert (done.error.code, done.outcome) == ("APPROVAL_EXPIRED", "not_started")
    refused = await as_operator(
        daemon.socket,
        f"try:\n    c.approve({done.call_id!r}); print('\"approved\"')\n"
        "except RequestRejected as e:\n    print(json.dumps(e.code))\n",
    )
    assert refused == "GATE_DENIED"  # too late: it is no longer held
    assert ledger_events(daemon, done.call_id) == ["received", "held", "expired", "finished"]
    daemon.daemon.stop()


@pytest.fixture
def operator_key(short_tmp: Path) -> tuple[Path, Path]:
    key = short_tmp / "operator_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "op", "-f", str(key)], check=True)
    signers = short_tmp / "allowed_signers"
    signers.write_text(f"operator@example {key.with_suffix('.pub').read_text()}")
    other = short_tmp / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "x", "-f", str(other)], check=True)
    for path in (key, other):
        os.chown(path, OPERATOR, OPERATOR)  # the operator (uid 65534) signs with it in this test
    return signers, key


async def test_signature_gate_needs_a_signature_by_an_allowed_key(nursery, short_tmp, operator_key) -> None:
    signers, key = operator_key
    toml = config_toml(f'allowed_signers = "{signers}"', plugins=("fake_tools.py", "signed_tools.py"))
    daemon = await daemon_for(nursery, short_tmp, toml)
    held = await daemon.call("fake_archive_purge", CONFIRM, request_id="s1", wait_s=0.1)
    assert held.next_action == "wait_approval"
    attempt = (
        "def go(sig):\n"
        "    try:\n"
        f"        return c.approve({held.call_id!r}, sig).verdict\n"
        "    except RequestRejected as e:\n"
        "        return e.code\n"
        f"msg = [h for h in c.pending() if h.call_id == {held.call_id!r}][0].approval_message.encode()\n"
        f"print(json.dumps([go(None), go(sign({str(short_tmp / 'other_key')!r}, msg)),"
        f" go(sign({str(key)!r}, b'another call')), go(sign({str(key)!r}, msg))]))\n"
    )
    results = await as_operator(daemon.socket, attempt)
    assert results == ["GATE_DENIED", "GATE_DENIED", "GATE_DENIED", "approved"]
    done = await daemon.run(Client.wait, held.call_id, 20)
    assert done.status == "ok", done.error
    approved = [r for r in iter_records(daemon.config.state_dir / "ledger")
                if r.call_id == held.call_id and r.event == "approved"]
    assert approved[0].approver_uid == OPERATOR and approved[0].note == "signed by operator@example"
    assert approval_message(held.call_id, "fake_archive_purge", "x").startswith(b"rungd approval")
    daemon.daemon.stop()


async def test_a_key_also_listed_for_the_caller_cannot_approve_its_call(nursery, short_tmp, operator_key) -> None:
    # The caller (root) signs with its own key, which the file lists first for an operator
    # and only on a later line for root; an operator submits the signature. find-principals
    # names the operator, the first line; the later line makes the key the caller's.
    signers, key = operator_key
    own = short_tmp / "caller_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me", "-f", str(own)], check=True)
    os.chown(own, OPERATOR, OPERATOR)  # handed to the operator, as a lax one would take it
    public = own.with_suffix(".pub").read_text()
    signers.write_text(signers.read_text() + f"operator@example {public}root@laptop {public}")
    toml = config_toml(f'allowed_signers = "{signers}"', plugins=("fake_tools.py", "signed_tools.py"))
    daemon = await daemon_for(nursery, short_tmp, toml)
    held = await daemon.call("fake_archive_purge", CONFIRM, request_id="s2", wait_s=0.1)
    attempt = (
        "def go(key):\n"
        "    try:\n"
        f"        return c.approve({held.call_id!r}, sign(key, msg)).verdict\n"
        "    except RequestRejected as e:\n"
        "        return [e.code, str(e)]\n"
        f"msg = [h for h in c.pending() if h.call_id == {held.call_id!r}][0].approval_message.encode()\n"
        f"print(json.dumps([go({str(own)!r}), go({str(key)!r})]))\n"
    )
    own_signature, operators = await as_operator(daemon.socket, attempt)
    assert own_signature[0] == "DENIED" and "lists for root, who made the call" in own_signature[1]
    assert operators == "approved"  # a genuine operator key still approves it
    done = await daemon.run(Client.wait, held.call_id, 20)
    assert done.status == "ok", done.error
    daemon.daemon.stop()


def test_signature_gate_without_signers_refuses_to_start(short_tmp) -> None:
    from rungd.service.daemon import Daemon
    from rungd.core.errors import ConfigError

    path = write_config(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "signed_tools.py"}"]\n')
    with pytest.raises(ConfigError, match="fake_archive_purge"):
        Daemon(load_config(path))
