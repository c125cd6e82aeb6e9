"""Real full-screen Debian programs (terminal = "screen") wrapped by tests/real/tools/screen.toml,
written from plugins/README.md section 5d and `rungctl probe --screen` alone.

nano (curses) reads a settings file off its viewer, and edits it: search, a regular
expression replaced through its "Replace with:" field, the file written at its "File Name to
Write:" field (the commit), read back by the screen read; whiptail (newt) reads the same file
in a text box; dialog (curses) reads it through an edit box whose answer comes on descriptor 3; dpkg-reconfigure tzdata, through debconf's whiptail menus, sets the host's
zone to Etc/UTC, read back from /etc/timezone (root only; the host's zone is restored after).
Through the daemon: a screen the steps do not expect (another nano holds the file) is
SURFACE_CHANGED quoting it, the deadline kills a session's whole tree, and the session's cast
replays with asciinema. Every effect is checked outside rungd: the file's bytes, /etc/timezone
and /etc/localtime, the process table.

Debian packages: nano, whiptail, dialog, debconf, tzdata, asciinema.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from rungd.testing import STUB_DESCRIPTION, serve_tool_file

TOOL_FILE = Path(__file__).parent / "tools" / "screen.toml"
CONF = "# app settings\nport = 8080\nhostname = alpha\nowner = ops\n"


def needs(*programs: str) -> pytest.MarkDecorator:
    missing = [p for p in programs if shutil.which(p) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (see the module docstring)")


needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root: dpkg-reconfigure tzdata changes the host's zone")


@pytest.fixture
def root(short_tmp: Path) -> Path:
    """The folder the tool file's @ROOT@ names, with a settings file app.conf."""
    folder = short_tmp / "real"
    (folder / "files").mkdir(parents=True)
    (folder / "files" / "app.conf").write_text(CONF)
    return folder


async def serve(nursery: Any, short_tmp: Path, root: Path, extra: str = "") -> Any:
    """A daemon serving screen.toml (``extra`` tools added to the same file)."""
    text = TOOL_FILE.read_text().replace("@ROOT@", str(root)) + extra
    return await serve_tool_file(nursery, short_tmp, text, name="screen.toml")


def evidence(daemon: Any, env: Any, suffix: str) -> Path:
    name = next(e for e in env.evidence if e.endswith(suffix))
    return Path(daemon.config.state_dir) / "evidence" / name


def nano_processes(path: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if proc.info["name"] == "nano" and str(path) in (proc.info["cmdline"] or []) \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


# ---------------------------------------------------------------------------------- nano, whiptail

@needs("nano")
async def test_nano_viewer_read_takes_the_fields_off_the_screen(nursery, short_tmp, root) -> None:
    conf = root / "files" / "app.conf"
    before = conf.stat()
    daemon = await serve(nursery, short_tmp, root)
    env = await daemon.call("scr_conf_show", {"name": "app"})
    assert env.status == "ok", env.error
    assert env.fields == {"hostname": "alpha", "port": 8080}, env.fields
    # What the file says, read here, not through rungd; nano left it and nothing behind.
    assert conf.read_text() == CONF and conf.stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in conf.parent.iterdir()) == ["app.conf"]
    assert not nano_processes(conf)
    assert "GNU nano" in evidence(daemon, env, ".screen").read_text()
    daemon.daemon.stop()


@needs("whiptail")
async def test_whiptail_text_box_read_takes_the_fields_and_exits_on_ok(nursery, short_tmp, root) -> None:
    conf = root / "files" / "app.conf"
    conf.write_text(CONF.replace("alpha", "db-02").replace("8080", "5432"))
    daemon = await serve(nursery, short_tmp, root)
    env = await daemon.call("scr_conf_box_show", {"name": "app"})
    assert env.status == "ok", env.error
    assert env.fields == {"hostname": "db-02", "port": 5432}, env.fields
    assert "hostname = db-02" in conf.read_text()
    daemon.daemon.stop()


@needs("dialog")
async def test_dialog_edit_box_answers_the_whole_file_on_descriptor_3(nursery, short_tmp, root) -> None:
    conf = root / "files" / "app.conf"
    # Longer than the box: owner is scrolled off its screen, and only the answer holds it.
    text = CONF.replace("owner = ops\n", "".join(f"# note {i}\n" for i in range(30)) + "owner = ops\n")
    conf.write_text(text)
    before = conf.stat().st_mtime_ns
    daemon = await serve(nursery, short_tmp, root)
    env = await daemon.call("scr_conf_dialog_show", {"name": "app"})
    assert env.status == "ok", env.error
    assert env.fields == {"port": 8080, "hostname": "alpha", "owner": "ops"}, env.fields
    assert "owner = ops" not in evidence(daemon, env, ".screen").read_text()
    assert conf.read_text() == text and conf.stat().st_mtime_ns == before
    daemon.daemon.stop()


