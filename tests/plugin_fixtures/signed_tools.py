"""An irreversible tool: the configured gate for its class asks for a signed approval."""

from __future__ import annotations

from typing import Any

from rungd.sdk import SettleSpec, Timing, Tool, hookimpl
from tests.plugin_fixtures.fake_tools import NOT_FOUND, RunInputs, describe, run_fake


@hookimpl
def rungd_register_tools(register: Any) -> None:
    register(Tool(name="fake_archive_purge", description=describe("Purges for good."), inputs=RunInputs,
                  outputs={"exit_status": "status"}, handler=run_fake, errors=(NOT_FOUND,),
                  side_effect="irreversible",
                  timing=Timing(deadline_s=15, commit_point="confirmation",
                                settle=SettleSpec("fake_archive_purge", {"program": "exit_with"}))))
