"""git_repo: status, history and fast-forward pulls of allow-listed git repositories.

The model names a repository by its configured name, never by path:

    [plugins.settings.git_repo]
    repos = { app = "/srv/app", docs = "/srv/docs" }
    askpass_credential = "git_token"      # optional: answers git's "Password for ..." question

git runs with no terminal, no pager (PAGER=cat), no editor and GIT_TERMINAL_PROMPT=0; a
credential question goes through askpass and is answered only with the declared
credential, otherwise the call ends AUTH_REQUIRED quoting it. A pull reports its effect
from the commit before and after, read back with ``git rev-parse``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from rungd.sdk import (
    CallContext,
    ConfigError,
    CredentialPrompt,
    Description,
    ErrorRule,
    Heading,
    PluginSettings,
    Program,
    Result,
    RuledOut,
    Session,
    SettleSpec,
    StepDown,
    SurfaceChanged,
    Timing,
    Tool,
    ToolInputs,
    UnexpectedState,
    check_exit,
    hookimpl,
    run,
)

EXAMPLE_COMMIT = "5d41402abc4b2a76b9719d911017c592ae4f1e6b\n"
NOT_A_REPO = ErrorRule("NOT_A_REPOSITORY", "no", "stop", "the operator must fix plugins.settings.git_repo.repos",
                       "the configured folder is not a git work tree")
DIVERGED = ErrorRule("NOT_FAST_FORWARD", "no", "stop", "someone must merge or rebase by hand; nothing was changed",
                     "local and upstream history diverged")
NO_UPSTREAM = ErrorRule("NO_UPSTREAM", "no", "stop", "the branch tracks no remote branch; the operator must set one",
                        "the current branch has no upstream")


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    repos: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")], Path] = Field(min_length=1)
    askpass_credential: str | None = None
    git: str = "git"


class Git:
    """Runs git for one call against one configured repository."""

    def __init__(self, settings: Settings, command: str) -> None:
        self.settings = settings
        self.command = command
        self.askpass = (
            (CredentialPrompt(re.compile(r"^(Password|Username) for "), settings.askpass_credential),)
            if settings.askpass_credential else ()
        )

    async def run(self, ctx: CallContext, repo: str, *args: str, table: dict[int, ErrorRule] | None = None,
                  commits: bool = False, example: str | None = None) -> str:
        """Run git; ``commits`` only for the one command that may change the work tree (a
        timeout in a read before it is then ``not_started``, not ``unknown``); ``example``:
        what it prints when it works, for rungctl check's and eval's stand-ins."""
        path = self.settings.repos[repo]
        program = Program(
            argv=(self.command, "-C", str(path), "-c", "credential.helper=", "-c", "core.pager=cat", *args),
            askpass=self.askpass,
            stdin="eof",  # git never needs stdin here; EOF makes any stray read fail at once
            commits=commits,
            example_output=example,
        )
        done = await run(ctx, program)
        if done.exit_status == 128 and "not a git repository" in done.stderr:
            check_exit(done, {128: NOT_A_REPO})
        check_exit(done, table or {})
        return done.stdout

    async def head(self, ctx: CallContext, repo: str) -> str:
        out = (await self.run(ctx, repo, "rev-parse", "--verify", "HEAD", example=EXAMPLE_COMMIT)).strip()
        if not re.fullmatch(r"[0-9a-f]{40,64}", out):
            raise SurfaceChanged("git rev-parse printed something that is not a commit id",
                                 hint=f"saw {out[:80]!r}", outcome="done")
        return out


def parse_status(text: str) -> dict[str, Any]:
    """Parse ``git status --porcelain=v2 --branch`` into fields."""
    fields: dict[str, Any] = {"branch": None, "head": None, "upstream": None, "ahead": 0, "behind": 0,
                              "changed_files": 0, "untracked_files": 0}
    for line in text.splitlines():
        if line.startswith("# branch.oid "):
            fields["head"] = line.split()[2]
        elif line.startswith("# branch.head "):
            fields["branch"] = line.split(maxsplit=2)[2]
        elif line.startswith("# branch.upstream "):
            fields["upstream"] = line.split(maxsplit=2)[2]
        elif line.startswith("# branch.ab "):
            ahead, behind = line.split()[2:4]
            fields["ahead"], fields["behind"] = int(ahead), -int(behind)
        elif line[:2] in ("1 ", "2 ", "u "):
            fields["changed_files"] += 1
        elif line.startswith("? "):
            fields["untracked_files"] += 1
        elif line and not line.startswith("#"):
            raise SurfaceChanged("git status printed a line of a kind this plugin does not know",
                                 hint=f"saw {line[:80]!r}; the plugin needs updating for this git", outcome="done")
    if fields["head"] is None:
        raise SurfaceChanged("git status did not report the current commit", hint=f"saw {text[:120]!r}",
                             outcome="done")
    fields["clean"] = fields["changed_files"] == 0 and fields["untracked_files"] == 0
    return fields


def _tools(settings: Settings, command: str) -> list[Tool]:
    git = Git(settings, command)
    names = sorted(settings.repos)
    repo_type = Annotated[Literal[tuple(names)], Field(  # type: ignore[valid-type]
        description=f"The repository, by its configured name: one of {', '.join(names)}.", examples=[names[0]])]

    class RepoInputs(ToolInputs):
        repo: repo_type

    class LogInputs(ToolInputs):
        repo: repo_type
        count: Annotated[int, Field(ge=1, le=50, description="How many commits, newest first.", examples=[10])] = 10

    async def status(ctx: CallContext, inputs: RepoInputs) -> Result:
        out = await git.run(ctx, inputs.repo, "status", "--porcelain=v2", "--branch")
        return Result(fields={"repo": inputs.repo, **parse_status(out)}, verified_by="git status --porcelain=v2")

    async def log(ctx: CallContext, inputs: LogInputs) -> Result:
        out = await git.run(ctx, inputs.repo, "log", f"-n{inputs.count}", "--format=%H%x09%an%x09%cI%x09%s")
        commits = []
        for line in out.splitlines():
            parts = line.split("\t", 3)
            if len(parts) != 4:
                raise SurfaceChanged("git log printed a line without the requested fields",
                                     hint=f"saw {line[:80]!r}", outcome="done")
            commits.append(dict(zip(("commit", "author", "date", "subject"), parts)))
        return Result(fields={"repo": inputs.repo, "commits": commits}, verified_by="git log --format")

    async def pull(ctx: CallContext, inputs: RepoInputs) -> Result:
        before = await git.head(ctx, inputs.repo)
        await git.run(ctx, inputs.repo, "fetch", "--quiet")
        upstream = await git.run(ctx, inputs.repo, "rev-parse", "--verify", "--quiet", "@{upstream}",
                                 table={1: NO_UPSTREAM, 128: NO_UPSTREAM}, example=EXAMPLE_COMMIT)
        ctx.mark_committed()  # the merge below is the moment the work tree may change
        await git.run(ctx, inputs.repo, "merge", "--ff-only", "--quiet", "@{upstream}", table={128: DIVERGED},
                      commits=True)
        after = await git.head(ctx, inputs.repo)
        fields = {"repo": inputs.repo, "commit_before": before, "commit_after": after,
                  "upstream": upstream.strip()}
        if after != upstream.strip():
            raise UnexpectedState("after the pull HEAD is not the upstream commit", outcome="unknown",
                                  hint="read git_repo_status_show before doing anything else", fields=fields)
        return Result(fields=fields, effect="changed" if after != before else "no_change",
                      verified_by="git rev-parse HEAD after the merge")

    errors = (ErrorRule.core("AUTH_REQUIRED"), ErrorRule.core("SURFACE_CHANGED"), ErrorRule.core("TIMEOUT"),
              NOT_A_REPO)
    credentials = (settings.askpass_credential,) if settings.askpass_credential else ()
    session = Session("the operator, in rungd's credential store (askpass answers git's question)"
                      if credentials else "nobody: the daemon's own user reads the repository", credentials)
    ruled_out = (RuledOut(1, "present", "no API moves or reads a local work tree; git's command line is its door"),)
    # Porcelain output and git's questions are what a new git version changes first.
    read_heading = Heading(2, ruled_out, (StepDown("SURFACE_CHANGED", count=3, to="stop: a person checks the "
                                                   "git version; there is no lower rung worth taking"),),
                           climb="a forge API that reports the deployed commit", session=session)
    pull_heading = Heading(
        2, ruled_out,
        (StepDown(("SURFACE_CHANGED", "PROMPT_UNEXPECTED"), count=2, within_s=86400,
                  to="stop: a person pulls by hand and checks the git version"),
         StepDown("UNEXPECTED_STATE", to="stop: something else moves the work tree")),
        climb="a deploy API that fast-forwards the checkout", attempts=1, session=session)
    return [
        Tool(
            name="git_repo_status_show",
            description=Description(
                does="Reads the state of one allow-listed git repository: branch, commit, upstream, how far "
                     "ahead or behind, and whether the work tree is clean. Changes nothing; does not fetch.",
                use_when="you need to know which commit is deployed or whether local changes exist.",
                do_not_use_when="you want newer commits from the remote; use git_repo_pull.",
                returns="repo, branch, head, upstream, ahead, behind, changed_files, untracked_files, clean.",
                on_error="NOT_A_REPOSITORY (stop: configuration), SURFACE_CHANGED (stop), TIMEOUT (retry once).",
                if_unknown="if you do not know which repository is meant, ask the user; do not guess.",
            ),
            inputs=RepoInputs, outputs={"head": "current commit id", "clean": "no changed or untracked files",
                                        "behind": "commits upstream has that HEAD lacks (as of the last fetch)"},
            handler=status, errors=errors, timing=Timing(deadline_s=30), cap_bytes=1024, log_fields=("repo",),
            heading=read_heading, credentials=credentials,
        ),
        Tool(
            name="git_repo_log_show",
            description=Description(
                does="Reads the newest commits of one allow-listed repository. Changes nothing.",
                use_when="you need to see what changed recently, or find a commit by its subject.",
                do_not_use_when="you need the working tree state; use git_repo_status_show.",
                returns="repo and commits (commit, author, date, subject), newest first, at most count.",
                on_error="NOT_A_REPOSITORY (stop), SURFACE_CHANGED (stop), TIMEOUT (retry once).",
                if_unknown="if you do not know which repository is meant, ask the user; do not guess.",
            ),
            inputs=LogInputs, outputs={"commits": "newest first"}, handler=log, errors=errors,
            timing=Timing(deadline_s=30), cap_bytes=4096, log_fields=("repo", "count"),
            heading=read_heading, credentials=credentials,
        ),
        Tool(
            name="git_repo_pull",
            description=Description(
                does="Fast-forwards one allow-listed repository to its upstream branch (git fetch, then merge "
                     "--ff-only). A write: it moves the work tree; it can be undone by a person resetting to "
                     "commit_before; a repeat with the same request_id changes nothing more. Never merges "
                     "diverged history.",
                use_when="the user asks to update or deploy the latest commits of a repository.",
                do_not_use_when="you only want to know whether updates exist; use git_repo_status_show.",
                returns="repo, commit_before, commit_after, upstream; effect changed or no_change from the commits.",
                on_error="AUTH_REQUIRED (ask the operator for credentials), NOT_FAST_FORWARD (stop: a person "
                         "merges), NO_UPSTREAM and NOT_A_REPOSITORY (stop: configuration), TIMEOUT with outcome "
                         "unknown (run git_repo_status_show before any retry).",
                if_unknown="if you do not know which repository is meant, ask the user; do not guess.",
            ),
            inputs=RepoInputs, outputs={"commit_before": "HEAD before", "commit_after": "HEAD after, read back"},
            handler=pull, side_effect="reversible",
            errors=(*errors, DIVERGED, NO_UPSTREAM, ErrorRule.core("UNEXPECTED_STATE")),
            timing=Timing(deadline_s=120, commit_point="callback",
                          settle=SettleSpec("git_repo_status_show", {"repo": "$repo"})),
            cap_bytes=1024, concurrency=1, log_fields=("repo",), heading=pull_heading, credentials=credentials,
        ),
    ]


@hookimpl
def rungd_register_tools(register: Callable[[Tool], None], settings: PluginSettings) -> None:
    parsed = settings.parse(Settings, 'repos = { app = "/srv/app" }')
    if parsed is None:
        return  # not configured: no repositories, no tools
    command = shutil.which(parsed.git)
    if command is None:
        raise ConfigError(f"{settings.source}: key plugins.settings.{settings.name}.git: {parsed.git!r} is not "
                          "installed; hint: apt-get install git")
    for tool in _tools(parsed, command):
        register(tool)
