"""Real programs through tool files: the envelope (code, outcome, effect) and the real state
afterwards, checked directly, not through rungd. No call may leave a process behind
(tests/conftest.py's no_survivors checks every test)."""

from __future__ import annotations

import grp
import os
import pwd
import sqlite3
import stat
from pathlib import Path

import pytest

from tests.real.conftest import new_name, remove_account, run

# A crypt(3) SHA-512 hash (of "rungd-test"), as provisioning computes elsewhere.
HASH = "$6$rungdsalt$" + "9vY2d0cRz0tqf1y2HcQ0bVQ9vJq3m8b6s8V0mQm2zV8Qp9k1n3B4c5D6e7F8g9H0i1J2k3L4m5N6o7P8q9R0s1"


async def test_account_tools_create_change_and_read_back_real_accounts(rungd_daemon) -> None:
    user, group = new_name("rgacc"), new_name("rggrp")
    try:
        added = await rungd_daemon.call("acct_user_add", {"user": user}, request_id=f"{user}-add")
        assert (added.status, added.outcome, added.effect) == ("ok", "done", "changed"), added.error
        assert added.verified_by and "acct_user_probe" in added.verified_by
        assert pwd.getpwnam(user).pw_shell == "/usr/sbin/nologin"

        shell = await rungd_daemon.call("acct_user_shell_set", {"user": user, "shell": "/bin/bash"},
                                        request_id=f"{user}-sh")
        assert (shell.status, shell.effect) == ("ok", "changed"), shell.error
        assert pwd.getpwnam(user).pw_shell == "/bin/bash"
        again = await rungd_daemon.call("acct_user_shell_set", {"user": user, "shell": "/bin/bash"},
                                        request_id=f"{user}-sh2")
        assert (again.status, again.effect) == ("ok", "no_change"), again.error

        named = await rungd_daemon.call("acct_user_comment_set", {"user": user, "full_name": "Ada Lovelace"},
                                        request_id=f"{user}-fn")
        assert (named.status, named.effect) == ("ok", "changed"), named.error
        assert pwd.getpwnam(user).pw_gecos.startswith("Ada Lovelace")

        made = await rungd_daemon.call("acct_group_add", {"group": group}, request_id=f"{group}-add")
        assert (made.status, made.effect) == ("ok", "changed"), made.error
        assert grp.getgrnam(group).gr_name == group

        # chpasswd reads user:hash lines to end-of-file: data, then the declared end.
        before = await rungd_daemon.call("acct_password_status", {"user": user})
        assert before.fields["status"] == "L"
        hashed = await rungd_daemon.call("acct_password_set", {"user": user, "entries": f"{user}:{HASH}\n"},
                                         request_id=f"{user}-pw")
        assert (hashed.status, hashed.effect) == ("ok", "changed"), hashed.error
        assert run("getent", "shadow", user).stdout.split(":")[1] == HASH

        missing = await rungd_daemon.call("acct_user_show", {"user": new_name("nobody")})
        assert (missing.status, missing.error.code, missing.outcome) == ("error", "NOT_FOUND", "done")
    finally:
        remove_account(user)
        run("groupdel", group, check=False)


async def test_multiline_input_reaches_only_the_declared_stdin_input(rungd_daemon) -> None:
    user = new_name("rgacc")
    forged = await rungd_daemon.call("acct_user_show", {"user": f"{user}\nroot"})
    assert (forged.status, forged.error.code) == ("error", "BAD_INPUT")


async def test_ssh_keygen_gets_its_passphrase_twice_through_askpass_and_writes_it_encrypted(
        rungd_daemon, real_root: Path) -> None:
    made = await rungd_daemon.call("keys_ssh_create", {"name": "deploy", "comment": "deploy@web1"},
                                   request_id="key-1")
    assert (made.status, made.outcome, made.effect) == ("ok", "done", "changed"), made.error
    key = real_root / "keys" / "deploy"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert run("ssh-keygen", "-y", "-P", "", "-f", str(key), check=False).returncode != 0  # encrypted
    opened = run("ssh-keygen", "-y", "-P", "correct horse battery", "-f", str(key), check=False)
    assert opened.returncode == 0 and opened.stdout.startswith("ssh-ed25519 ")
    shown = await rungd_daemon.call("keys_ssh_fingerprint", {"name": "deploy"})
    assert (shown.status, shown.fields["type"], shown.fields["comment"]) == ("ok", "ED25519", "deploy@web1")
    assert "correct horse battery" not in repr(made) + repr(shown)


