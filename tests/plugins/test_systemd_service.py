"""The systemd_service plugin. systemd is not PID 1 on this machine (a container), so the
real systemctl cannot operate here: these tests use tests/fakes/systemctl, which imitates
its `show` and `restart` output and exit statuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from rungd.client import Client
from tests.conftest import FAKES


@pytest.fixture
def rungd_config_toml(short_tmp: Path) -> str:
    return f"""
[gates]
visible = "log"   # approvals have their own tests; here the restart runs at once

[plugins.settings.systemd_service]
services = ["web", "flaky", "locked", "slow", "ghost"]
systemctl = "{FAKES / 'systemctl'}"
healthy_within_s = 2
env = {{ FAKE_SYSTEMCTL_DB = "{short_tmp / 'units.json'}" }}
"""


async def test_status_is_parsed(rungd_daemon) -> None:
    env = await rungd_daemon.call("service_status_show", {"service": "web"})
    assert env.status == "ok", env.error
    assert (env.fields["active_state"], env.fields["healthy"], env.fields["unit"]) == ("active", True, "web.service")


async def test_restart_is_verified_by_a_newer_start(rungd_daemon) -> None:
    env = await rungd_daemon.call("service_restart", {"service": "web", "reason": "test restart"}, request_id="r1")
    assert (env.status, env.effect, env.fields["healthy"]) == ("ok", "changed", True), env.error
    assert env.fields["main_pid_after"] != env.fields["main_pid_before"]


async def test_service_that_does_not_come_back_is_unhealthy(rungd_daemon) -> None:
    env = await rungd_daemon.call("service_restart", {"service": "flaky", "reason": "test restart"},
                                  request_id="r2")
    assert (env.error.code, env.error.retry, env.next_action) == ("UNHEALTHY_AFTER_RESTART", "no", "stop")
    assert env.fields.get("state_after") == "failed", env


async def test_polkit_question_is_auth_required(rungd_daemon) -> None:
    env = await rungd_daemon.call("service_restart", {"service": "locked", "reason": "test restart"},
                                  request_id="r3")
    assert (env.error.code, env.outcome) == ("AUTH_REQUIRED", "not_started")


async def test_unknown_unit_is_not_found(rungd_daemon) -> None:
    env = await rungd_daemon.call("service_status_show", {"service": "ghost"})
    assert env.error.code == "NOT_FOUND"


async def test_service_outside_the_allow_list_is_bad_input(rungd_daemon) -> None:
    env = await rungd_daemon.call("service_status_show", {"service": "sshd"})
    assert env.error.code == "BAD_INPUT" and "web" in env.error.hint


async def test_restart_waits_at_the_review_gate_by_default(short_tmp, nursery) -> None:
    from rungd.config import load_config
    from rungd.testing import start_daemon, write_config

    config = load_config(write_config(short_tmp, f"""
[plugins.settings.systemd_service]
services = ["web"]
systemctl = "{FAKES / 'systemctl'}"
"""))
    daemon = await start_daemon(nursery, config)
    env = await daemon.call("service_restart", {"service": "web", "reason": "needs approval"}, request_id="r4",
                            wait_s=0.2)
    assert (env.status, env.next_action) == ("pending", "wait_approval")
    definition = await daemon.run(Client.describe, "service_restart")
    assert definition.settle == {"tool": "service_status_show", "inputs": {"service": "$service"}}
    daemon.daemon.stop()