@needs("nano")
async def test_nano_write_replaces_the_hostname_writes_the_file_and_is_read_back(nursery, short_tmp, root) -> None:
    conf = root / "files" / "app.conf"
    daemon = await serve(nursery, short_tmp, root)
    env = await daemon.call("scr_conf_hostname_set", {"name": "app", "hostname": "web07"}, request_id="n1")
    assert (env.status, env.outcome, env.effect) == ("ok", "done", "changed"), env
    assert env.fields["before"] == {"hostname": "alpha", "port": 8080}, env.fields
    assert env.fields["after"] == {"hostname": "web07", "port": 8080}, env.fields
    # The file itself: that one line changed, every other byte as it was; no lock file left.
    assert conf.read_text() == CONF.replace("hostname = alpha", "hostname = web07")
    assert sorted(p.name for p in conf.parent.iterdir()) == ["app.conf"]
    assert not nano_processes(conf)

    again = await daemon.call("scr_conf_hostname_set", {"name": "app", "hostname": "web07"}, request_id="n2")
    assert (again.status, again.effect) == ("ok", "no_change"), again
    assert conf.read_text() == CONF.replace("hostname = alpha", "hostname = web07")
    daemon.daemon.stop()


@needs("nano")
async def test_a_file_without_the_line_is_refused_by_the_read_before_nano_edits(nursery, short_tmp, root) -> None:
    conf = root / "files" / "app.conf"
    conf.write_text("# app settings\nport = 8080\n")
    before = conf.stat().st_mtime_ns
    daemon = await serve(nursery, short_tmp, root)
    env = await daemon.call("scr_conf_hostname_set", {"name": "app", "hostname": "web07"}, request_id="n3")
    assert env.status == "error" and env.error.code == "SURFACE_CHANGED", env
    # The read before the write (scr_conf_show, nano's viewer) found no hostname: no editor ran.
    assert "the field hostname is not on the screen" in env.error.message
    assert env.fields["screen"].splitlines()[0].rstrip().endswith("View"), env.fields
    assert (env.outcome, env.effect) == ("not_started", "none"), env
    assert conf.read_text() == "# app settings\nport = 8080\n" and conf.stat().st_mtime_ns == before
    assert not nano_processes(conf)
    daemon.daemon.stop()


@needs("nano")
async def test_two_hostname_lines_stop_the_write_at_nanos_second_question(nursery, short_tmp, root) -> None:
    conf = root / "files" / "app.conf"
    text = CONF + "hostname = beta\n"
    conf.write_text(text)
    before = conf.stat().st_mtime_ns
    daemon = await serve(nursery, short_tmp, root)
    env = await daemon.call("scr_conf_hostname_set", {"name": "app", "hostname": "web07"}, request_id="n6")
    # The first line was replaced in nano's buffer, then nano asked again for the second: not
    # the "Replaced 1 occurrence" the steps wait for, so nothing was written (no ^O, no commit).
    assert env.status == "error" and env.error.code == "SURFACE_CHANGED", env
    assert "[ Replaced 1 occurrence ]" in env.error.message and env.fields.get("step") == 8, env
    assert "Replace this instance?" in env.fields["screen"], env.fields
    assert (env.outcome, env.effect) == ("not_started", "none"), env
    assert conf.read_text() == text and conf.stat().st_mtime_ns == before
    assert sorted(p.name for p in conf.parent.iterdir()) == ["app.conf"]  # nano's lock file went with it
    assert not nano_processes(conf)
    daemon.daemon.stop()


def in_own_session(argv: list[str]) -> list[str]:
    """``argv`` run by setsid in a session of its own, with its stdin as its controlling
    terminal, setsid waiting for it. Not start_new_session: the test daemon runs in this
    process and kills any child of it in another session that no call claims."""
    return ["setsid", "--fork", "--wait", "--ctty", *argv]


