"""A tool whose program prints numbered lines, for the tests of reading evidence back.

``evidence_lines_show`` runs a real child (this Python, with a fixed script: no shell) that
prints ``count`` lines with multi-byte characters in them, marks every ``needle_every``-th
line with the word "needle", can print the credential it was handed (so redaction shows),
and can stay alive for ``pause`` seconds after printing (a call still running).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

from pydantic import Field

from rungd.sdk import Description, Program, Result, Timing, Tool, ToolInputs, hookimpl, run

SCRIPT = r"""
import os, sys, time
count, every, pause, leak = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
for i in range(1, count + 1):
    tag = " needle" if every and i % every == 0 else ""
    sys.stdout.write(f"line {i:05d} \u00fcn\u00efcode \u2713{tag} " + "x" * (i % 13) + "\n")
if leak:
    sys.stdout.write("token=" + os.environ["FAKE_SECRET"] + " end\n")
sys.stdout.flush()
time.sleep(pause)
"""


class LinesInputs(ToolInputs):
    count: Annotated[int, Field(ge=0, le=200000, description="Lines to print.", examples=[10])]
    needle_every: Annotated[int, Field(ge=0, le=1000, description="Mark every Nth line.", examples=[5])] = 0
    pause: Annotated[float, Field(ge=0, le=30, description="Seconds to stay after printing.", examples=[0])] = 0
    leak: Annotated[bool, Field(description="Print the credential.", examples=[False])] = False


async def lines(ctx: Any, inputs: LinesInputs) -> Result:
    program = Program(
        argv=(sys.executable, "-c", SCRIPT, str(inputs.count), str(inputs.needle_every), str(inputs.pause),
              "1" if inputs.leak else "0"),
        env_credentials={"FAKE_SECRET": "fake_password"} if inputs.leak else {},
        keep_bytes=1024,
    )
    done = await run(ctx, program)
    return Result(fields={"exit_status": done.exit_status, "stdout_bytes": done.stdout_bytes},
                  truncated=done.truncated, narrow="read the rest with rungctl evidence" if done.truncated else None)


@hookimpl
def rungd_register_tools(register: Any) -> None:
    register(Tool(name="evidence_lines_show", inputs=LinesInputs, outputs={"exit_status": "the exit status"},
                  handler=lines, timing=Timing(deadline_s=40),
                  description=Description(does="Prints numbered lines.", use_when="testing evidence.",
                                          do_not_use_when="not testing.", returns="the exit status.",
                                          on_error="codes.", if_unknown="ask.")))
