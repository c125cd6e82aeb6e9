"""systemd_service: read and restart allow-listed services with systemctl (seed 000's
worked example ``service_restart``).

    [plugins.settings.systemd_service]
    services = ["nginx", "app-worker"]

A restart is a visible write: by default it waits at the review gate. It runs
``systemctl restart --no-ask-password`` (polkit questions fail at once and become
AUTH_REQUIRED), then polls ``systemctl show`` until the service is active again with a
newer start time (``changed``), or reports UNHEALTHY_AFTER_RESTART. After a timeout the
outcome is unknown and ``service_status_show`` settles it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Annotated, Any, Literal

import trio
from pydantic import BaseModel, ConfigDict, Field
from rungd.sdk import (
    AuthRequired,
    CallContext,
    Completed,
    ConfigError,
    Description,
    ErrorRule,
    Heading,
    PluginSettings,
    Program,
    Result,
    RuledOut,
    Session,
    SettleSpec,
    StepDown,
    SurfaceChanged,
    Timing,
    Tool,
    ToolError,
    ToolInputs,
    check_exit,
    hookimpl,
    run,
)

PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "MainPID", "ActiveEnterTimestampMonotonic")
NOT_FOUND = ErrorRule("NOT_FOUND", "no", "stop", "the operator must install the unit or fix the allow-list",
                      "systemd knows no such unit")
UNHEALTHY = ErrorRule("UNHEALTHY_AFTER_RESTART", "no", "stop",
                      "do not restart again; read service_status_show and hand over to a person",
                      "the service did not come back active after the restart")


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    services: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9@_.:-]{1,128}$")]] = Field(min_length=1)
    systemctl: str = "systemctl"
    healthy_within_s: float = Field(30.0, gt=0, le=600)
    env: dict[str, str] = {}


def parse_show(text: str) -> dict[str, Any]:
    """Parse ``systemctl show -p ...`` (``Key=value`` lines) into typed fields."""
    found = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    missing = [p for p in PROPERTIES if p not in found]
    if missing:
        raise SurfaceChanged("systemctl show did not print the requested properties",
                             hint=f"missing {missing}; saw {text[:160]!r}", outcome="done")
    try:
        return {
            "unit": found["Id"],
            "load_state": found["LoadState"],
            "active_state": found["ActiveState"],
            "sub_state": found["SubState"],
            "main_pid": int(found["MainPID"] or 0),
            "active_since_us": int(found["ActiveEnterTimestampMonotonic"] or 0),
            "healthy": found["ActiveState"] == "active",
        }
    except ValueError:
        raise SurfaceChanged("systemctl show printed a non-numeric MainPID or timestamp",
                             hint=f"saw {text[:160]!r}", outcome="done") from None


class Systemctl:
    def __init__(self, settings: Settings, command: str) -> None:
        self.settings = settings
        self.command = command

    async def run(self, ctx: CallContext, *args: str, commits: bool = True, example: str | None = None) -> Completed:
        program = Program(argv=(self.command, *args), env=self.settings.env, stdin="eof", commits=commits,
                          example_output=example)
        return await run(ctx, program)

    async def show(self, ctx: CallContext, service: str) -> dict[str, Any]:
        done = await self.run(ctx, "show", "--no-pager", "-p", ",".join(PROPERTIES), f"{service}.service",
                              commits=False, example=f"Id={service}.service\nLoadState=loaded\nActiveState=active\n"
                              "SubState=running\nMainPID=4242\nActiveEnterTimestampMonotonic=1000000\n")
        check_exit(done, {})
        fields = parse_show(done.stdout)
        if fields["load_state"] == "not-found":
            raise ToolError("NOT_FOUND", f"systemd knows no unit {service}.service", outcome="done")
        return fields

    async def restart(self, ctx: CallContext, service: str) -> None:
        done = await self.run(ctx, "restart", "--no-ask-password", f"{service}.service")
        if done.exit_status != 0 and "authentication required" in done.stderr.lower():
            raise AuthRequired(f"systemctl needs authorization to restart {service}",
                               hint="rungd's user needs a polkit rule or sudoers entry for this unit; "
                                    "the operator must grant it", outcome="not_started")
        check_exit(done, {5: NOT_FOUND})


def _tools(settings: Settings, command: str) -> list[Tool]:
    systemctl = Systemctl(settings, command)
    names = list(settings.services)
    service_type = Annotated[Literal[tuple(names)], Field(  # type: ignore[valid-type]
        description=f"The service, by its unit name without .service: one of {', '.join(names)}.",
        examples=[names[0]])]

    class StatusInputs(ToolInputs):
        service: service_type

    class RestartInputs(ToolInputs):
        service: service_type
        reason: Annotated[str, Field(min_length=3, max_length=200, description="Why, for the ledger and the "
                                     "approving operator.", examples=["stuck after config reload"])]

    async def status(ctx: CallContext, inputs: StatusInputs) -> Result:
        return Result(fields={"service": inputs.service, **await systemctl.show(ctx, inputs.service)},
                      verified_by="systemctl show")

    async def restart(ctx: CallContext, inputs: RestartInputs) -> Result:
        before = await systemctl.show(ctx, inputs.service)
        await systemctl.restart(ctx, inputs.service)
        give_up = trio.current_time() + settings.healthy_within_s
        after = await systemctl.show(ctx, inputs.service)
        while not _restarted(before, after) and trio.current_time() < give_up:
            await trio.sleep(0.5)
            after = await systemctl.show(ctx, inputs.service)
        fields = {"service": inputs.service, "state_after": after["active_state"], "healthy": after["healthy"],
                  "main_pid_before": before["main_pid"], "main_pid_after": after["main_pid"],
                  "active_since_us": after["active_since_us"]}
        if not _restarted(before, after):
            raise ToolError("UNHEALTHY_AFTER_RESTART",
                            f"{inputs.service} is {after['active_state']}/{after['sub_state']} after the restart",
                            outcome="done", fields=fields, effect="changed")
        return Result(fields=fields, effect="changed", verified_by="systemctl show: active, with a newer start time")

    errors = (NOT_FOUND, ErrorRule.core("AUTH_REQUIRED"), ErrorRule.core("SURFACE_CHANGED"),
              ErrorRule.core("TIMEOUT"))
    # Seed 000's worked example "service_restart": rung 2, rung 1 not present for these owners.
    session = Session("nobody signs in: the daemon's own service credential (polkit or sudo rules)")
    ruled_out = (RuledOut(1, "present", "D-Bus is reachable, but the owners expose no restart-and-health API"),)
    status_heading = Heading(2, ruled_out, (StepDown("SURFACE_CHANGED", count=3, to="stop: a person checks "
                                                     "systemctl's output format"),),
                             climb="the owners expose health as an API", session=session)
    restart_heading = Heading(
        2, ruled_out,
        (StepDown(("PROMPT_UNEXPECTED", "SURFACE_CHANGED"), count=2, within_s=86400,
                  to="rung 4, the dashboard's restart button (ask the owners for an API first)"),),
        climb="the owners expose restart and health as an API -> rung 1", attempts=1, session=session)
    return [
        Tool(
            name="service_status_show",
            description=Description(
                does="Reads the state of one allow-listed systemd service: loaded, active, its main pid and "
                     "since when it is active. Changes nothing.",
                use_when="you need to know whether a service is running or healthy.",
                do_not_use_when="you want to restart it; use service_restart.",
                returns="service, unit, load_state, active_state, sub_state, main_pid, active_since_us, healthy.",
                on_error="NOT_FOUND (stop: not installed), SURFACE_CHANGED (stop), TIMEOUT (retry once).",
                if_unknown="if you do not know which service is meant, ask the user; do not guess.",
            ),
            inputs=StatusInputs, outputs={"healthy": "active_state is active", "main_pid": "its main process"},
            handler=status, errors=errors, timing=Timing(deadline_s=15), cap_bytes=1024, log_fields=("service",),
            heading=status_heading,
        ),
        Tool(
            name="service_restart",
            description=Description(
                does="Restarts one allow-listed systemd service and waits until it is healthy again. Visible to "
                     "its users (a short interruption that cannot be undone); needs an operator's approval. A "
                     "repeat with the same request_id restarts nothing more.",
                use_when="a service is stuck or must pick up new configuration, and the user asked for a restart.",
                do_not_use_when="you only need its state; use service_status_show. Never to fix a failing "
                                "service in a loop.",
                returns="service, state_after, healthy, main_pid_before, main_pid_after; effect changed after a "
                        "status read shows it active with a newer start time.",
                on_error="UNHEALTHY_AFTER_RESTART (stop, hand over), AUTH_REQUIRED (ask the operator), NOT_FOUND "
                         "(stop: not installed), TIMEOUT with outcome unknown (read service_status_show before any "
                         "retry).",
                if_unknown="if you do not know which service or why, ask the user; do not guess.",
            ),
            inputs=RestartInputs, outputs={"healthy": "active after the restart", "state_after": "ActiveState"},
            handler=restart, side_effect="visible",
            errors=(*errors, UNHEALTHY, ErrorRule.core("PROMPT_UNEXPECTED")),
            timing=Timing(deadline_s=settings.healthy_within_s + 60, commit_point="spawn",
                          settle=SettleSpec("service_status_show", {"service": "$service"})),
            cap_bytes=1024, concurrency=1, log_fields=("service", "reason"), heading=restart_heading,
        ),
    ]


def _restarted(before: dict[str, Any], after: dict[str, Any]) -> bool:
    return after["healthy"] and after["active_since_us"] > before["active_since_us"]


@hookimpl
def rungd_register_tools(register: Callable[[Tool], None], settings: PluginSettings) -> None:
    parsed = settings.parse(Settings, 'services = ["nginx"]')
    if parsed is None:
        return  # not configured: no services, no tools
    command = shutil.which(parsed.systemctl)
    if command is None:
        raise ConfigError(f"{settings.source}: key plugins.settings.{settings.name}.systemctl: "
                          f"{parsed.systemctl!r} not found")
    for tool in _tools(parsed, command):
        register(tool)
