"""Times read from files a person may have edited are told in words, never raised: an
attacker's trial edited a ledger's times to 1e308 and -1e18, and a step-down mark replayed
from it stopped the daemon's start (OverflowError, or EOVERFLOW told as a path problem)."""

from __future__ import annotations

import pytest

from rungd.core import moments
from rungd.service.stepdown import Mark


@pytest.mark.parametrize("unix", [1e308, -1e18, float("inf"), float("nan")])
def test_a_time_no_clock_can_show_is_told_as_itself(unix: float) -> None:
    assert moments.local(unix) == moments.utc_iso(unix) == moments.local_iso(unix) == f"{unix!r} (not a time)"
    assert Mark("SURFACE_CHANGED 3 times in a row", unix, ("c1",)).text().startswith(
        f"marked since {unix!r} (not a time)")


def test_a_real_time_is_told_as_a_time() -> None:
    assert moments.utc_iso(0) == "1970-01-01T00:00:00+00:00"
    assert moments.local(0, "%Y") == "1970"
