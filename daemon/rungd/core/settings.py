"""What one plugin is told about its configuration: ``PluginSettings``, its own table of the
config, never the whole config (the daemon builds it: ``rungd.service.plugins.settings_for``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel

from rungd.core.errors import ConfigError

SettingsT = TypeVar("SettingsT", bound=BaseModel)


@dataclasses.dataclass(frozen=True)
class PluginSettings:
    """What one plugin is told about its configuration: its own table, never the whole config.

    Attributes:
        name: the key of its table, ``[plugins.settings.<name>]``: the entry point's name,
            the module's name for ``plugins.modules``, the file's stem for ``plugins.files``.
        raw: that table as written (read-only), or None when the config has none.
        source: the config file's label, for error messages.
        tool_dirs: the config's ``plugins.tool_dirs`` (the declarative plugin reads them).
        state_dir: this plugin's own folder under the daemon's state folder
            (``<state>/<name>``); not created until the plugin needs it.
        refused: what :meth:`refuse` was told, for the host to report.
    """

    name: str
    raw: Mapping[str, Any] | None
    source: str
    tool_dirs: tuple[Path, ...] = ()
    state_dir: Path = Path("var")
    refused: list[str] = dataclasses.field(default_factory=list, compare=False)

    def refuse(self, problem: str) -> None:
        """Leave out what ``problem`` names (a tool file whose owner or modes are wrong, say)
        and keep going: the daemon logs it, ``rungd check-config`` and ``rungctl lint`` list
        it, and the plugin's other tools are served."""
        self.refused.append(problem)

    @property
    def configured(self) -> bool:
        """Whether the config has a ``[plugins.settings.<name>]`` table at all."""
        return self.raw is not None

    def parse(self, model: type[SettingsT], example: str) -> SettingsT | None:
        """The plugin's table validated by its own pydantic ``model``.

        Args:
            model: the plugin's settings model (``extra="forbid"`` so a typo is an error).
            example: a valid line or two of TOML, quoted in the error message.

        Returns:
            None when the table is absent: the plugin is not configured and offers no tools.

        Raises:
            ConfigError: naming the config file, the key and ``example``.
        """
        if self.raw is None:
            return None
        try:
            return model.model_validate(dict(self.raw))
        except pydantic.ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"])
            raise ConfigError(f"{self.source}: key plugins.settings.{self.name}.{key}: {err['msg']}; "
                              f"example: {example}") from None


