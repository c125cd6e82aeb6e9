"""Real Debian programs wrapped by tool files written from plugins/README.md alone.

Each test gets a daemon serving ``tests/real/tools/*.toml`` with ``@ROOT@`` (the test's
folder) and ``@USER@`` (a service account made for the test with useradd and removed after
it) filled in, a credentials file, and the folders the tools work in. Needs root: the tools
make accounts, run programs as another user and install crontabs. ``.ci/run`` installs the
programs.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

TOOLS = Path(__file__).parent / "tools"
# What the tool files wrap; a host without one of them cannot run the suite.
PROGRAMS = ("useradd", "usermod", "chfn", "groupadd", "chpasswd", "getent", "passwd", "ssh-keygen", "openssl",
            "sqlite3", "bc", "crontab", "tar", "zip", "unzip", "gzip", "git", "dpkg-query", "apt-cache", "man",
            "sudo", "mv", "ln", "rm", "find", "stat", "ls", "printenv", "touch",
            # tools/terminal.toml: programs that ask on their terminal
            "psql", "mysql", "ldapsearch", "htpasswd", "ccrypt", "7z", "cryptsetup", "zipcloak", "gpg", "chsh",
            # tools/screen.toml: screen programs
            "nano", "whiptail", "dialog", "dpkg-reconfigure")

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="needs root: accounts, crontabs, other users")


def missing_programs() -> list[str]:
    return [name for name in PROGRAMS if shutil.which(name) is None]


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a setup or inspection command directly (not through rungd)."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=check)


def new_name(prefix: str) -> str:
    """An account or group name no test run has used: tests must not meet each other's."""
    return f"{prefix}{secrets.token_hex(3)}"


def remove_account(name: str) -> None:
    run("crontab", "-u", name, "-r", check=False)
    run("userdel", name, check=False)
    run("groupdel", name, check=False)


@pytest.fixture
def service_user() -> Iterator[str]:
    """A real account the tools run as (user = "...", sudo -u); removed after the test."""
    name = new_name("rgsvc")
    run("useradd", "--no-create-home", "--home-dir", f"/nonexistent-{name}", "--shell", "/usr/sbin/nologin", name)
    yield name
    remove_account(name)


@pytest.fixture
def real_root(short_tmp: Path, service_user: str) -> Path:
    """The folder the tool files' @ROOT@ names, with what each tool works on."""
    if missing := missing_programs():
        pytest.fail(f"the real-program suite needs {', '.join(missing)}; .ci/run installs them")
    root = short_tmp / "real"
    for sub in ("keys", "files", "src", "out", "unpacked", "shared"):
        (root / sub).mkdir(parents=True)
    # The service account must reach its shared folder: the folders above it are traversable.
    for folder in (short_tmp, root):
        folder.chmod(0o711)
    account = pwd.getpwnam(service_user)
    os.chown(root / "shared", account.pw_uid, account.pw_gid)
    (root / "src" / "hello.txt").write_text("hello from rungd\n" * 50)
    (root / "src" / "notes.md").write_text("# notes\n")
    with sqlite3.connect(root / "notes.db") as db:
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
    run("git", "init", "--quiet", str(root / "repo"))
    run("git", "-C", str(root / "repo"), "-c", "user.name=t", "-c", "user.email=t@localhost",
        "commit", "--quiet", "--allow-empty", "-m", "start")
    return root


@pytest.fixture
def rungd_config_toml(short_tmp: Path, real_root: Path, service_user: str) -> str:
    tools = short_tmp / "tools"
    tools.mkdir()
    for source in sorted(TOOLS.glob("*.toml")):
        text = source.read_text().replace("@ROOT@", str(real_root)).replace("@USER@", service_user)
        (tools / source.name).write_text(text)
    creds = short_tmp / "credentials.toml"
    creds.write_text('ssh_key_passphrase = "correct horse battery"\npem_passphrase = "staple gun 42"\n')
    creds.chmod(0o600)
    return (f'[gates]\nreversible = "log"\nvisible = "log"\nirreversible = "log"\n\n'
            f'[credentials]\nfile = "{creds}"\n\n[plugins]\ntool_dirs = ["{tools}"]\n')
