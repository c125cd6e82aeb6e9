"""The daemon's credential store: where a named credential comes from.

Looked up in this order, first hit wins:

1. the credentials file named in the config (TOML, ``name = "value"``), which must be
   readable by the daemon alone (mode 0600 or 0400);
2. ``$CREDENTIALS_DIRECTORY/<name>``, the files systemd's ``LoadCredential=`` provides;
3. the daemon's environment, ``RUNGD_CRED_<NAME>``;
4. the ``rungd_credential`` hook of the plugins.

A credential never travels in a request, and its value is redacted from every result.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from rungd.system import trust
from rungd.config import read_toml
from rungd.core.errors import ConfigError

if TYPE_CHECKING:
    from rungd.service.plugins import Hooks

ENV_PREFIX = "RUNGD_CRED_"


class CredentialStore:
    """Named credentials for tools.

    Args:
        file: the credentials file, or None.
        hooks: the plugins' hooks, asked last.

    Raises:
        ConfigError: the file is readable by others than the daemon, cannot be read, or is
            not UTF-8 TOML.
    """

    def __init__(self, file: Path | None, hooks: Hooks | None = None) -> None:
        self._values: dict[str, str] = {}
        self._hooks = hooks
        if file is not None:
            self._values = _read_file(file)

    def use_plugins(self, hooks: Hooks) -> None:
        """Ask these plugins from now on (after a reload)."""
        self._hooks = hooks

    def get(self, name: str, tool: str) -> str | None:
        if name in self._values:
            return self._values[name]
        directory = os.environ.get("CREDENTIALS_DIRECTORY")
        if directory:
            path = Path(directory) / name
            if path.is_file():
                try:
                    return path.read_bytes().decode("utf-8").rstrip("\n")
                except UnicodeDecodeError:  # no byte quoted, no position: they are the secret's
                    raise ConfigError(f"$CREDENTIALS_DIRECTORY/{name}: not valid UTF-8; "
                                      "hint: a credential is text; store a binary one base64-encoded") from None
        from_env = os.environ.get(ENV_PREFIX + name.upper().replace("-", "_"))
        if from_env is not None:
            return from_env
        if self._hooks is not None:
            return self._hooks.credential(name, tool)
        return None


def _read_file(path: Path) -> dict[str, str]:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"credentials.file: {path} does not exist") from None
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise ConfigError(
            f"credentials.file: {path} is readable by others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"hint: chmod 600 {path}"
        )
    # Whoever could replace it (its owner, or a writer of a folder above) chooses what a
    # call is given: the same rule as for what runs.
    trust.check(path, "credentials.file")
    try:
        data = read_toml(path, f"credentials.file: {path}")
    except OSError as exc:
        raise ConfigError(f"credentials.file: {path}: cannot read it: {exc.strerror or exc}; "
                          "hint: it must be readable by the user rungd runs as (chmod 600, chown to that user)"
                          ) from None
    bad = [k for k, v in data.items() if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"credentials.file: {path}: values must be strings; check {', '.join(bad)}")
    return data
