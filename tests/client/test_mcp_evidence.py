"""The MCP bridge's ``rungd_evidence_read``: an agent with no file access reads what an
envelope names, through the SDK's own client, capped, with the arguments that read on."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("mcp", reason="the MCP bridge is the optional extra rungd[mcp]; pip install 'rungd[mcp]'")

from rungd.mcp_bridge import EVIDENCE_TOOL

from tests.conftest import TEST_PLUGINS
from tests.client.test_mcp_bridge import bridge, envelope_of, rungd_daemon, text_of  # noqa: F401 (a fixture)


@pytest.fixture
def rungd_config_toml() -> str:
    return f"""
[plugins]
files = ["{TEST_PLUGINS / 'evidence_tools.py'}"]

[evidence]
reply_bytes = 600
"""


async def test_an_agent_reads_evidence_a_result_names_page_by_page(rungd_daemon, short_tmp) -> None:
    async with bridge(rungd_daemon.socket, short_tmp) as session:
        listed = {t.name: t for t in (await session.list_tools()).tools}
        assert listed[EVIDENCE_TOOL].annotations.readOnlyHint is True
        result = await session.call_tool("evidence_lines_show", {"count": 100, "needle_every": 40})
        evidence_id = next(e for e in result.structuredContent["evidence"] if e.endswith(".stdout"))
        truth = (rungd_daemon.config.state_dir / "evidence" / evidence_id).read_text()

        first = await session.call_tool(EVIDENCE_TOOL, {"evidence_id": evidence_id, "line": 1})
        assert first.isError is False
        part = envelope_of(first)  # an evidence slice, mirrored as an envelope is
        assert truth.startswith(part["text"]) and part["truncated"] and part["next"] == {"line": part["next"]["line"]}
        assert list(json.loads(text_of(first)))[-1] == "text"  # the program's output after rungd's counts
        second = await session.call_tool(EVIDENCE_TOOL, {"evidence_id": evidence_id, **part["next"]})
        assert truth.startswith(part["text"] + envelope_of(second)["text"])

        found = await session.call_tool(EVIDENCE_TOOL, {"evidence_id": evidence_id, "grep": "needle"})
        assert envelope_of(found)["matches"] == 2 and len(found.structuredContent["text"].splitlines()) == 2

        unknown = await session.call_tool(EVIDENCE_TOOL, {"evidence_id": "c18f2a3b4c5d6e7f80.1.stdout"})
        path_like = await session.call_tool(EVIDENCE_TOOL, {"evidence_id": "../../etc/passwd"})
        extra = await session.call_tool(EVIDENCE_TOOL, {"evidence_id": evidence_id, "path": "/etc/passwd"})
    assert unknown.isError is True and envelope_of(unknown)["error"]["code"] == "UNKNOWN_EVIDENCE"
    assert path_like.isError is True and envelope_of(path_like)["error"]["code"] == "BAD_INPUT"
    assert extra.isError is True and "unknown arguments: path" in envelope_of(extra)["error"]["message"]
