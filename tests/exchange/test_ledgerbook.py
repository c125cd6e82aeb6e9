"""The ledgerbook demo plugin end to end: a real daemon, the real Ledgerbook program, real files."""

from __future__ import annotations

import pytest


@pytest.fixture
def rungd_config_toml() -> str:
    return """
[plugins]
modules = ["rungd_plugins.ledgerbook"]
"""


INVOICES = [
    {"invoice": "INV-2001", "date": "2024-05-14", "customer": "Müller GmbH", "amount": "420.00", "currency": "EUR"},
    {"invoice": "INV-2002", "date": "2024-05-15", "customer": "Acme Corp", "amount": "99.5", "currency": "USD"},
]


async def test_list_without_any_export_is_stale_and_says_to_ask_for_a_fresh_one(rungd_daemon) -> None:
    env = await rungd_daemon.call("ledgerbook_invoices_list", {})
    assert env.error.code == "STALE_EXPORT", env
    assert "fresh=true" in env.error.hint
    assert (env.outcome, env.next_action) == ("not_started", "repair")


async def test_fresh_list_reads_typed_rows_with_as_of_and_evidence(rungd_daemon) -> None:
    env = await rungd_daemon.call("ledgerbook_invoices_list", {"fresh": True, "customer": "müller"})
    assert env.status == "ok", env.error
    assert env.fields["matched"] == 2 and env.fields["scanned"] == 6
    assert env.fields["rows"][0] == {"invoice": "INV-1001", "date": "2024-04-02", "customer": "Müller GmbH",
                                     "amount": "1250.00", "currency": "EUR", "status": "paid", "batch": "opening"}
    assert env.as_of.endswith("Z")
    assert any(e.endswith("rows.csv") for e in env.evidence)


async def test_import_is_changed_then_no_change_on_a_new_request(rungd_daemon) -> None:
    env = await rungd_daemon.call("ledgerbook_invoices_import", {"batch": "w20", "invoices": INVOICES},
                                  request_id="r1")
    assert env.status == "ok", env.error
    assert env.effect == "changed"
    assert (env.fields["count_before"], env.fields["count_after"], env.fields["written"]) == (0, 2, 2)
    assert env.fields["taken_by"] in ("processed", "gone")
    again = await rungd_daemon.call("ledgerbook_invoices_import", {"batch": "w20", "invoices": INVOICES},
                                    request_id="r2")
    assert again.status == "ok", again.error
    assert again.effect == "no_change"
    assert (again.fields["count_before"], again.fields["count_after"]) == (2, 2)


async def test_the_settle_read_counts_the_batch(rungd_daemon) -> None:
    env = await rungd_daemon.call("ledgerbook_invoices_import", {"batch": "w21", "invoices": INVOICES},
                                  request_id="r3")
    assert env.effect == "changed", env.error
    tool = rungd_daemon.daemon.tools["ledgerbook_invoices_import"].tool
    settle = tool.timing.settle.bind({"batch": "w21"})
    read = await rungd_daemon.call(settle["tool"], settle["inputs"])
    assert read.status == "ok", read.error
    assert (read.fields["matched"], read.fields["returned"]) == (2, 0)


async def test_a_person_with_the_books_open_in_libreoffice_blocks_the_import(rungd_daemon, background) -> None:
    books = rungd_daemon.config.state_dir / "ledgerbook" / "books.csv"
    books.parent.mkdir(parents=True, exist_ok=True)
    await background.start("lo_lock_holder", "--target", books, "--user", "bob", "--host", "finance-2",
                           ready="locked")
    env = await rungd_daemon.call("ledgerbook_invoices_import", {"batch": "w22", "invoices": INVOICES},
                                  request_id="r4")
    assert (env.error.code, env.outcome) == ("LOCKED", "not_started")
    assert "bob on finance-2" in env.error.message
    assert list((books.parent / "inbox").iterdir()) == []
