"""The daemon's configuration: one TOML file, validated by pydantic, or the embedded default.

Errors name the file, the key and a valid example, because the person reading them is
editing that file right now. Relative paths in a config file are resolved against the
file's folder; the embedded default resolves them against the working folder, so
``rungd serve`` with no arguments keeps its socket and state under ``./var``.
"""

from __future__ import annotations

import functools
import grp
import os
import tomllib
from pathlib import Path
from typing import Any, Literal, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from rungd.core.errors import ConfigError
from rungd.core.vocabulary import Gate

CONFIG_ENV = "RUNGD_CONFIG"
SOCKET_ENV = "RUNGD_SOCKET"


def embedded_configs() -> Path:
    """The folder holding the embedded default config and the demo tool files.

    A wheel carries it inside the package (``rungd/configs``); a source checkout or an
    editable install finds it at the top of the repository.
    """
    inside = Path(__file__).parent / "configs"
    return inside if inside.is_dir() else Path(__file__).resolve().parents[2] / "configs"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Section):
    socket: Path = Field(Path("var/rungd.sock"), examples=["/run/rungd/rungd.sock"])
    socket_mode: str = Field("0660", pattern=r"^0?[0-7]{3}$", examples=["0660"])
    socket_group: str | None = Field(None, examples=["rungd-callers"])
    max_frame_bytes: int = Field(1 << 20, ge=4096, le=64 << 20, examples=[1048576])
    shutdown_grace_s: float = Field(10.0, ge=0, le=600, examples=[10])
    keep_results_s: float = Field(3600.0, ge=1, examples=[3600])
    # At most this many finished results stay in memory for status/wait; past it the oldest
    # are forgotten first (the ledger keeps every write's result for repeats either way).
    max_results: int = Field(20000, ge=100, examples=[20000])
    # A connection that sends nothing for this long is closed; a frame begun must arrive
    # whole within frame_timeout_s. Neither counts the time a request waits for its answer.
    idle_timeout_s: float = Field(600.0, gt=0, le=86400, examples=[600])
    frame_timeout_s: float = Field(10.0, gt=0, le=600, examples=[10])
    # One caller cannot take every descriptor: beyond these, new connections are refused.
    # Root is held only to the total: it could stop the daemon anyway.
    max_connections: int = Field(2048, ge=1, le=65536, examples=[2048])
    max_connections_per_uid: int = Field(128, ge=1, le=65536, examples=[128])
    # Calls running at once (held ones not counted): each holds a process tree and a few
    # descriptors, so one caller cannot take them all. Beyond these a call is BUSY. Root is
    # held only to the total.
    max_running_calls: int = Field(1024, ge=1, le=65536, examples=[1024])
    max_running_calls_per_uid: int = Field(256, ge=1, le=65536, examples=[256])


class StateConfig(_Section):
    dir: Path = Field(Path("var"), examples=["/var/lib/rungd"])


class LedgerConfig(_Section):
    rotate_bytes: int = Field(64 << 20, ge=1 << 16, examples=[67108864])
    retention_days: float = Field(7.0, gt=0, examples=[7])
    # Kept allocated past the end of the ledger, so calls already running can always record
    # how they finished; when it cannot be kept, new calls get LEDGER_UNAVAILABLE.
    reserve_bytes: int = Field(1 << 20, ge=0, le=1 << 30, examples=[1048576])
    # Anchors: the chain's head (seq, hash, time) goes to the journal, which ships off-host,
    # at start, at stop and every anchor_every_s when it moved; `rungctl ledger verify
    # --anchors` checks a copy against them. 0 sends none.
    anchor_every_s: float = Field(300.0, ge=0, le=86400, examples=[300])
    # Each anchor is signed with this SSH private key (ssh-keygen -Y sign, namespace
    # rungd-ledger-anchor) when set; verify checks it with --allowed-signers.
    anchor_key: Path | None = Field(None, examples=["/etc/rungd/anchor_key"])
    # Retention of whole files (a `pruned` record names each file deleted). A file goes once
    # its last record is older than keep_days, or, oldest first, while all files pass
    # max_total_bytes; never one with a record inside retention_days or of a call still
    # running, held or unknown. None: no bound of that kind.
    keep_days: float | None = Field(90.0, gt=0, examples=[90])
    max_total_bytes: int | None = Field(None, ge=1 << 20, examples=[4294967296])
    prune_every_s: float = Field(3600.0, ge=1, le=86400, examples=[3600])


