"""Issue 29: ``rungctl probe`` runs a program once as a call would and reports the evidence: the
question whole, where it was asked, the terminal's echo, whether a read changed before it, the
output's shape; and drafts a tool file with the question declared."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from rungd.authoring.probe import probe

# Asks for a secret on its terminal, echo off, over two lines.
ASKS_SECRET = """
    import os, termios
    tty = os.open("/dev/tty", os.O_RDWR)
    attrs = termios.tcgetattr(tty)
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(tty, termios.TCSANOW, attrs)
    os.write(tty, b"Keyring 'ops' is locked.\\nUnlock code (8 digits): ")
    os.read(tty, 100)
"""


def test_a_secret_on_the_terminal_is_reported_with_its_echo_and_drafted_as_a_credential(fake_program) -> None:
    seen = probe([str(fake_program("keyring", ASKS_SECRET))], deadline_s=10)
    assert (seen.ended, seen.asked_on, seen.echo, seen.code) == ("asked", "terminal", "off", "AUTH_REQUIRED")
    assert seen.question == "Keyring 'ops' is locked.\nUnlock code (8 digits):"
    assert seen.terminal == "Keyring 'ops' is locked.\nUnlock code (8 digits): "
    draft = tomllib.loads(seen.draft())
    (name, tool), = draft["tools"].items()
    assert name == "keyring_item_show" and tool["side_effect"] == "read"
    assert tool["credential_prompt"] == [{"pattern": r"^Unlock code \(8 digits\):", "credential": "keyring_secret"}]
    assert tool["description"]["does"] == "FILL IN"  # the file does not load until the author writes it


def test_a_read_that_changed_before_the_question_says_it_acts_before_it_asks(fake_program, short_tmp) -> None:
    marker = short_tmp / "made"
    program = fake_program("maker", f"""
        import sys
        open({str(marker)!r}, "w").close()
        sys.stderr.write("Created. Also archive the old copy? (yes/no) ")
        sys.stderr.flush()
        sys.stdin.readline()
    """)
    seen = probe([str(program)], read=["/bin/ls", str(short_tmp)], deadline_s=10)
    assert (seen.ended, seen.asked_on, seen.code) == ("asked", "stdin", "PROMPT_UNEXPECTED")
    assert seen.acted_before_asking is True
    assert any("CHANGED before the question" in line for line in seen.report())
    tool = tomllib.loads(seen.draft())["tools"]["maker_item_change"]
    assert tool["side_effect"] == "reversible" and tool["confirm"][0]["answer"] == "FILL IN"
    assert "verify" in tool


def test_an_answer_lets_the_author_see_the_next_question(fake_program) -> None:
    program = fake_program("two", """
        import os
        tty = os.open("/dev/tty", os.O_RDWR)
        os.write(tty, b"Proceed with step one? ")
        if os.read(tty, 10).strip() == b"go":
            os.write(tty, b"Step two needs the site name: ")
            os.read(tty, 100)
    """)
    seen = probe([str(program)], answers=[(r"step one\?", "go")], deadline_s=10)
    assert seen.answered and seen.question == "Step two needs the site name:" and seen.echo == "on"


def test_a_program_that_asks_nothing_is_reported_with_its_output_shape(fake_program) -> None:
    seen = probe([str(fake_program("lister", 'print("size: 12\\nowner: root")'))], deadline_s=10)
    assert (seen.ended, seen.exit_status) == ("exited", 0)
    assert seen.as_dict()["output_shape"] == "KEY: VALUE lines"
    assert tomllib.loads(seen.draft())["tools"]["lister_item_show"]["parse"] == {"kind": "key_value"}


def test_the_report_says_the_program_ran_in_a_new_folder_of_its_own(fake_program) -> None:
    # A trial's parted data/disk.img "could not stat" it: the probe ran where a call runs.
    seen = probe([str(fake_program("where", 'import os; print([n for n in os.listdir(".") if n[0] != "."])'))],
                 deadline_s=10)
    assert seen.stdout.strip() == "[]"
    assert any(line.startswith("in:") and "a relative path" in line for line in seen.report())


def test_rungctl_probe_prints_the_evidence_and_writes_the_draft(fake_program, short_tmp) -> None:
    program = fake_program("keyring", ASKS_SECRET)
    draft = short_tmp / "keyring.toml"
    done = subprocess.run([sys.executable, "-m", "rungd.ctl", "probe", "--draft", str(draft), "--", str(program)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "asked:    on its terminal (/dev/tty); a call would end AUTH_REQUIRED" in done.stdout
    assert "echo:     off" in done.stdout and "  | Unlock code (8 digits):" in done.stdout
    assert "credential_prompt" in draft.read_text()
    again = subprocess.run([sys.executable, "-m", "rungd.ctl", "probe", "--draft", str(draft), "--", str(program)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr
    as_json = subprocess.run([sys.executable, "-m", "rungd.ctl", "--json", "probe", "--", str(program)],
                             capture_output=True, text=True, timeout=60)
    assert json.loads(as_json.stdout)["echo"] == "off"


def test_rungctl_probe_of_a_missing_program_says_so(short_tmp: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rungd.ctl", "probe", "--", "no-such-program-here"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no such program on PATH" in done.stderr


def test_at_the_deadline_what_it_printed_is_still_reported(fake_program) -> None:
    program = fake_program("stalls", """
        import sys, time
        sys.stderr.write("Current password: ")
        sys.stderr.flush()
        time.sleep(30)
    """)
    seen = probe([str(program)], deadline_s=1.5)
    assert seen.ended == "deadline" and seen.stderr == "Current password: "
    assert any("may not look into" in line for line in seen.report())


def test_questions_answered_by_answer_stay_in_the_draft(fake_program) -> None:
    program = fake_program("twice", """
        import os
        tty = os.open("/dev/tty", os.O_RDWR)
        for _ in range(2):
            os.write(tty, b"Seal the vault? ")
            os.read(tty, 10)
        print("sealed")
    """)
    seen = probe([str(program)], answers=[(r"vault\?", "yes")], deadline_s=10)
    assert (seen.ended, seen.stdout) == ("exited", "sealed\n")
    tool = tomllib.loads(seen.draft())["tools"]["twice_item_change"]
    assert tool["side_effect"] == "reversible"  # a question it answers lets it act
    assert tool["confirm"] == [{"pattern": r"vault\?", "answer": "FILL IN", "times": 2}]


def test_a_program_is_probed_as_the_account_a_tool_runs_as(fake_program, short_tmp) -> None:
    import os
    import pwd

    if os.geteuid() != 0:
        import pytest

        pytest.skip("running a program as another account needs root")
    program = fake_program("whoami", "import os, pwd\nprint(pwd.getpwuid(os.getuid()).pw_name)\n")
    for folder in (short_tmp, program.parent):  # the account must reach the program
        folder.chmod(0o755)
    seen = probe([str(program)], user="nobody", deadline_s=10)
    assert (seen.ended, seen.stdout) == ("exited", "nobody\n"), seen
    assert tomllib.loads(seen.draft())["tools"]["whoami_item_show"]["user"] == "nobody"
    assert pwd.getpwnam("nobody")
    done = subprocess.run([sys.executable, "-m", "rungd.ctl", "probe", "--user", "no-such-account-x", "--",
                           str(program)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no such account" in done.stderr


SCREEN_FAKE = str(Path(__file__).parents[1] / "fakes" / "screen_config")


def test_a_screen_probe_shows_each_screen_and_drafts_waits_on_what_changed(short_tmp) -> None:
    # Issue 30: --screen runs a screen program, sends one key or text per step, and shows the
    # screen before each send; the draft waits on what each screen showed anew.
    from rungd.authoring.probe import ScreenProbe

    state = short_tmp / "hostname.txt"
    seen = probe([SCREEN_FAKE, "--state", str(state)], deadline_s=20,
                 screen=ScreenProbe(sends=("Down", "Enter", "text:web01")))
    assert seen.ended == "stopped" and len(seen.screens) == 4  # before each send, and at the end
    assert seen.screens[0]["reverse"] == [[3, 4, "Show settings"]]
    assert seen.screens[1]["reverse"] == [[4, 4, "Set hostname"]]
    assert "New hostname: [web01" in seen.screens[3]["rows"][5]
    report = "\n".join(seen.report())
    assert "screen 2 (before --send Enter):" in report and "   3 │    Show settings" in report
    draft = tomllib.loads(seen.draft())
    steps = next(iter(draft["tools"].values()))["screen"]["steps"]
    assert steps[1]["wait"] == {"text": "Set hostname", "row": 4, "attribute": "reverse"}
    assert steps[0]["keys"] == ["Down"] and steps[2]["commit"] is True  # the last send, to be checked
    assert not state.exists()  # nothing was saved: the probe never pressed y


def test_rungctl_probe_refuses_a_key_the_terminal_lacks() -> None:
    done = subprocess.run([sys.executable, "-m", "rungd.ctl", "probe", "--screen", "--term", "vt100", "--send",
                           "Delete", "--", SCREEN_FAKE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "has no Delete key" in done.stderr
