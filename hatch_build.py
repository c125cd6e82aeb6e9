"""Build hook: compile the launcher (daemon/rungd/runner/launcher.c) into the wheel.

A call's program is started by the daemon's launcher process; the compiled one starts it in
about half the time the Python one (launcher.py) takes. Where there is no C compiler, or the
compile fails, the wheel is built without it and rungd uses launcher.py: slower, the same
behaviour. ``CC`` chooses the compiler (default ``cc``), ``CFLAGS`` and ``LDFLAGS`` its flags (default ``-O2``).

An editable install (``pip install -e .``) compiles next to launcher.c, where the daemon
looks for it; a wheel carries it as ``rungd/runner/rungd-launcher`` and is tagged for this
platform. The binary embeds the digest of the source it was built from, and the daemon uses
it only when that matches the launcher.c it ships.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("daemon/rungd/runner/launcher.c")
WIRE = Path("daemon/rungd/runner/launcher.py")  # defines the wire the binary reads: part of its digest
INSTALLED = "rungd/runner/rungd-launcher"


class LauncherBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        source = Path(self.root) / SOURCE
        if version == "editable":
            self._compile(source, source.with_name("rungd-launcher"))
            return
        self._scratch = Path(tempfile.mkdtemp(prefix="rungd-launcher-"))
        binary = self._scratch / "rungd-launcher"
        if self._compile(source, binary):
            build_data["force_include"][str(binary)] = INSTALLED
            build_data["pure_python"] = False
            # Any CPython 3 on this platform: the binary uses no Python at all.
            build_data["tag"] = "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    def _compile(self, source: Path, binary: Path) -> bool:
        compiler = shlex.split(os.environ.get("CC", "")) or ["cc"]
        if shutil.which(compiler[0]) is None:
            self.app.display_warning(f"rungd: no C compiler ({compiler[0]}): the launcher stays Python "
                                     "(each start about twice as costly); install gcc and reinstall to compile it")
            return False
        # As rungd.runner.launch.source_digest: what the daemon checks before using the binary.
        digest = hashlib.sha256(source.read_bytes() + (Path(self.root) / WIRE).read_bytes()).hexdigest()[:16]
        partial = binary.with_name(binary.name + ".partial")
        flags = [*shlex.split(os.environ.get("CFLAGS", "-O2")), *shlex.split(os.environ.get("LDFLAGS", ""))]
        done = subprocess.run(
            [*compiler, "-std=gnu11", "-Wall", *flags, f'-DRUNGD_SOURCE_DIGEST="{digest}"', "-o", str(partial),
             str(source)],
            capture_output=True, text=True, check=False)
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            self.app.display_warning(f"rungd: the launcher did not compile ({first}): it stays Python")
            return False
        os.chmod(partial, 0o755)
        os.replace(partial, binary)  # never a half-written launcher where the daemon looks
        return True