class EvidenceConfig(_Section):
    """How long evidence (the full redacted output of calls) is kept, and how much of it."""

    # A file last written longer ago than this is deleted at the next prune; its id then
    # answers EVIDENCE_GONE. The same default as ledger.retention_days.
    retention_days: float = Field(7.0, gt=0, examples=[7])
    # When all evidence files together pass this, the oldest are deleted first until they
    # fit. A call still running keeps its files even if the total stays above the bound
    # until it ends (the journal says so).
    max_total_bytes: int = Field(1 << 30, ge=1 << 16, examples=[1073741824])
    # Seconds between prunes; one also runs at start-up.
    prune_every_s: float = Field(600.0, ge=1, le=86400, examples=[600])
    # An `evidence` reply carries at most this many bytes of text (a caller may ask for
    # less, never more, and never more than the frame limit allows): the rest is a `next`.
    reply_bytes: int = Field(4096, ge=256, le=1 << 20, examples=[4096])


class AccessRule(_Section):
    uids: list[int] = Field(default_factory=list, examples=[[1000]])
    groups: list[str] = Field(default_factory=list, examples=[["rungd-callers"]])


class AccessConfig(_Section):
    """Who may call which tool. Empty lists mean: only the uid the daemon runs as."""

    uids: list[int] = Field(default_factory=list, examples=[[1000]])
    groups: list[str] = Field(default_factory=list, examples=[["rungd-callers"]])
    tools: dict[str, AccessRule] = Field(default_factory=dict)


class PluginsConfig(_Section):
    modules: list[str] = Field(default_factory=list, examples=[["acme_rungd.erp"]])
    files: list[Path] = Field(default_factory=list, examples=[["/etc/rungd/plugins/erp.py"]])
    disable: list[str] = Field(default_factory=list, examples=[["demo"]])
    tool_dirs: list[Path] = Field(default_factory=list, examples=[["/etc/rungd/tools"]])
    # Each plugin's own settings, under its name; the plugin validates them itself.
    settings: dict[str, dict[str, Any]] = Field(default_factory=dict, examples=[{"git_repo": {"repos": {}}}])


class GatesConfig(_Section):
    """The gate for each side-effect class, who may approve, and which keys may sign."""

    read: Gate = Field("none", examples=["none"])
    reversible: Gate = Field("log", examples=["log"])
    visible: Gate = Field("review", examples=["review"])
    irreversible: Gate = Field("signature", examples=["signature"])
    approval_ttl_s: float = Field(900.0, gt=0, le=7 * 86400, examples=[900])
    # One caller may have this many calls waiting for approval; more are BUSY (nothing held).
    max_held_per_uid: int = Field(100, ge=1, examples=[100])
    operator_uids: list[int] = Field(default_factory=list, examples=[[1001]])
    operator_groups: list[str] = Field(default_factory=list, examples=[["rungd-operators"]])
    allowed_signers: Path | None = Field(None, examples=["/etc/rungd/allowed_signers"])


class StepDownConfig(_Section):
    """What the daemon does when a tool's step-down observation fires (its program's
    surface changed: "3 SURFACE_CHANGED in a row"). It always logs a warning and marks the
    tool in ``describe`` and ``rungctl tools``; an operator lifts the mark with
    ``rungctl resume TOOL``."""

    # Also refuse the tool's calls with TOOL_SUSPENDED until an operator resumes it, so no
    # agent keeps spending attempts on a wrapper that no longer fits its program.
    suspend: bool = Field(False, examples=[True])


class CredentialsConfig(_Section):
    file: Path | None = Field(None, examples=["/etc/rungd/credentials.toml"])


class LimitsConfig(_Section):
    """Limits every tool program gets (setrlimit in the child before exec), unless the tool
    declares its own. A program that hits one ends with LIMIT_EXCEEDED naming the limit."""

    # Address space (RLIMIT_AS): a program that allocates past it fails its allocation.
    # Unset by default: RLIMIT_AS counts reserved address space, not memory used, and a JVM or
    # a threaded glibc program reserves gigabytes it never touches (java -version fails at
    # 2 GiB). Set it per host or per tool; the unit's MemoryMax bounds the whole service.
    memory_bytes: int | None = Field(None, ge=1 << 24, examples=[4294967296])
    # RLIMIT_NPROC counts every process of the program's uid, and root is exempt from it.
    processes: int | None = Field(4096, ge=1, examples=[4096])
    file_size_bytes: int | None = Field(16 << 30, ge=0, examples=[17179869184])
    open_files: int | None = Field(1024, ge=8, examples=[1024])
    cpu_s: int | None = Field(None, ge=1, examples=[600])
    # Core dumps stay off unless an operator asks for them (they may hold credentials).
    core_bytes: int = Field(0, ge=0, examples=[0])


