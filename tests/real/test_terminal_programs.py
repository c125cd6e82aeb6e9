"""Real Debian programs that ask for a secret on their terminal (/dev/tty) or on stdin, wrapped
by tests/real/tools/terminal.toml (written from plugins/README.md and `rungctl probe` alone).

For each program: a tool with nothing declared ends with the right code (AUTH_REQUIRED for a
secret, PROMPT_UNEXPECTED for a question), the program's question quoted whole, where it was
asked and with which echo, at once (never at the deadline); the tool with the question
declared answers it with a credential from rungd's store (RUNGD_CRED_<NAME> in the daemon's
environment: the test daemon runs in this process) and the effect is checked directly, not
through rungd: the key opens with that passphrase, the zip with that password, the server got
that password. The secret appears nowhere: not in an envelope, not in the state folder
(ledger, evidence). Needs root (tests/real/conftest.py): accounts, other users.

Debian packages: openssl, zip, unzip, postgresql-client, mariadb-client, ldap-utils,
apache2-utils, ccrypt, p7zip-full, cryptsetup-bin, gpg, gpg-agent, passwd, login.
"""

from __future__ import annotations

import hashlib
import logging
import pwd
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.real.conftest import run

# A call that asks must end at once: its question is seen by the kernel's evidence, not at the
# tools' deadlines (15 to 30 s). Stdin questions are seen within about a second.
QUICK_MS = 5000