@pytest.fixture
def other_nano(root: Path) -> Iterator[psutil.Process]:
    """A person's nano holding app.conf open (--locking: its lock file .app.conf.swp)."""
    conf = root / "files" / "app.conf"
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    holder = subprocess.Popen(
        in_own_session(["nano", "--restricted", "--ignorercfiles", "--locking", str(conf)]),
        stdin=slave, stdout=slave, stderr=slave,
        env={"TERM": "xterm-256color", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root)})
    os.close(slave)
    try:
        lock = conf.parent / ".app.conf.swp"
        for _ in range(100):
            if lock.exists():
                break
            time.sleep(0.05)
        assert lock.exists(), "the other nano made no lock file"
        [nano] = psutil.Process(holder.pid).children()
        yield nano
    finally:
        for proc in psutil.Process(holder.pid).children():
            proc.terminate()  # nano removes its lock file on SIGTERM
        holder.wait(10)
        os.close(master)
        (conf.parent / ".app.conf.swp").unlink(missing_ok=True)


@needs("nano")
async def test_a_file_another_nano_holds_is_surface_changed_with_nanos_question(
        nursery, short_tmp, root, other_nano) -> None:
    conf = root / "files" / "app.conf"
    daemon = await serve(nursery, short_tmp, root)
    env = await daemon.call("scr_conf_hostname_set", {"name": "app", "hostname": "web08"}, request_id="n4")
    assert env.status == "error" and env.error.code == "SURFACE_CHANGED", env
    assert "is being edited by root" in env.fields["screen"] and "open anyway?" in env.fields["screen"], env.fields
    assert env.fields.get("step") == 1, env.fields
    assert conf.read_text() == CONF and env.outcome == "not_started", env
    # The call's nano is gone; the person's is still there, its lock file too.
    assert [p.pid for p in nano_processes(conf)] == [other_nano.pid]
    assert (conf.parent / ".app.conf.swp").exists()
    daemon.daemon.stop()


@needs("nano", "asciinema")
async def test_the_sessions_cast_replays_with_asciinema(nursery, short_tmp, root) -> None:
    daemon = await serve(nursery, short_tmp, root)
    env = await daemon.call("scr_conf_hostname_set", {"name": "app", "hostname": "web09"}, request_id="n5")
    assert env.status == "ok", env
    assert "hostname = web09" in (root / "files" / "app.conf").read_text()
    # The call keeps a cast for each screen session: the read before, the write, the read
    # after (all titled with the write's name). The write's is the one with keys typed in it.
    casts = [Path(daemon.config.state_dir) / "evidence" / e for e in env.evidence if e.endswith(".cast")]
    typed = [c for c in casts if any(json.loads(line)[1] == "i" for line in c.read_text().splitlines()[1:])]
    assert len(casts) == 3 and len(typed) == 1, env.evidence
    cast = typed[0]
    assert "web09" in cast.read_text()
    # asciinema opens /dev/tty: it gets a terminal of its own, as an auditor's shell has.
    master, slave = os.openpty()
    try:
        replay = await trio.to_thread.run_sync(lambda: subprocess.run(
            in_own_session(["asciinema", "cat", str(cast)]), stdin=slave, capture_output=True, timeout=60))
    finally:
        os.close(master)
        os.close(slave)
    assert replay.returncode == 0, replay.stderr
    # What nano drew, as it drew it (curses redraws only what changed: whole prompts, not screens).
    assert b"File Name to Write: " + str(root / "files" / "app.conf").encode() in replay.stdout
    assert b"hostname = web09" in replay.stdout and b"[ Wrote 4 lines ]" in replay.stdout
    daemon.daemon.stop()


# ---------------------------------------------------------------------------------- tzdata (root)

def zone_now() -> tuple[str, str]:
    return Path("/etc/timezone").read_text().strip(), os.readlink("/etc/localtime")


def set_zone(zone: str, link: str | None = None) -> None:
    """Set the host's zone directly, as tzdata's postinst would (no rungd, no dialog)."""
    tmp = Path("/etc/.localtime.rungd-test")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(link or f"/usr/share/zoneinfo/{zone}")
    tmp.rename("/etc/localtime")
    Path("/etc/timezone").write_text(zone + "\n")


@pytest.fixture
def paris() -> Iterator[None]:
    """The host on Europe/Paris for the test; its own zone restored after (files and debconf)."""
    if not Path("/etc/timezone").is_file() or not Path("/etc/localtime").is_symlink():
        pytest.skip("needs /etc/timezone and a symlink /etc/localtime (tzdata)")
    saved = zone_now()
    set_zone("Europe/Paris")
    try:
        yield
    finally:
        set_zone(saved[0], saved[1])
        # tzdata's config script takes the zone from /etc/localtime: its debconf answers follow.
        subprocess.run(["dpkg-reconfigure", "-f", "noninteractive", "tzdata"], capture_output=True, timeout=120,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"},
                       stdin=subprocess.DEVNULL, check=False)
        set_zone(saved[0], saved[1])
        assert zone_now() == saved


