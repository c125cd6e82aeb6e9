"""A plugin implementing the credential and result-observer hooks, for their tests."""

from __future__ import annotations

from typing import Any

from rungd.sdk import hookimpl

SEEN: list[tuple[str, str, str]] = []


@hookimpl
def rungd_credential(name: str, tool: str) -> str | None:
    return "from-the-hook-Zz9" if name == "fake_password" else None


@hookimpl
def rungd_observe_result(tool: str, envelope: Any, caller: Any) -> None:
    SEEN.append((tool, envelope.status, str(caller.uid)))
    if tool == "test_text_echo":
        raise RuntimeError("an observer that fails must not change the result")