def needs(*programs: str) -> pytest.MarkDecorator:
    missing = [p for p in programs if shutil.which(p) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (see the module docstring)")


def leaks(daemon: Any, secret: str, *envelopes: Any) -> list[str]:
    """Where the secret shows: an envelope, or a file of the daemon's state folder."""
    found = [f"envelope {e.tool}" for e in envelopes if secret in repr(e)]
    for path in Path(daemon.config.state_dir).rglob("*"):
        try:
            if path.is_file() and secret.encode() in path.read_bytes():
                found.append(str(path))
        except OSError:
            continue
    return found


def asked(env: Any, code: str, question: str, asked_on: str, echo: str | None) -> None:
    """The call ended ``code`` at once, quoting ``question`` whole, asked there, with that echo."""
    assert env.status == "error" and env.error is not None, env
    assert env.error.code == code, env
    assert env.fields.get("question") == question, env.fields
    assert env.fields.get("asked_on") == asked_on, env.fields
    if echo is not None:
        assert env.fields.get("echo") == echo, env.fields
    assert env.elapsed_ms < QUICK_MS, env.elapsed_ms


SECRETS: list[str] = []


@pytest.fixture(autouse=True)
def no_secret_in_the_log(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No credential a test gave the daemon shows in what it logged."""
    caplog.set_level(logging.DEBUG, logger="rungd")
    SECRETS.clear()
    yield
    logged = caplog.text + "".join(repr(r.__dict__) for r in caplog.records)
    assert not [s for s in SECRETS if s in logged], "a credential reached the log"


def set_secret(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> str:
    """Put a credential in rungd's store the way an operator may: RUNGD_CRED_<NAME> in the
    daemon's environment (this process's: the test daemon runs in it)."""
    monkeypatch.setenv("RUNGD_CRED_" + name.upper(), value)
    SECRETS.append(value)
    return value


# ---------------------------------------------------------------------------------- openssl

@needs("openssl")
async def test_openssl_genrsa_asks_its_passphrase_on_the_terminal_and_writes_a_key_that_opens_with_it(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    bare = await rungd_daemon.call("term_rsakey_bare_create", {"name": "bare"}, request_id="rsa-0")
    asked(bare, "AUTH_REQUIRED", "Enter PEM pass phrase:", "terminal", "off")
    assert "echo off" in bare.error.message
    # genrsa opens its output before it asks: an empty key file was left, which the read-back
    # shows moved but not to a key, so the outcome is unknown (never not_started, never done).
    assert (real_root / "keys" / "bare.pem").stat().st_size == 0
    assert (bare.outcome, bare.effect, bare.next_action) == ("unknown", "none", "reconcile"), bare

    secret = set_secret(monkeypatch, "term_key_pass", "Genrsa-pass-7731")
    made = await rungd_daemon.call("term_rsakey_create", {"name": "tls"}, request_id="rsa-1")
    assert (made.status, made.outcome, made.effect) == ("ok", "done", "changed"), made
    key = real_root / "keys" / "tls.pem"
    assert key.read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert run("openssl", "pkey", "-in", str(key), "-passin", f"pass:{secret}", "-noout", check=False).returncode == 0
    assert run("openssl", "pkey", "-in", str(key), "-passin", "pass:wrong", "-noout", check=False).returncode != 0
    assert not leaks(rungd_daemon, secret, bare, made)


@needs("openssl")
async def test_openssl_pkcs12_export_asks_its_password_twice_and_the_bundle_opens_with_it(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    keys = real_root / "keys"
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(keys / "web.key"),
        "-out", str(keys / "web.crt"), "-subj", "/CN=web.example", "-days", "2")
    bare = await rungd_daemon.call("term_bundle_bare_create", {"name": "web"}, request_id="p12-0")
    asked(bare, "AUTH_REQUIRED", "Enter Export Password:", "terminal", "off")
    assert (bare.outcome, bare.effect) == ("not_started", "none") and not (keys / "web.p12").exists()

    secret = set_secret(monkeypatch, "term_key_pass", "Bundle-pass-2208")
    made = await rungd_daemon.call("term_bundle_create", {"name": "web"}, request_id="p12-1")
    assert (made.status, made.effect) == ("ok", "changed"), made
    p12 = str(keys / "web.p12")
    shown = run("openssl", "pkcs12", "-in", p12, "-passin", f"pass:{secret}", "-nokeys", check=False)
    assert shown.returncode == 0 and "CN = web.example" in shown.stdout
    assert run("openssl", "pkcs12", "-in", p12, "-passin", "pass:wrong", "-nokeys", check=False).returncode != 0
    assert not leaks(rungd_daemon, secret, bare, made)


@needs("openssl")
async def test_openssl_enc_asks_on_the_terminal_and_the_file_decrypts_with_the_declared_password(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    bare = await rungd_daemon.call("term_sealed_bare_create", {"file": "notes.md"}, request_id="enc-0")
    asked(bare, "AUTH_REQUIRED", "enter AES-256-CBC encryption password:", "terminal", "off")
    assert (bare.outcome, bare.effect) == ("not_started", "none") and not (real_root / "out" / "notes.md.enc").exists()

    secret = set_secret(monkeypatch, "term_key_pass", "Enc-pass-5150")
    made = await rungd_daemon.call("term_sealed_create", {"file": "hello.txt"}, request_id="enc-1")
    assert (made.status, made.effect) == ("ok", "changed"), made
    opened = run("openssl", "enc", "-d", "-aes-256-cbc", "-pbkdf2", "-in", str(real_root / "out" / "hello.txt.enc"),
                 "-pass", f"pass:{secret}")
    assert opened.stdout == (real_root / "src" / "hello.txt").read_text()
    assert not leaks(rungd_daemon, secret, bare, made)


@needs("openssl")
async def test_openssl_passwd_read_tool_answers_its_password_question_and_returns_the_hash(
        rungd_daemon, monkeypatch) -> None:
    bare = await rungd_daemon.call("term_hash_bare_compute", {"salt": "saltsalt"})
    asked(bare, "AUTH_REQUIRED", "Password:", "terminal", "off")

    secret = set_secret(monkeypatch, "term_key_pass", "Hash-me-9090")
    done = await rungd_daemon.call("term_hash_compute", {"salt": "saltsalt"})
    assert done.status == "ok", done
    expected = subprocess.run(["openssl", "passwd", "-6", "-salt", "saltsalt", "-stdin"], input=secret + "\n",
                              capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    assert done.fields["hash"] == expected
    assert not leaks(rungd_daemon, secret, bare, done)


# ---------------------------------------------------------------------------------- zip, unzip, zipcloak

@needs("zip", "unzip")
async def test_zip_e_asks_on_the_terminal_and_the_zip_opens_only_with_the_declared_password(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    bare = await rungd_daemon.call("term_zip_encrypt_bare_create", {"name": "bare", "file": "hello.txt"},
                                   request_id="zip-0")
    asked(bare, "AUTH_REQUIRED", "Enter password:", "terminal", "off")
    assert (bare.outcome, bare.effect) == ("not_started", "none") and not (real_root / "out" / "bare.zip").exists()

    secret = set_secret(monkeypatch, "term_zip_pass", "Zip-pass-4242")
    made = await rungd_daemon.call("term_zip_encrypt_create", {"name": "ship", "file": "hello.txt"},
                                   request_id="zip-1")
    assert (made.status, made.effect) == ("ok", "changed"), made
    archive = str(real_root / "out" / "ship.zip")
    assert "encrypted" in run("unzip", "-Z", "-v", archive).stdout
    plain = (real_root / "src" / "hello.txt").read_text()
    assert run("unzip", "-p", "-P", secret, archive, "hello.txt").stdout == plain
    # Not the text (ZipCrypto lets about one wrong password in 256 past its check, into garbage).
    assert run("unzip", "-p", "-P", "wrong", archive, "hello.txt", check=False).stdout != plain
    assert not leaks(rungd_daemon, secret, bare, made)


@needs("zip", "unzip")
async def test_unzip_of_an_encrypted_member_quotes_its_question_with_the_archive_and_extracts_with_the_password(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    secret = set_secret(monkeypatch, "term_zip_pass", "Unzip-pass-1717")
    archive = real_root / "out" / "ship.zip"
    # ZipCrypto checks a password by one byte of a random header: about one archive in 256
    # takes a wrong password for the right one, and unzip then fails on the CRC without
    # asking again. Make one the wrong password below is refused by, as most are.
    for _ in range(20):
        archive.unlink(missing_ok=True)
        run("zip", "-q", "-j", "-P", secret, str(archive), str(real_root / "src" / "hello.txt"))
        if "incorrect password" in run("unzip", "-P", "Not-the-zip-pass", "-t", str(archive), check=False).stdout:
            break
    bare = await rungd_daemon.call("term_zip_unpack_bare_restore", {"name": "ship", "file": "hello.txt"},
                                   request_id="unzip-0")
    asked(bare, "AUTH_REQUIRED", f"[{archive}] hello.txt password:", "terminal", "off")
    assert not (real_root / "unpacked" / "hello.txt").exists()

    done = await rungd_daemon.call("term_zip_unpack_restore", {"name": "ship", "file": "hello.txt"},
                                   request_id="unzip-1")
    assert (done.status, done.effect) == ("ok", "changed"), done
    assert (real_root / "unpacked" / "hello.txt").read_text() == (real_root / "src" / "hello.txt").read_text()

    # A wrong password: unzip asks again in other words; rungd answers once, never again.
    (real_root / "unpacked" / "hello.txt").unlink()
    wrong = set_secret(monkeypatch, "term_zip_pass", "Not-the-zip-pass")
    refused = await rungd_daemon.call("term_zip_unpack_restore", {"name": "ship", "file": "hello.txt"},
                                      request_id="unzip-2")
    asked(refused, "AUTH_REQUIRED", "password incorrect--reenter:", "terminal", "off")
    assert (refused.outcome, refused.effect) == ("not_started", "none")
    assert not (real_root / "unpacked" / "hello.txt").exists()
    assert not leaks(rungd_daemon, secret, bare, done) and not leaks(rungd_daemon, wrong, refused)


@needs("zip", "zipcloak", "unzip")
async def test_zipcloak_asks_on_the_terminal_and_encrypts_the_zip_with_the_declared_password(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    archive = real_root / "out" / "plain.zip"
    run("zip", "-q", "-j", str(archive), str(real_root / "src" / "hello.txt"))
    bare = await rungd_daemon.call("term_zip_cloak_bare_lock", {"name": "plain"}, request_id="cloak-0")
    asked(bare, "AUTH_REQUIRED", "Enter password:", "terminal", "off")
    assert (bare.outcome, bare.effect) == ("not_started", "none")
    assert "not encrypted" in run("unzip", "-Z", "-v", str(archive)).stdout

    secret = set_secret(monkeypatch, "term_zip_pass", "Cloak-pass-3131")
    done = await rungd_daemon.call("term_zip_cloak_lock", {"name": "plain"}, request_id="cloak-1")
    assert (done.status, done.effect) == ("ok", "changed"), done
    assert done.fields["after"]["security"] == "encrypted"
    assert run("unzip", "-p", "-P", secret, str(archive), "hello.txt").stdout.startswith("hello from rungd")
    assert not run("unzip", "-p", "-P", "wrong", str(archive), "hello.txt",
                   check=False).stdout.startswith("hello from rungd")  # garbage at most, never the text
    assert not leaks(rungd_daemon, secret, bare, done)


# ---------------------------------------------------------------------------------- htpasswd, ccrypt, 7z, gpg

@needs("htpasswd")
async def test_htpasswd_asks_on_the_terminal_and_sets_a_password_that_verifies(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    file = real_root / "files" / "site.htpasswd"
    run("htpasswd", "-b", "-B", "-c", str(file), "bob", "bob-pass-0")
    bare = await rungd_daemon.call("term_htuser_bare_set", {"name": "site", "user": "alice"}, request_id="ht-0")
    asked(bare, "AUTH_REQUIRED", "New password:", "terminal", "off")
    assert (bare.outcome, bare.effect) == ("not_started", "none") and "alice" not in file.read_text()

    secret = set_secret(monkeypatch, "term_web_pass", "Web-pass-6060")
    done = await rungd_daemon.call("term_htuser_set", {"name": "site", "user": "alice"}, request_id="ht-1")
    assert (done.status, done.effect) == ("ok", "changed"), done
    assert run("htpasswd", "-v", "-b", str(file), "alice", secret, check=False).returncode == 0
    assert run("htpasswd", "-v", "-b", str(file), "alice", "wrong", check=False).returncode != 0
    assert not leaks(rungd_daemon, secret, bare, done)


@needs("ccrypt")
async def test_ccrypt_asks_its_key_on_the_terminal_and_the_file_decrypts_with_it(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    out = real_root / "out"
    (out / "report.txt").write_text("quarterly numbers\n")
    bare = await rungd_daemon.call("term_ccrypt_bare_create", {"file": "report.txt"}, request_id="cc-0")
    asked(bare, "AUTH_REQUIRED", "Enter encryption key:", "terminal", "off")
    assert (bare.outcome, bare.effect) == ("not_started", "none") and (out / "report.txt").exists()

    secret = set_secret(monkeypatch, "term_ccrypt_key", "Ccrypt-key-8080")
    done = await rungd_daemon.call("term_ccrypt_create", {"file": "report.txt"}, request_id="cc-1")
    assert (done.status, done.effect) == ("ok", "changed"), done
    assert not (out / "report.txt").exists()
    assert run("ccrypt", "-c", "-K", secret, str(out / "report.txt.cpt")).stdout == "quarterly numbers\n"
    assert run("ccrypt", "-c", "-K", "wrong", str(out / "report.txt.cpt"), check=False).returncode != 0

    # Again, with report.txt.cpt there: the key is typed (declared), then ccrypt asks on its
    # terminal, echo on, whether to overwrite: a question nobody declared, quoted alone.
    (out / "report.txt").write_text("newer numbers\n")
    sealed = (out / "report.txt.cpt").read_bytes()
    again = await rungd_daemon.call("term_ccrypt_create", {"file": "report.txt"}, request_id="cc-2")
    asked(again, "PROMPT_UNEXPECTED", f"ccrypt: {out / 'report.txt.cpt'} already exists; overwrite (y or n)?",
          "terminal", "on")
    assert (again.outcome, again.effect) == ("not_started", "none"), again
    assert (out / "report.txt.cpt").read_bytes() == sealed and (out / "report.txt").exists()
    assert not leaks(rungd_daemon, secret, bare, done, again)


@needs("7z")
async def test_7z_asks_on_stdin_after_its_banner_and_the_archive_opens_with_the_declared_password(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    bare = await rungd_daemon.call("term_archive7z_bare_create", {"name": "bare", "file": "hello.txt"},
                                   request_id="7z-0")
    assert bare.status == "error" and bare.error.code == "AUTH_REQUIRED", bare
    assert bare.fields["asked_on"] == "stdin" and bare.elapsed_ms < QUICK_MS, bare
    question = bare.fields["question"]
    assert question.endswith("Enter password (will not be echoed):") and "Creating archive:" in question, question
    assert len(question) <= 400

    secret = set_secret(monkeypatch, "term_7z_pass", "Seven-pass-2727")
    made = await rungd_daemon.call("term_archive7z_create", {"name": "vault", "file": "hello.txt"},
                                   request_id="7z-1")
    assert (made.status, made.effect) == ("ok", "changed"), made
    archive = str(real_root / "out" / "vault.7z")
    assert run("7z", "t", f"-p{secret}", archive, check=False).returncode == 0
    assert run("7z", "t", "-pwrong", archive, check=False).returncode != 0
    assert not leaks(rungd_daemon, secret, bare, made)


@needs("gpg", "gpg-agent")
async def test_gpg_symmetric_asks_on_the_terminal_and_the_file_decrypts_with_the_declared_passphrase(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    home = real_root / "files" / "gnupg"
    home.mkdir(mode=0o700)
    try:
        bare = await rungd_daemon.call("term_gpg_seal_bare_create", {"file": "notes.md"}, request_id="gpg-0")
        asked(bare, "AUTH_REQUIRED", "Enter passphrase:", "terminal", "off")
        assert (bare.outcome, bare.effect) == ("not_started", "none")

        secret = set_secret(monkeypatch, "term_gpg_pass", "Gpg-pass-1919")
        made = await rungd_daemon.call("term_gpg_seal_create", {"file": "hello.txt"}, request_id="gpg-1")
        assert (made.status, made.effect) == ("ok", "changed"), made
        sealed = real_root / "out" / "hello.txt.gpg"

        def opens(passphrase: str) -> str:
            return run("gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase",
                       passphrase, "--decrypt", str(sealed), check=False).stdout

        assert opens(secret) == (real_root / "src" / "hello.txt").read_text()

        # The output exists now: after the passphrase, gpg asks on its terminal whether to
        # overwrite it, reading keys one at a time. Undeclared: a question, quoted alone.
        first = sealed.read_bytes()
        again = await rungd_daemon.call("term_gpg_seal_create", {"file": "hello.txt"}, request_id="gpg-2")
        asked(again, "PROMPT_UNEXPECTED", f"File '{sealed}' exists. Overwrite? (y/N)", "terminal", "keys")
        assert sealed.read_bytes() == first
        # Declared (term_gpg_seal_replace confirms "y"): rewritten with the new passphrase.
        newer = set_secret(monkeypatch, "term_gpg_pass", "Gpg-pass-2020")
        replaced = await rungd_daemon.call("term_gpg_seal_replace", {"file": "hello.txt"}, request_id="gpg-3")
        assert (replaced.status, replaced.effect) == ("ok", "changed"), replaced
        assert opens(newer) == (real_root / "src" / "hello.txt").read_text() and opens(secret) == ""
        assert not leaks(rungd_daemon, secret, bare, made, again) and not leaks(rungd_daemon, newer, replaced)
    finally:
        run("gpgconf", "--homedir", str(home), "--kill", "gpg-agent", check=False)


# ---------------------------------------------------------------------------------- cryptsetup

@needs("cryptsetup")
async def test_cryptsetup_waiting_on_stdin_without_a_word_is_stopped_and_formats_with_a_sealed_key_file(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    image = real_root / "files" / "vault.img"
    with image.open("wb") as f:
        f.truncate(32 * 1024 * 1024)
    # With no terminal on stdin, luksFormat asks nothing ("Are you sure?" only on a terminal)
    # and reads the passphrase from stdin without a prompt: a question with no words.
    bare = await rungd_daemon.call("term_luks_bare_create", {"name": "vault"}, request_id="luks-0")
    asked(bare, "PROMPT_UNEXPECTED", "", "stdin", None)
    assert (bare.outcome, bare.effect) == ("not_started", "none"), bare
    assert run("cryptsetup", "isLuks", str(image), check=False).returncode != 0

    secret = set_secret(monkeypatch, "term_luks_pass", "Luks-pass-6464")
    done = await rungd_daemon.call("term_luks_create", {"name": "vault"}, request_id="luks-1")
    assert (done.status, done.effect) == ("ok", "changed"), done
    assert run("cryptsetup", "isLuks", str(image), check=False).returncode == 0

    def opens(passphrase: str) -> bool:
        return subprocess.run(["cryptsetup", "open", "--test-passphrase", "--key-file", "-", str(image)],
                              input=passphrase.encode(), capture_output=True, timeout=60).returncode == 0

    assert opens(secret) and not opens("wrong")
    assert not leaks(rungd_daemon, secret, bare, done)


# ---------------------------------------------------------------------------------- accounts (PAM)

def verifies(password: str, hashed: str) -> bool:
    """crypt(3) of ``password`` with ``hashed`` as salt gives ``hashed`` (yescrypt included)."""
    got = subprocess.run(["perl", "-e", "print crypt($ARGV[0], $ARGV[1])", password, hashed],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return got == hashed


def shadow_hash(user: str) -> str:
    return run("getent", "shadow", user).stdout.split(":")[1]


@needs("passwd", "perl")
async def test_passwd_run_by_root_asks_on_stdin_and_sets_the_declared_password(
        rungd_daemon, service_user: str, monkeypatch) -> None:
    before = shadow_hash(service_user)
    bare = await rungd_daemon.call("term_account_password_bare_reset", {}, request_id="pw-0")
    asked(bare, "AUTH_REQUIRED", "New password:", "stdin", None)
    assert (bare.outcome, bare.effect) == ("not_started", "none") and shadow_hash(service_user) == before

    secret = set_secret(monkeypatch, "term_account_new_pass", "Reset-pass-5U7q")
    done = await rungd_daemon.call("term_account_password_reset", {}, request_id="pw-1")
    assert (done.status, done.effect) == ("ok", "changed"), done
    assert verifies(secret, shadow_hash(service_user)) and not verifies("wrong", shadow_hash(service_user))
    assert not leaks(rungd_daemon, secret, bare, done)


@needs("passwd", "chpasswd", "perl")
async def test_passwd_run_as_the_account_asks_its_current_password_then_the_new_one(
        rungd_daemon, service_user: str, monkeypatch) -> None:
    old = set_secret(monkeypatch, "term_account_pass", "Old-pass-9Kx2")
    subprocess.run(["chpasswd"], input=f"{service_user}:{old}\n", text=True, check=True, timeout=30)
    bare = await rungd_daemon.call("term_account_password_bare_rotate", {}, request_id="rot-0")
    asked(bare, "AUTH_REQUIRED", "Current password:", "stdin", None)
    assert (bare.outcome, bare.effect) == ("not_started", "none") and verifies(old, shadow_hash(service_user))

    new = set_secret(monkeypatch, "term_account_new_pass", "Rotated-pass-3Zw8")
    done = await rungd_daemon.call("term_account_password_rotate", {}, request_id="rot-1")
    assert (done.status, done.effect) == ("ok", "changed"), done
    assert verifies(new, shadow_hash(service_user)) and not verifies(old, shadow_hash(service_user))

    # A new password PAM finds too short: it says why and asks again; answered once only.
    set_secret(monkeypatch, "term_account_pass", new)
    set_secret(monkeypatch, "term_account_new_pass", "Sh0rt")
    weak = await rungd_daemon.call("term_account_password_rotate", {}, request_id="rot-2")
    asked(weak, "AUTH_REQUIRED", "You must choose a longer password.\nNew password:", "stdin", None)
    assert (weak.outcome, weak.effect) == ("not_started", "none") and verifies(new, shadow_hash(service_user))
    assert not leaks(rungd_daemon, old, bare, done, weak) and not leaks(rungd_daemon, new, bare, done, weak)


@needs("chfn", "chpasswd")
async def test_chfn_run_as_the_account_asks_its_password_and_sets_the_room(
        rungd_daemon, service_user: str, monkeypatch) -> None:
    secret = set_secret(monkeypatch, "term_account_pass", "Chfn-pass-4Rt6")
    subprocess.run(["chpasswd"], input=f"{service_user}:{secret}\n", text=True, check=True, timeout=30)
    bare = await rungd_daemon.call("term_account_room_bare_set", {"room": "B204"}, request_id="fn-0")
    asked(bare, "AUTH_REQUIRED", "Password:", "stdin", None)
    assert (bare.outcome, bare.effect) == ("not_started", "none")
    assert "B204" not in pwd.getpwnam(service_user).pw_gecos

    done = await rungd_daemon.call("term_account_room_set", {"room": "B204"}, request_id="fn-1")
    assert (done.status, done.effect) == ("ok", "changed"), done
    assert pwd.getpwnam(service_user).pw_gecos.split(",")[1] == "B204"
    assert not leaks(rungd_daemon, secret, bare, done)


@needs("chsh", "chpasswd", "usermod")
async def test_chsh_run_as_the_account_asks_its_password_and_sets_the_shell(
        rungd_daemon, service_user: str, monkeypatch) -> None:
    secret = set_secret(monkeypatch, "term_account_pass", "Chsh-pass-8Yu1")
    subprocess.run(["chpasswd"], input=f"{service_user}:{secret}\n", text=True, check=True, timeout=30)
    run("usermod", "--shell", "/bin/sh", service_user)  # chsh lets a user leave only a shell of /etc/shells
    bare = await rungd_daemon.call("term_account_shell_bare_set", {"shell": "/bin/bash"}, request_id="sh-0")
    asked(bare, "AUTH_REQUIRED", "Password:", "stdin", None)
    assert (bare.outcome, bare.effect) == ("not_started", "none") and pwd.getpwnam(service_user).pw_shell == "/bin/sh"

    done = await rungd_daemon.call("term_account_shell_set", {"shell": "/bin/bash"}, request_id="sh-1")
    assert (done.status, done.effect) == ("ok", "changed"), done
    assert pwd.getpwnam(service_user).pw_shell == "/bin/bash"
    assert not leaks(rungd_daemon, secret, bare, done)


@needs("gpasswd")
async def test_gpasswd_refuses_without_a_terminal_on_stdin_and_the_call_is_failed_at_once(
        rungd_daemon, service_user: str, monkeypatch) -> None:
    # probe: "gpasswd: Not a tty", status 1, nothing asked: it wants its stdin to be a terminal.
    set_secret(monkeypatch, "term_account_new_pass", "Group-pass-2Qa9")
    before = run("getent", "gshadow", service_user).stdout
    done = await rungd_daemon.call("term_group_password_set", {}, request_id="gp-1")
    assert (done.status, done.error.code) == ("error", "FAILED") and done.elapsed_ms < QUICK_MS, done
    assert (done.outcome, done.effect) == ("not_started", "none"), done
    assert run("getent", "gshadow", service_user).stdout == before


@needs("gpasswd")
async def test_gpasswd_failure_keeps_the_programs_words_after_the_settle_read(
        rungd_daemon, service_user: str, monkeypatch) -> None:
    set_secret(monkeypatch, "term_account_new_pass", "Group-pass-2Qa9")
    done = await rungd_daemon.call("term_group_password_set", {}, request_id="gp-2")
    assert done.error is not None and "Not a tty" in done.error.message + (done.error.hint or ""), done


# ---------------------------------------------------------------------------------- clients of servers
# No real server: each client's server is a small fake in a thread, speaking just enough of its
# protocol to take a password (so the test sees what was typed) and answer one query.

class FakeServer:
    """Serve one connection on ``listener`` with ``handle(conn) -> what it saw``, in a thread."""

    def __init__(self, listener: socket.socket, handle: Callable[[socket.socket], dict[str, Any]]) -> None:
        self.listener = listener
        self.seen: dict[str, Any] = {}
        self.failure: BaseException | None = None
        listener.settimeout(20)

        def serve() -> None:
            try:
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(20)
                    self.seen.update(handle(conn))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.failure = exc

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.listener.close()
        self.thread.join(5)


def recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def unix_listener(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)  # a socket file stays after its listener closes
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    return listener


# PostgreSQL: cleartext password authentication, then one row for any simple query.
def pg_message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def pg_serve(conn: socket.socket, expected: str) -> dict[str, Any]:
    length, = struct.unpack("!i", recv_exact(conn, 4))
    startup = recv_exact(conn, length - 4)
    conn.sendall(pg_message(b"R", struct.pack("!i", 3)))  # AuthenticationCleartextPassword
    kind, (length,) = recv_exact(conn, 1), struct.unpack("!i", recv_exact(conn, 4))
    password = recv_exact(conn, length - 4).rstrip(b"\0").decode()
    assert kind == b"p"
    if password != expected:
        conn.sendall(pg_message(b"E", b"SFATAL\0C28P01\0Mpassword authentication failed for user \"app\"\0\0"))
        return {"password": password, "startup": startup}
    conn.sendall(pg_message(b"R", struct.pack("!i", 0)) + b"".join(
        pg_message(b"S", f"{k}\0{v}\0".encode()) for k, v in
        (("server_version", "15.0"), ("server_encoding", "UTF8"), ("client_encoding", "UTF8"),
         ("standard_conforming_strings", "on"), ("DateStyle", "ISO, MDY"), ("integer_datetimes", "on")))
        + pg_message(b"K", struct.pack("!ii", 4242, 1)) + pg_message(b"Z", b"I"))
    kind, (length,) = recv_exact(conn, 1), struct.unpack("!i", recv_exact(conn, 4))
    query = recv_exact(conn, length - 4).rstrip(b"\0").decode()
    conn.sendall(pg_message(b"T", struct.pack("!h", 1) + b"answer\0" + struct.pack("!ihihih", 0, 0, 23, 4, -1, 0))
                 + pg_message(b"D", struct.pack("!hi", 1, 2) + b"42")
                 + pg_message(b"C", b"SELECT 1\0") + pg_message(b"Z", b"I"))
    return {"password": password, "query": query}


@needs("psql")
async def test_psql_w_asks_on_the_terminal_and_the_server_gets_the_declared_password(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    bare = await rungd_daemon.call("term_pg_bare_query", {})
    asked(bare, "AUTH_REQUIRED", "Password:", "terminal", "off")
    assert bare.outcome == "done"

    secret = set_secret(monkeypatch, "term_pg_pass", "Pg-pass-7007")
    server = FakeServer(unix_listener(real_root / "files" / ".s.PGSQL.5432"), lambda c: pg_serve(c, secret))
    try:
        done = await rungd_daemon.call("term_pg_query", {})
    finally:
        server.close()
    assert server.failure is None, server.failure
    assert server.seen["password"] == secret and server.seen["query"] == "SELECT 1"
    assert (done.status, done.fields.get("lines")) == ("ok", ["42"]), done

    # The server refuses it: psql exits 2 saying so; the call fails with its words, at once.
    server = FakeServer(unix_listener(real_root / "files" / ".s.PGSQL.5432"), lambda c: pg_serve(c, "other"))
    try:
        refused = await rungd_daemon.call("term_pg_query", {})
    finally:
        server.close()
    assert server.seen["password"] == secret
    assert refused.status == "error" and refused.error.code in ("FAILED", "AUTH_REQUIRED"), refused
    assert "password authentication failed" in refused.error.hint and refused.elapsed_ms < QUICK_MS
    assert not leaks(rungd_daemon, secret, bare, done, refused)


# MySQL/MariaDB: mysql_native_password (the client proves it knows the password with a
# scramble), then one row for any query.
def my_packet(seq: int, payload: bytes) -> bytes:
    return struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload


def my_read(conn: socket.socket) -> tuple[int, bytes]:
    head = recv_exact(conn, 4)
    return head[3], recv_exact(conn, int.from_bytes(head[:3], "little"))


def lenenc(text: bytes) -> bytes:
    return bytes([len(text)]) + text


def native_scramble(password: str, salt: bytes) -> bytes:
    stage1 = hashlib.sha1(password.encode()).digest()
    mask = hashlib.sha1(salt + hashlib.sha1(stage1).digest()).digest()
    return bytes(a ^ b for a, b in zip(stage1, mask))


def my_serve(conn: socket.socket, expected: str) -> dict[str, Any]:
    salt = b"abcdefghijklmnopqrst"
    caps = 0x1 | 0x4 | 0x8 | 0x200 | 0x2000 | 0x8000 | 0x80000  # 4.1 protocol, secure connection, plugin auth
    greeting = (b"\x0a" + b"5.7.99-rungd-fake\0" + struct.pack("<I", 7) + salt[:8] + b"\0"
                + struct.pack("<H", caps & 0xFFFF) + bytes([33]) + struct.pack("<H", 2)
                + struct.pack("<H", caps >> 16) + bytes([21]) + b"\0" * 10 + salt[8:] + b"\0"
                + b"mysql_native_password\0")
    conn.sendall(my_packet(0, greeting))
    seq, reply = my_read(conn)
    client_caps, = struct.unpack("<I", reply[:4])
    rest = reply[32:]
    user, rest = rest.split(b"\0", 1)
    # One length byte (CLIENT_SECURE_CONNECTION, or a short length-encoded integer), then the proof.
    assert client_caps & 0x8000, hex(client_caps)
    size, rest = rest[0], rest[1:]
    proof = rest[:size]
    matched = proof == native_scramble(expected, salt)
    if not matched:
        conn.sendall(my_packet(seq + 1, b"\xff" + struct.pack("<H", 1045) + b"#28000Access denied for user 'app'"))
        return {"user": user.decode(), "matched": False}
    conn.sendall(my_packet(seq + 1, b"\x00\x00\x00\x02\x00\x00\x00"))
    queries = []
    while True:
        try:
            _, command = my_read(conn)
        except EOFError:
            break
        if command[:1] != b"\x03":  # COM_QUIT or anything else: done
            break
        queries.append(command[1:].decode())
        column = (lenenc(b"def") + lenenc(b"") * 3 + lenenc(b"answer") + lenenc(b"") + b"\x0c"
                  + struct.pack("<HIBHB", 33, 2, 0xFD, 0, 0) + b"\0\0")
        eof = b"\xfe\x00\x00\x02\x00"
        conn.sendall(my_packet(1, b"\x01") + my_packet(2, column) + my_packet(3, eof)
                     + my_packet(4, lenenc(b"42")) + my_packet(5, eof))
    return {"user": user.decode(), "matched": True, "queries": queries}


@needs("mysql")
async def test_mysql_p_asks_on_the_terminal_and_the_server_gets_the_declared_password(
        rungd_daemon, real_root: Path, monkeypatch) -> None:
    bare = await rungd_daemon.call("term_mysql_bare_query", {})
    asked(bare, "AUTH_REQUIRED", "Enter password:", "terminal", "off")
    assert bare.outcome == "done"

    secret = set_secret(monkeypatch, "term_mysql_pass", "My-pass-3306")
    server = FakeServer(unix_listener(real_root / "files" / "mysqld.sock"), lambda c: my_serve(c, secret))
    try:
        done = await rungd_daemon.call("term_mysql_query", {})
    finally:
        server.close()
    assert server.failure is None, server.failure
    assert (server.seen["user"], server.seen["matched"]) == ("app", True), server.seen
    assert "SELECT 1" in server.seen["queries"]
    assert (done.status, done.fields.get("lines")) == ("ok", ["42"]), done

    server = FakeServer(unix_listener(real_root / "files" / "mysqld.sock"), lambda c: my_serve(c, "other"))
    try:
        refused = await rungd_daemon.call("term_mysql_query", {})
    finally:
        server.close()
    assert refused.status == "error" and refused.error.code in ("FAILED", "AUTH_REQUIRED"), refused
    assert "Access denied" in refused.error.hint and refused.elapsed_ms < QUICK_MS
    assert not leaks(rungd_daemon, secret, bare, done, refused)


# LDAP: a simple bind (the password travels as it is), then one entry for any search.
def ber(tag: int, body: bytes) -> bytes:
    size = len(body)
    if size < 0x80:
        return bytes([tag, size]) + body
    raw = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(raw)]) + raw + body


def ber_read(conn: socket.socket) -> tuple[int, bytes]:
    tag, first = recv_exact(conn, 2)
    size = first if first < 0x80 else int.from_bytes(recv_exact(conn, first & 0x7F), "big")
    return tag, recv_exact(conn, size)


def ber_items(data: bytes) -> list[tuple[int, bytes]]:
    items = []
    while data:
        tag, first = data[0], data[1]
        start, size = 2, first
        if first >= 0x80:
            start = 2 + (first & 0x7F)
            size = int.from_bytes(data[2:start], "big")
        items.append((tag, data[start:start + size]))
        data = data[start + size:]
    return items


def ldap_serve(conn: socket.socket, expected: str) -> dict[str, Any]:
    _, message = ber_read(conn)
    (_, msgid), (op, bind) = ber_items(message)[:2]
    assert op == 0x60, hex(op)  # BindRequest
    _version, (_, dn), (_, password) = ber_items(bind)
    code = 0 if password.decode() == expected else 49
    done = ber(0x0A, bytes([code])) + ber(0x04, b"") + ber(0x04, b"")
    conn.sendall(ber(0x30, ber(0x02, msgid) + ber(0x61, done)))
    seen: dict[str, Any] = {"dn": dn.decode(), "password": password.decode()}
    if code:
        return seen
    _, message = ber_read(conn)
    (_, msgid), (op, _search) = ber_items(message)[:2]
    assert op == 0x63, hex(op)  # SearchRequest
    entry = ber(0x04, b"uid=alice,dc=example,dc=com") + ber(0x30, ber(0x30, ber(0x04, b"cn")
                                                                         + ber(0x31, ber(0x04, b"Alice Example"))))
    conn.sendall(ber(0x30, ber(0x02, msgid) + ber(0x64, entry))
                 + ber(0x30, ber(0x02, msgid) + ber(0x65, ber(0x0A, b"\0") + ber(0x04, b"") + ber(0x04, b""))))
    seen["searched"] = True
    return seen


@needs("ldapsearch")
async def test_ldapsearch_w_asks_on_the_terminal_and_the_directory_gets_the_declared_password(
        rungd_daemon, monkeypatch) -> None:
    bare = await rungd_daemon.call("term_ldap_bare_search", {"port": 1, "uid": "alice"})
    asked(bare, "AUTH_REQUIRED", "Enter LDAP Password:", "terminal", "off")

    secret = set_secret(monkeypatch, "term_ldap_pass", "Ldap-pass-6389")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    server = FakeServer(listener, lambda c: ldap_serve(c, secret))
    try:
        done = await rungd_daemon.call("term_ldap_search", {"port": listener.getsockname()[1], "uid": "alice"})
    finally:
        server.close()
    assert server.failure is None, server.failure
    assert server.seen == {"dn": "cn=admin,dc=example,dc=com", "password": secret, "searched": True}
    assert done.status == "ok", done
    assert "dn: uid=alice,dc=example,dc=com" in done.fields["lines"] and "cn: Alice Example" in done.fields["lines"]

    # The directory refuses it: ldapsearch exits 49, which the tool names AUTH_REQUIRED.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    server = FakeServer(listener, lambda c: ldap_serve(c, "other"))
    try:
        refused = await rungd_daemon.call("term_ldap_search", {"port": listener.getsockname()[1], "uid": "alice"})
    finally:
        server.close()
    assert (refused.status, refused.error.code) == ("error", "AUTH_REQUIRED"), refused
    assert "Invalid credentials (49)" in refused.error.hint
    assert not leaks(rungd_daemon, secret, bare, done, refused)

