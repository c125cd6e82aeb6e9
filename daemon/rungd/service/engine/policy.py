"""The policy the engine decides by, in one place a reload swaps.

The config in force (who may call which tool, which gate holds it, who is an operator), the
tools served, and what the plugins refused to load. The dispatcher and every stage that
decides hold the same :class:`Policy` and read it when they decide; :meth:`Policy.use`
changes it for all of them at once, between two decisions (a reload runs on the loop, with
no checkpoint inside). A call already admitted or held keeps what it was decided with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from rungd.config import Config
from rungd.service.plugins import RegisteredTool


@dataclasses.dataclass
class Policy:
    """What the engine decides by (module docstring).

    Attributes:
        config: the daemon's configuration in force.
        tools: the registered tools by name.
        refused: what the plugins refused to load, one line each: told to operators when
            they list tools (``rungctl lint``), never to other callers.
    """

    config: Config
    tools: Mapping[str, RegisteredTool]
    refused: tuple[str, ...] = ()

    def use(self, config: Config, tools: Mapping[str, RegisteredTool], refused: Sequence[str]) -> None:
        """Decide by these from now on (start-up, a reload)."""
        self.config, self.tools, self.refused = config, tools, tuple(refused)