class Config(_Section):
    server: ServerConfig = ServerConfig()
    state: StateConfig = StateConfig()
    access: AccessConfig = AccessConfig()
    plugins: PluginsConfig = PluginsConfig()
    credentials: CredentialsConfig = CredentialsConfig()
    ledger: LedgerConfig = LedgerConfig()
    evidence: EvidenceConfig = EvidenceConfig()
    gates: GatesConfig = GatesConfig()
    step_down: StepDownConfig = StepDownConfig()
    limits: LimitsConfig = LimitsConfig()
    source: str = Field("<embedded default>", exclude=True)
    # load_config's argument (None: $RUNGD_CONFIG or the embedded default), so a reload reads
    # the config the same way, $RUNGD_SOCKET and all.
    loaded_from: Path | None = Field(None, exclude=True)
    # The file read (--config or $RUNGD_CONFIG), None for the embedded default: it decides
    # what runs, so its owner and modes are checked (rungd.system.trust).
    file: Path | None = Field(None, exclude=True)

    @property
    def state_dir(self) -> Path:
        return self.state.dir

    @staticmethod
    def gid(group: str) -> int:
        """A group's id from its name or number."""
        return _gid(group)

    def allowed(self, tool: str, uid: int, groups: frozenset[int]) -> bool:
        """Whether a caller with ``uid`` and ``groups`` may call ``tool``."""
        rule: AccessRule | AccessConfig = self.access.tools.get(tool, self.access)
        if not rule.uids and not rule.groups:
            return uid == os.getuid()
        if uid in rule.uids:
            return True
        return bool(groups & {_gid(name) for name in rule.groups})


@functools.lru_cache(maxsize=256)
def _gid(group: str) -> int:
    # Looked up once per name: a call's access check must not wait on NSS (LDAP, sssd).
    return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid


SettingsT = TypeVar("SettingsT", bound=BaseModel)


def plugin_settings(config: Config, plugin: str, model: type[SettingsT], example: str) -> SettingsT | None:
    """A plugin's own section, ``[plugins.settings.<plugin>]``, validated by its model.

    Returns:
        None when the section is absent: the plugin is not configured and offers no tools.

    Raises:
        ConfigError: naming the config file, the key and ``example``.
    """
    raw = config.plugins.settings.get(plugin)
    if raw is None:
        return None
    try:
        return model.model_validate(raw)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{config.source}: key plugins.settings.{plugin}.{key}: {err['msg']}; "
                          f"example: {example}") from None


def not_utf8(data: bytes, exc: UnicodeDecodeError) -> str:
    """Where a file stops being UTF-8, for an error message: ``line 3, byte 0xff``.

    Every file rungd reads as text (the config, tool files, the credentials file) is TOML,
    and TOML is UTF-8: a file saved as Latin-1 fails here rather than loading mangled.
    """
    line = data.count(b"\n", 0, exc.start) + 1
    return f"not valid UTF-8 (line {line}, byte 0x{data[exc.start]:02x})"


UTF8_HINT = "hint: save it as UTF-8 (e.g. iconv -f latin1 -t utf-8 FILE)"


def read_toml(path: Path, label: str | None = None) -> dict[str, Any]:
    """Read ``path`` as a UTF-8 TOML document.

    Args:
        path: the file.
        label: how the message names it (default: the path).

    Raises:
        ConfigError: the file is not UTF-8 or not TOML; the message names it and where.
        OSError: it cannot be read at all; the caller knows best what to say.
    """
    data = path.read_bytes()
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label or path}: {not_utf8(data, exc)}; {UTF8_HINT}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label or path}: not valid TOML: {exc}") from None


