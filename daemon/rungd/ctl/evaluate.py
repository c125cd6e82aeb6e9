"""``rungctl eval``: run a task file through a model the user plugs in (``rungd.authoring.evalharness``)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from rungd.ctl.registry import EXIT_ERROR_RESULT, EXIT_OK, Context, UsageError, arg, command
from rungd.authoring.baseline import format_side_by_side
from rungd.authoring.dryrun import evaluate_dry
from rungd.authoring.evalharness import EvalError, command_model, evaluate, format_text, load_tasks, module_model


@command(
    "eval",
    "hand a model the tool definitions and a task file; record what it calls",
    arg("tasks", type=Path, metavar="TASKS.toml", help="the task file, e.g. examples/tasks/demo.toml"),
    arg("--model", metavar="'CMD ARGS'", help="a program that reads a JSON request on stdin and prints a JSON reply"),
    arg("--model-module", metavar="PKG.MOD:FUNC", help="a Python function request -> reply"),
    arg("--format", default="anthropic", choices=["anthropic", "openai", "mcp", "jsonschema"],
        help="the shape of the definitions the model gets (default: anthropic)"),
    arg("--max-turns", type=int, default=6, help="model replies per task before giving up (default: 6)"),
    arg("--baseline", action="store_true",
        help="dry run only: also run the tasks with one free-text tool per program (the broad-shell shape) "
        "over the same stand-ins, and show both arms side by side"),
    arg("--live", action="store_true",
        help="call the running daemon, whose tools run their real programs (default: a dry run, every "
        "program a stand-in in a throw-away daemon on this config)"),
)
def eval_tasks(ctx: Context) -> int:
    """Run each task of TASKS.toml once with your model, as a dry run unless --live.

    The dry run starts a throw-away daemon on this config (its plugins, tool files and
    settings) whose every program is a stand-in that does nothing (rungd.authoring.dryrun):
    no program started through run() runs for real and no import is written (a handler's
    own subprocess is out of reach), and a task passes on the tool and arguments the model chose. With
    --live the calls go to the running daemon and its real programs, and a task passes only
    on an ok result. The model gets the exported definitions and the conversation; every
    call it asks for runs once, as asked. Per task: the tools chosen, arguments, call count, payload bytes,
    whether a BAD_INPUT was repaired, the final outcome, and wrong-tool picks, missing
    arguments, invented fields and repeated calls against the task's expectation. The
    numbers describe the model you plugged in, on these tasks; nothing is a model of ours.
    Exits 1 when the model failed a task (so a CI job can gate on it), 0 when it passed all.
    """
    args = ctx.args
    if bool(args.model) == bool(args.model_module):
        raise UsageError("give exactly one of --model 'CMD ARGS' or --model-module pkg.mod:func")
    try:
        # shlex only splits the words; the program is then started with that argv, no shell.
        model = command_model(shlex.split(args.model)) if args.model else module_model(args.model_module)
        tasks = load_tasks(args.tasks)
        baseline = None
        if args.live and args.baseline:
            raise UsageError("--baseline runs free-text command lines, so only against stand-ins; "
                             "hint: leave out --live for a dry run with --baseline")
        if args.live:
            report = evaluate(ctx.client, tasks, model, fmt=args.format, max_turns=args.max_turns)
        elif args.socket or getattr(args, "host", None):
            raise UsageError("a dry run starts its own daemon on this host's config, so --socket and --host name "
                             "nothing it would use; hint: add --live to run the tasks against that daemon's real "
                             "programs, or leave them out for a dry run")
        else:
            report, baseline = evaluate_dry(ctx.config, tasks, model, fmt=args.format, max_turns=args.max_turns,
                                            baseline=args.baseline)
    except EvalError as exc:
        raise UsageError(str(exc)) from None
    if ctx.json:
        print(json.dumps({**report.as_dict(), **({"baseline": baseline.as_dict()} if baseline else {})}, indent=2))
    else:
        print(format_text(report))
        if baseline is not None:
            print()
            print(format_side_by_side(report, baseline))
    totals = report.totals()
    return EXIT_OK if totals["passed"] == totals["tasks"] else EXIT_ERROR_RESULT
