"""Shared fixtures: every test gets its own short temp folder; the daemon fixtures come
from ``rungd.testing``, the same ones plugin authors use. After every test, no process
started for a call may survive."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytest_plugins = ["rungd.testing"]

TESTS = Path(__file__).parent
FAKES = TESTS / "fakes"
TEST_PLUGINS = TESTS / "plugin_fixtures"
# Call ids the daemon mints (rungd.engine.new_call_id); other tag values are not ours.
CALL_ID = re.compile(r"^c[0-9a-f]{16,}$")


def tagged_processes() -> list[psutil.Process]:
    """Live (not zombie) descendants of this test process that carry a rungd call tag.

    The test daemons make this process a child subreaper, so a call's orphans (a double
    fork) are re-parented here and still count as descendants; other processes on the
    machine are none of our business.
    """
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if CALL_ID.match(proc.environ().get("RUNGD_CALL", "")) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(autouse=True)
def no_survivors() -> Iterator[None]:
    """Fail any test that leaves a process of a call running."""
    yield
    survivors = tagged_processes()
    for proc in survivors:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    assert not survivors, f"processes outlived their call: {[p.pid for p in survivors]}"