@needs_root
@needs("dpkg-reconfigure", "whiptail")
async def test_dpkg_reconfigure_tzdata_menus_set_the_zone_to_utc(nursery, short_tmp, root, paris) -> None:
    daemon = await serve(nursery, short_tmp, root)
    env = await daemon.call("scr_timezone_utc_set", {}, request_id="tz1", wait_s=90)
    assert (env.status, env.outcome, env.effect) == ("ok", "done", "changed"), env
    assert (env.fields["before"], env.fields["after"]) == ({"zone": "Europe/Paris"}, {"zone": "Etc/UTC"}), env.fields
    # The host itself: both files, and the C library's idea of the zone.
    assert zone_now()[0] == "Etc/UTC" and zone_now()[1].endswith("/Etc/UTC"), zone_now()
    clock = subprocess.run(["date", "+%Z"], capture_output=True, text=True, check=True,
                           env={"PATH": "/usr/bin:/bin"}).stdout.strip()
    assert clock == "UTC"
    screen = evidence(daemon, env, ".screen").read_text()
    assert "Current default time zone: 'Etc/UTC'" in screen

    again = await daemon.call("scr_timezone_utc_set", {}, request_id="tz2", wait_s=90)
    assert (again.status, again.effect) == ("ok", "no_change"), again
    assert zone_now()[0] == "Etc/UTC"
    daemon.daemon.stop()


UNFINISHED = """
# The same program with steps that stop short at the area menu (an author's unfinished file):
# tzdata waits there for ever, so the call ends at its deadline.
[tools.scr_timezone_unfinished_set]
program = "dpkg_reconfigure"
side_effect = "reversible"
terminal = "screen"
argv = ["-f", "dialog", "tzdata"]
deadline_s = 4
[tools.scr_timezone_unfinished_set.description]
""" + STUB_DESCRIPTION + """
[tools.scr_timezone_unfinished_set.verify]
tool = "scr_timezone_show"
expect = { zone = "Etc/UTC" }
[tools.scr_timezone_unfinished_set.screen]
[[tools.scr_timezone_unfinished_set.screen.steps]]
wait = { text = "Geographic area:", rows = [1, 12] }
timeout_s = 20
keys = ["Home"]
[[tools.scr_timezone_unfinished_set.screen.steps]]
wait = { pattern = 'Africa\\s', rows = [8, 20], attribute = "bg:red" }
"""


def call_processes() -> dict[int, str]:
    """This test's descendants that carry a rungd call tag: a call's whole tree."""
    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.environ().get("RUNGD_CALL") and proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@needs_root
@needs("dpkg-reconfigure", "whiptail", "pgrep")
async def test_the_deadline_kills_the_whole_tree_mid_session(nursery, short_tmp, root, paris) -> None:
    daemon = await serve(nursery, short_tmp, root, UNFINISHED)
    seen: dict[int, str] = {}
    done = trio.Event()

    async def watch() -> None:
        while not done.is_set():
            seen.update(await trio.to_thread.run_sync(call_processes))
            await trio.sleep(0.1)

    nursery.start_soon(watch)
    started = time.monotonic()
    try:
        env = await daemon.call("scr_timezone_unfinished_set", {}, request_id="tz3", wait_s=60)
    finally:
        done.set()
    elapsed = time.monotonic() - started
    assert env.status == "error" and env.error.code == "TIMEOUT", env
    assert 3.5 < elapsed < 15, elapsed
    # The session was under way: dpkg-reconfigure (perl), tzdata's config script and whiptail's menu.
    names = set(seen.values())  # as the kernel shows them: cut to 15 characters
    assert {"dpkg-reconfigur", "tzdata.config", "whiptail"} <= names, seen
    # None of them outlived the call, and nothing answered tzdata: the zone is as it was.
    await trio.sleep(0.2)
    alive = [pid for pid in seen if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, {pid: seen[pid] for pid in alive}
    assert subprocess.run(["pgrep", "-f", "Configuring tzdata"], capture_output=True).returncode == 1
    assert zone_now() == ("Europe/Paris", "/usr/share/zoneinfo/Europe/Paris")
    assert env.outcome in ("not_started", "unknown") and env.effect == "none", env
    assert "Geographic area:" in evidence(daemon, env, ".screen").read_text()
    daemon.daemon.stop()