async def test_openssl_writes_an_encrypted_pem_read_back_through_its_public_half(
        rungd_daemon, real_root: Path) -> None:
    made = await rungd_daemon.call("keys_pem_create", {"name": "tls"}, request_id="pem-1")
    assert (made.status, made.effect) == ("ok", "changed"), made.error
    pem = (real_root / "keys" / "tls.pem").read_text()
    assert pem.startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert run("openssl", "pkey", "-in", str(real_root / "keys" / "tls.pem"), "-passin", "pass:wrong",
               check=False).returncode != 0
    assert "staple gun 42" not in repr(made)


async def test_sqlite3_adds_with_the_tool_files_sql_and_changed_means_the_count_grew_by_one(
        rungd_daemon, real_root: Path) -> None:
    ran = await rungd_daemon.call("data_notes_add", {"body": "call the vendor"}, request_id="sql-1")
    assert (ran.status, ran.outcome, ran.effect) == ("ok", "done", "changed"), ran.error
    assert (ran.fields["before"]["count"], ran.fields["after"]["count"]) == (0, 1)
    with sqlite3.connect(real_root / "notes.db") as db:
        assert db.execute("SELECT body FROM notes").fetchall() == [("call the vendor",)]
    # A quote would close the tool file's string: the pattern refuses it before anything runs.
    quoted = await rungd_daemon.call("data_notes_add", {"body": "x'); DROP TABLE notes; --"}, request_id="sql-2")
    assert (quoted.status, quoted.error.code, quoted.outcome) == ("error", "BAD_INPUT", "not_started")


async def test_bc_reads_expressions_to_eof_and_answers(rungd_daemon) -> None:
    done = await rungd_daemon.call("data_calc_eval", {"expression": "x = 2^64\nx + 1"})
    assert (done.status, done.fields["result"]) == ("ok", "18446744073709551617"), done.error


async def test_crontab_installs_the_operators_table_read_back_with_crontab_l(
        rungd_daemon, service_user: str, real_root: Path) -> None:
    (real_root / "cron").mkdir(exist_ok=True)
    (real_root / "cron" / "nightly.tab").write_text("# rungd test\n17 3 * * * /usr/bin/true rungd-marker\n")
    put = await rungd_daemon.call("data_cron_install", {"user": service_user}, request_id="cron-1")
    assert (put.status, put.effect) == ("ok", "changed"), put.error
    assert put.fields["before"]["lines"] == []
    assert "rungd-marker" in run("crontab", "-u", service_user, "-l").stdout


async def test_mv_ln_rm_and_find_exec_are_verified_through_stat_and_ls(rungd_daemon, real_root: Path) -> None:
    files = real_root / "files"
    (files / "report.txt").write_text("r")
    for scratch in ("a.tmp", "b.tmp"):
        (files / scratch).write_text("t")
    moved = await rungd_daemon.call("files_entry_rename", {"name": "report.txt", "new_name": "final.txt"},
                                    request_id="mv-1")
    assert (moved.status, moved.effect) == ("ok", "changed"), moved.error
    assert (files / "final.txt").exists() and not (files / "report.txt").exists()

    linked = await rungd_daemon.call("files_link_create", {"name": "latest.txt", "target": "final.txt"},
                                     request_id="ln-1")
    assert (linked.status, linked.effect) == ("ok", "changed"), linked.error
    assert os.readlink(files / "latest.txt") == "final.txt"

    purged = await rungd_daemon.call("files_scratch_purge", {}, request_id="find-1")
    assert (purged.status, purged.effect) == ("ok", "changed"), purged.error
    assert not list(files.glob("*.tmp"))

    removed = await rungd_daemon.call("files_entry_remove", {"name": "latest.txt"}, request_id="rm-1")
    assert (removed.status, removed.effect) == ("ok", "changed"), removed.error
    assert not os.path.lexists(files / "latest.txt") and (files / "final.txt").exists()
    gone = await rungd_daemon.call("files_entry_remove", {"name": "latest.txt"}, request_id="rm-2")
    assert (gone.status, gone.effect) == ("ok", "no_change"), gone.error

    taken = await rungd_daemon.call("files_entry_rename", {"name": "final.txt", "new_name": "final.txt"},
                                    request_id="mv-2")
    assert taken.status == "error" or taken.effect == "no_change"


