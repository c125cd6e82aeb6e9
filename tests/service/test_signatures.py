"""Whose key signed an approval, asked of a real ssh-keygen with real keys: a key the
allowed-signers file lists for the caller, on any line and in any form, is the caller's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rungd.core.errors import GateDenied
from rungd.service.gates import approval_message, sign, verify_signature

ALICE = {"alice", "1000"}  # how _user_names spells the caller: login name and uid
MESSAGE = approval_message("c0123456789abcdef", "fake_archive_purge", "d" * 64)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """An operator's key and the caller's, each as (private key file, public key line)."""
    folder = tmp_path_factory.mktemp("keys")
    made = {}
    for who in ("operator", "alice"):
        key = folder / who
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(key)], check=True)
        made[who] = (key, key.with_suffix(".pub").read_text().strip())
    return made


def signed_by(folder: Path, keys: dict[str, tuple[Path, str]], who: str, *lines: str):
    """Verify a signature by ``who``'s key against an allowed_signers file of ``lines``
    (``{operator}`` and ``{alice}`` stand for the public keys), asking about alice."""
    signers = folder / "allowed_signers"
    signers.write_text("".join(line.format(operator=keys["operator"][1], alice=keys["alice"][1]) + "\n"
                               for line in lines))
    return verify_signature(signers, MESSAGE, sign(keys[who][0], MESSAGE), ALICE)


@pytest.mark.parametrize("lines", [
    ("operator,alice {alice}",),  # one line, the operator named first
    ("operator {alice}", "alice {alice}"),  # two lines: find-principals stops at the first
    ("operator {alice}", "alice@laptop {alice}"),
    ("operator {alice}", "Alice {alice}"),
    ("operator {alice}", "ali* {alice}"),  # a pattern matching the caller's name
    ("operator {alice}", "*@example.com {alice}"),
    ("operator {alice}", "!alice,* {alice}"),  # a key for nearly anyone is nobody's own
    ("operator {alice}", "1000 {alice}"),  # the uid spelled as a principal
    ("operator {alice}", 'alice namespaces="git" {alice}'),  # listed for another use
    ("operator {alice}", "alice valid-before=20200101 {alice}"),  # listed once, expired
    ('"operator" cert-authority,namespaces="a b" {operator}', "operator {alice}", '"alice" {alice}'),
])
def test_the_callers_key_is_named_whatever_else_it_is_listed_under(tmp_path, keys, lines) -> None:
    signer = signed_by(tmp_path, keys, "alice", *lines)
    assert signer.principal == "operator"  # what the old check looked at, and let through
    assert signer.listed_as in ALICE


@pytest.mark.parametrize("lines", [
    ("operator {operator}", "alice {alice}"),
    ("alice,ali* {alice}", "operator@example {operator}"),
    ("operator,!alice {operator}", "alice {alice}"),
    ("# a comment", "", "bogus=1 {alice}", "alice namespaces=\"git\" {alice}", "op* {operator}"),
])
def test_a_genuine_operator_key_is_named_for_nobody_else(tmp_path, keys, lines) -> None:
    signer = signed_by(tmp_path, keys, "operator", *lines)
    assert signer.principal.startswith("op") and signer.listed_as is None


def test_a_key_listed_for_nobody_signs_nothing(tmp_path, keys) -> None:
    with pytest.raises(GateDenied, match="not by a key in the allowed signers"):
        signed_by(tmp_path, keys, "alice", "operator {operator}")
