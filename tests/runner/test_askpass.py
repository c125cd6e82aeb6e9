"""Credential questions through askpass, against real git over HTTP with Basic auth.

A refused question (undeclared, or declared with no credential in rungd's store) must leave
git without any answer: it never sends the server a password, not even an empty one.

The server is a few lines of http.server on loopback that always answers 401, recording
the Authorization header it was sent; git asks for the password through GIT_ASKPASS.
"""

from __future__ import annotations

import base64
import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

SECRET = "git-pw-Xq7-never-leaks"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (.ci/run installs it)")


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        Recorder.seen.append(self.headers.get("Authorization", ""))
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="legacy"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    Recorder.seen = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def tool_file(port: int, declared: bool | str) -> str:
    answer = f"""
[[tools.repo_remote_list.askpass]]
pattern = "^Password for 'http://ops@127.0.0.1:{port}'"
credential = "repo_password"
""" if declared else ""
    return f"""
[program]
name = "repo"
command = "git"

[tools.repo_remote_list]
argv = ["-c", "credential.helper=", "ls-remote", "http://ops@127.0.0.1:{port}/legacy.git"]
deadline_s = 20
[tools.repo_remote_list.description]
does = "Lists the refs of the legacy repository."
use_when = "you need its branches."
do_not_use_when = "you want to change it."
returns = "lines."
on_error = "AUTH_REQUIRED: ask the operator."
if_unknown = "ask."
[tools.repo_remote_list.parse]
kind = "lines"
{answer}"""


@pytest.fixture(params=[True, False, "missing"], ids=["declared", "undeclared", "declared-but-missing"])
def declared(request) -> bool | str:
    """Whether the tool declares the question; "missing": declared, but rungd holds no credential."""
    return request.param


@pytest.fixture
def rungd_config_toml(short_tmp: Path, server: int, declared: bool | str, monkeypatch) -> str:
    if declared != "missing":
        monkeypatch.setenv("RUNGD_CRED_REPO_PASSWORD", SECRET)
    folder = short_tmp / "tools"
    folder.mkdir()
    (folder / "repo.toml").write_text(tool_file(server, declared))
    return f'[plugins]\ntool_dirs = ["{folder}"]\n'


async def test_git_password_question_goes_through_askpass(rungd_daemon, declared) -> None:
    env = await rungd_daemon.call("repo_remote_list", {})
    assert env.status == "error"
    if declared is True:
        # git got the declared credential and sent it; the server still refuses (401),
        # so git fails; the password itself never comes back.
        sent = [base64.b64decode(h.split()[1]).decode() for h in Recorder.seen if h]
        assert f"ops:{SECRET}" in sent
        assert env.error.code in ("FAILED", "AUTH_REQUIRED")
    elif declared == "missing":
        # Looked for before anything starts (a trial's passwd ran, and was stopped at its
        # question): git never ran, and nothing was sent.
        assert (env.error.code, env.outcome) == ("AUTH_REQUIRED", "not_started"), env
        assert "which rungd does not hold" in env.error.message and "nothing was run" in env.error.hint
        assert not [h for h in Recorder.seen if h], Recorder.seen
    else:
        assert env.error.code == "AUTH_REQUIRED"
        assert "Password for 'http://ops@127.0.0.1" in env.error.message
        # A refused question is never answered, not even with nothing: git asked, was held
        # until its tree died, and never sent a password. (curl tries the URL's user with an
        # empty password before git asks anything: that request comes first, and is the
        # last one.)
        sent = [base64.b64decode(h.split()[1]).decode() for h in Recorder.seen if h]
        assert sent in ([], ["ops:"]), Recorder.seen
    assert env.elapsed_ms < 15000  # never waits for the deadline
    state = rungd_daemon.config.state_dir
    for path in state.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in str(env)
