"""The git_repo plugin against real git: repositories made in a temp folder, a real remote."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (.ci/run installs it)")

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example", "GIT_CONFIG_GLOBAL": "/dev/null"}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repos(short_tmp: Path) -> dict[str, Path]:
    remote = short_tmp / "remote.git"
    git("init", "--bare", "-b", "main", str(remote), cwd=short_tmp)
    author = short_tmp / "author"
    git("clone", str(remote), str(author), cwd=short_tmp)
    (author / "README").write_text("one\n")
    git("add", "README", cwd=author)
    git("commit", "-m", "first", cwd=author)
    git("push", "origin", "HEAD:main", cwd=author)
    deployed = short_tmp / "deployed"
    git("clone", str(remote), str(deployed), cwd=short_tmp)
    return {"author": author, "deployed": deployed, "notrepo": short_tmp}


@pytest.fixture
def rungd_config_toml(repos: dict[str, Path]) -> str:
    return f"""
[plugins.settings.git_repo]
repos = {{ app = "{repos['deployed']}", broken = "{repos['notrepo']}" }}
"""


async def test_status_reads_the_real_repository(rungd_daemon, repos) -> None:
    env = await rungd_daemon.call("git_repo_status_show", {"repo": "app"})
    assert env.status == "ok", env.error
    assert env.fields["branch"] == "main" and env.fields["clean"] is True
    assert env.fields["head"] == git("rev-parse", "HEAD", cwd=repos["deployed"]).strip()


async def test_a_path_is_never_an_input(rungd_daemon, repos) -> None:
    env = await rungd_daemon.call("git_repo_status_show", {"repo": str(repos["deployed"])})
    assert env.error.code == "BAD_INPUT"
    assert "app" in env.error.hint


async def test_pull_reports_changed_then_no_change_from_the_commits(rungd_daemon, repos) -> None:
    (repos["author"] / "README").write_text("two\n")
    git("commit", "-am", "second", cwd=repos["author"])
    git("push", "origin", "HEAD:main", cwd=repos["author"])
    new_head = git("rev-parse", "HEAD", cwd=repos["author"]).strip()
    env = await rungd_daemon.call("git_repo_pull", {"repo": "app"}, request_id="p1")
    assert (env.status, env.effect) == ("ok", "changed"), env.error
    assert env.fields["commit_after"] == new_head != env.fields["commit_before"]
    again = await rungd_daemon.call("git_repo_pull", {"repo": "app"}, request_id="p2")
    assert (again.status, again.effect) == ("ok", "no_change")
    log = await rungd_daemon.call("git_repo_log_show", {"repo": "app", "count": 5})
    assert [c["subject"] for c in log.fields["commits"]] == ["second", "first"]  # no pager got in the way


async def test_diverged_history_is_refused_and_nothing_changes(rungd_daemon, repos) -> None:
    deployed = repos["deployed"]
    (deployed / "local").write_text("x\n")
    git("add", "local", cwd=deployed)
    git("commit", "-m", "local change", cwd=deployed)
    (repos["author"] / "README").write_text("three\n")
    git("commit", "-am", "upstream change", cwd=repos["author"])
    git("push", "origin", "HEAD:main", cwd=repos["author"])
    before = git("rev-parse", "HEAD", cwd=deployed).strip()
    env = await rungd_daemon.call("git_repo_pull", {"repo": "app"}, request_id="p3")
    assert (env.error.code, env.next_action) == ("NOT_FAST_FORWARD", "stop")
    assert git("rev-parse", "HEAD", cwd=deployed).strip() == before


async def test_a_folder_that_is_not_a_repository(rungd_daemon) -> None:
    env = await rungd_daemon.call("git_repo_status_show", {"repo": "broken"})
    assert env.error.code == "NOT_A_REPOSITORY"
