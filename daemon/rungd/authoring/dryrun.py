"""``rungctl eval``'s dry run: a throw-away daemon on the operator's config whose every
program is a stand-in that does nothing, successfully.

The daemon loads the config's plugins and tool files with their settings, as the real one
would, so the model is handed the same definitions and the daemon validates, admits and
records each call the same way; only the program each call starts is replaced
(``CallContext.stand_in``, as ``rungctl check`` does for Python plugins). The stand-in asks
what a write's confirmation recognises, exits 0 and prints the program's ``example_output``
(nothing, when it has none: a read that parses its output then answers SURFACE_CHANGED).
What it answers says nothing about the model: a task is scored on the tool and arguments it
chose. Gates are none, credentials are random values,
deadlines at most ``SLOW_DEADLINE_S``, and everything is removed afterwards.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from rungd.authoring.baseline import Baseline, expected_commands, run_baseline
from rungd.authoring.check import SLOW_DEADLINE_S, blocking, throwaway_daemon
from rungd.authoring.evalharness import EvalError, Model, Report, Task, evaluate
from rungd.authoring.plugin_check import StandIn, seeded_secrets, standin_config
from rungd.authoring.standins import write_plugin_standin
from rungd.authoring.definitions import Format
from rungd.client import Client
from rungd.config import Config
from rungd.core.errors import ConfigError, PluginError
from rungd.service.plugins import Hooks


def evaluate_dry(config: Config, tasks: list[Task], model: Model, *, fmt: Format = "anthropic",
                 max_turns: int = 6, baseline: bool = False) -> tuple[Report, Baseline | None]:
    """``evaluate`` against a throw-away daemon of stand-ins for ``config``; blocking. With
    ``baseline``, also the broad-shell arm (``rungd.authoring.baseline``) over the same
    stand-ins, after the task-shaped one.

    Raises:
        EvalError: the config's plugins or tool files do not load; the message has a hint.
    """
    try:
        tools = Hooks.load(config).collect_tools(config)
    except (PluginError, ConfigError) as exc:
        raise EvalError(f"the config's plugins do not load: {exc}; hint: `rungd check-config` names the problem") from None
    return blocking(_serve_and_evaluate, config, seeded_secrets(tools.values()), tasks, model, fmt, max_turns,
                    baseline, error=EvalError)


async def _serve_and_evaluate(config: Config, values: dict[str, str], tasks: list[Task], model: Model,
                              fmt: Format, max_turns: int, baseline: bool) -> tuple[Report, Baseline | None]:
    folder = Path(tempfile.mkdtemp(prefix="rungd-"))  # short: the socket's path must fit sun_path
    try:
        (folder / "standins").mkdir()
        script = write_plugin_standin(folder / "standins", "success")
        stand_in = StandIn(script, SLOW_DEADLINE_S)
        wait_s = SLOW_DEADLINE_S * 2 + 10

        def both(client: Client) -> tuple[Report, Baseline | None]:
            expected = expected_commands(client, stand_in, tasks, wait_s) if baseline else {}
            report = evaluate(client, tasks, model, fmt=fmt, max_turns=max_turns, wait_s=wait_s, dry_run=True)
            if not baseline:
                return report, None
            return report, run_baseline(tasks, model, expected, script, fmt, max_turns)

        async with throwaway_daemon(standin_config(config, folder, values), "the dry run's daemon",
                                    stand_in=stand_in, error=EvalError) as (running, _logs):
            return await running.run(both)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
