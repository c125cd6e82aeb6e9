"""Issue 31: an envelope lists at most EVIDENCE_LISTED evidence ids; the rest are named by one
index file, itself evidence (one envelope carried 26 ids, 1.5 KB of a 4 KB cap)."""

from __future__ import annotations

import trio

from rungd.core.contract import CallContext, Caller
from rungd.service.engine.outcomes import EVIDENCE_LISTED, listed
from rungd.service.evidence import ID
from tests.runner.test_runner_refusals import TOOL


def context(folder) -> CallContext:
    (folder / "evidence").mkdir()
    return CallContext(call_id="c0123456789abcdef01", tool=TOOL, caller=Caller(0, 0, 0), request_id=None,
                       deadline=trio.current_time() + 5, work_dir=folder / "w", evidence_dir=folder / "evidence")


async def test_a_long_evidence_list_is_cut_to_its_first_ids_and_an_index_of_all(short_tmp) -> None:
    ctx = context(short_tmp)
    ids = [ctx.evidence_path(f"part{n}")[0] for n in range(26)]
    shown = listed(list(ctx.evidence), ctx)
    assert len(shown) == EVIDENCE_LISTED and shown[:-1] == ids[:EVIDENCE_LISTED - 1]
    index = shown[-1]
    assert ID.fullmatch(index) and index.endswith(".index")  # an id rungctl evidence reads
    assert (short_tmp / "evidence" / index).read_text().split() == ids


async def test_a_short_list_is_left_whole(short_tmp) -> None:
    ctx = context(short_tmp)
    ids = [ctx.evidence_path("stdout")[0], ctx.evidence_path("stderr")[0]]
    assert listed(list(ctx.evidence), ctx) == ids and len(list((short_tmp / "evidence").iterdir())) == 0