async def test_archivers_write_archives_and_read_them_back(rungd_daemon, real_root: Path) -> None:
    tarred = await rungd_daemon.call("arch_tar_create", {"name": "backup", "member": "./hello.txt"},
                                     request_id="tar-1")
    assert (tarred.status, tarred.effect) == ("ok", "changed"), tarred.error
    assert "./hello.txt" in run("tar", "-tf", str(real_root / "out" / "backup.tar")).stdout

    zipped = await rungd_daemon.call("arch_zip_create", {"name": "ship", "file": "hello.txt"}, request_id="zip-1")
    assert (zipped.status, zipped.effect) == ("ok", "changed"), zipped.error
    out = await rungd_daemon.call("arch_zip_extract", {"name": "ship", "file": "hello.txt"}, request_id="unzip-1")
    assert (out.status, out.effect) == ("ok", "changed"), out.error
    assert (real_root / "unpacked" / "hello.txt").read_text() == (real_root / "src" / "hello.txt").read_text()
    nozip = await rungd_daemon.call("arch_zip_extract", {"name": "absent", "file": "hello.txt"},
                                    request_id="unzip-2")
    assert (nozip.status, nozip.error.code) == ("error", "NOT_FOUND")

    packed = await rungd_daemon.call("arch_gzip_compress", {"file": "notes.md"}, request_id="gz-1")
    assert (packed.status, packed.effect) == ("ok", "changed"), packed.error
    assert any(line.endswith("OK") for line in packed.fields["after"]["lines"])  # parsed from stderr
    assert run("gzip", "-t", str(real_root / "src" / "notes.md.gz")).returncode == 0
    # A second run finds notes.md.gz and asks whether to overwrite it, on its terminal or
    # stdin: never answered, never ok.
    twice = await rungd_daemon.call("arch_gzip_compress", {"file": "notes.md"}, request_id="gz-2")
    assert twice.status == "error" and twice.error.code in ("PROMPT_UNEXPECTED", "FAILED"), twice


async def test_git_commit_is_changed_only_when_the_count_grew_by_one_and_log_never_pages(
        rungd_daemon, real_root: Path) -> None:
    made = await rungd_daemon.call("sys_repo_commit", {"message": "deploy 1.2.3"}, request_id="git-1")
    assert (made.status, made.effect) == ("ok", "changed"), made.error
    assert (made.fields["before"]["commits"], made.fields["after"]["commits"]) == (1, 2)
    log = await rungd_daemon.call("sys_repo_log", {})
    assert (log.status, log.fields["lines"][:2]) == ("ok", ["deploy 1.2.3", "start"]), log.error
    assert run("git", "-C", str(real_root / "repo"), "log", "-1", "--format=%s").stdout.strip() == "deploy 1.2.3"


async def test_package_queries_read_dpkg_and_apt(rungd_daemon) -> None:
    shown = await rungd_daemon.call("sys_package_status", {"package": "coreutils"})
    assert (shown.status, shown.fields["status"]) == ("ok", "installed"), shown.error
    assert shown.fields["version"] == run("dpkg-query", "-W", "-f=${Version}", "coreutils").stdout
    missing = await rungd_daemon.call("sys_package_status", {"package": "no-such-package-rungd"})
    assert (missing.status, missing.error.code) == ("error", "NOT_FOUND")
    policy = await rungd_daemon.call("sys_package_policy", {"package": "coreutils"})
    assert (policy.status, policy.fields["installed"]) == ("ok", shown.fields["version"]), policy.error


async def test_man_with_a_pager_option_prints_the_page_and_ends(rungd_daemon) -> None:
    if not list(Path("/usr/share/man/man1").glob("tar.1*")):
        pytest.skip("this image leaves manual pages out (dpkg path-exclude)")
    page = await rungd_daemon.call("sys_manual_name", {"page": "tar"})
    assert page.status == "ok", page.error
    assert any("tar" in line for line in page.fields["lines"])
    none = await rungd_daemon.call("sys_manual_name", {"page": "no-such-page-rungd"})
    assert (none.status, none.error.code) == ("error", "NOT_FOUND")


async def test_sudo_with_a_declared_target_and_user_key_run_as_the_service_account(
        rungd_daemon, service_user: str, real_root: Path) -> None:
    who = await rungd_daemon.call("sys_account_whoami", {})
    assert (who.status, who.fields["user"]) == ("ok", service_user), who.error
    env = await rungd_daemon.call("sys_service_env", {})
    assert env.status == "ok", env.error
    assert env.fields["lines"] == [service_user, f"/nonexistent-{service_user}", service_user]
    touched = await rungd_daemon.call("sys_service_touch", {"name": "ready"}, request_id="touch-1")
    assert (touched.status, touched.effect) == ("ok", "changed"), touched.error
    assert (real_root / "shared" / "ready").stat().st_uid == pwd.getpwnam(service_user).pw_uid


async def test_sudo_asking_the_service_accounts_password_is_auth_required_never_ok(rungd_daemon) -> None:
    asked = await rungd_daemon.call("sys_sudo_as_service", {})
    assert (asked.status, asked.error.code, asked.outcome) == ("error", "AUTH_REQUIRED", "done"), asked
    assert asked.next_action == "request_authority"