def load_config(path: Path | None = None) -> Config:
    """Load and validate a config file, or the embedded default when ``path`` is None.

    What is said explicitly beats the environment, which beats the default. The socket is:
    the socket of ``path`` when one is given (``--config``); else ``$RUNGD_SOCKET``; else the
    socket of the file ``$RUNGD_CONFIG`` names; else the embedded default's. So an exported
    ``RUNGD_SOCKET`` never sends ``rungctl --config /etc/rungd/rungd.toml approve`` to
    another daemon, and a client and a daemon started side by side without ``--config``
    still agree.

    Raises:
        ConfigError: the file is missing, not UTF-8, not TOML, or does not validate. The
            message names the file, the key and a valid example.
        OSError: the file exists but cannot be read (``rungd.ctl.cli.read_config`` says so).
    """
    explicit, loaded_from = path is not None, path
    if path is None and os.environ.get(CONFIG_ENV):
        path = Path(os.environ[CONFIG_ENV])
    if path is None:
        source = embedded_configs() / "default.toml"
        base = Path.cwd()
    else:
        source = path
        base = path.resolve().parent
    try:
        raw = read_toml(source)
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file; hint: pass --config PATH to an existing file") from None
    label = str(source) if path is not None else f"{source} (embedded default)"
    try:
        config = Config.model_validate({**raw, "source": label, "loaded_from": loaded_from,
                                        "file": source if path is not None else None})
    except pydantic.ValidationError as exc:
        raise ConfigError(_explain(label, exc)) from None
    config = _resolve_paths(config, base, source.resolve().parent)
    if not explicit and os.environ.get(SOCKET_ENV):
        config = config.model_copy(
            update={"server": config.server.model_copy(update={"socket": Path(os.environ[SOCKET_ENV])})}
        )
    _check_groups(label, config)
    return config


def _resolve_paths(config: Config, base: Path, shipped: Path) -> Config:
    """Make relative paths absolute: runtime paths under ``base``, plugin paths under ``shipped``.

    For a config file both are its folder. For the embedded default, the socket and state
    go under the working folder while its tool files are the ones shipped beside it.
    """

    def under(p: Path) -> Path:
        return p if p.is_absolute() else base / p

    def beside(p: Path) -> Path:
        return p if p.is_absolute() else shipped / p

    server = config.server.model_copy(update={"socket": under(config.server.socket)})
    state = config.state.model_copy(update={"dir": under(config.state.dir)})
    plugins = config.plugins.model_copy(
        update={
            "files": [beside(p) for p in config.plugins.files],
            "tool_dirs": [beside(p) for p in config.plugins.tool_dirs],
        }
    )
    gates = config.gates.model_copy(
        update={"allowed_signers": under(config.gates.allowed_signers) if config.gates.allowed_signers else None}
    )
    credentials = config.credentials.model_copy(
        update={"file": under(config.credentials.file) if config.credentials.file else None}
    )
    ledger = config.ledger.model_copy(
        update={"anchor_key": under(config.ledger.anchor_key) if config.ledger.anchor_key else None}
    )
    return config.model_copy(
        update={"server": server, "state": state, "plugins": plugins, "credentials": credentials, "gates": gates,
                "ledger": ledger}
    )


def _check_groups(label: str, config: Config) -> None:
    named = [("access.groups", g) for g in config.access.groups]
    named += [(f"access.tools.{t}.groups", g) for t, r in config.access.tools.items() for g in r.groups]
    named += [("gates.operator_groups", g) for g in config.gates.operator_groups]
    if config.server.socket_group:
        named.append(("server.socket_group", config.server.socket_group))
    for key, group in named:
        try:
            _gid(group)
        except KeyError:
            raise ConfigError(
                f"{label}: key {key}: no group named {group!r} on this host; "
                f"hint: create it (groupadd {group}) or use an existing group name or gid"
            ) from None


def _explain(label: str, exc: pydantic.ValidationError) -> str:
    lines = [f"{label}: {exc.error_count()} problem(s)"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        example = _example_for(err["loc"])
        kind: Literal["unknown key", "invalid value"] = (
            "unknown key" if err["type"] == "extra_forbidden" else "invalid value"
        )
        line = f"  key {key}: {kind}: {err['msg']}"
        if example is not None:
            line += f"; example: {example}"
        elif kind == "unknown key":
            line += f"; valid keys here: {', '.join(_keys_at(err['loc'][:-1]))}"
        lines.append(line)
    return "\n".join(lines)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Config
    for part in loc:
        if model is None:
            return None
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return model


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    model = _model_at(loc)
    return sorted(k for k in (model.model_fields if model else {}) if k != "source")


def _example_for(loc: tuple[Any, ...]) -> str | None:
    if not loc:
        return None
    parent = _model_at(loc[:-1])
    field = parent.model_fields.get(str(loc[-1])) if parent else None
    if field is None or not field.examples:
        return None
    value = field.examples[0]
    rendered = f'"{value}"' if isinstance(value, str) else str(value).replace("'", '"')
    return f"{loc[-1]} = {rendered}"
