"""Gates: which calls need a person, who counts as one, and how a signature is checked.

The operator's configuration maps each side-effect class to a gate; a tool may ask for a
stricter one, never a looser one. ``none`` and ``log`` run at once (every call is in the
ledger either way); ``review`` holds the call until an operator approves it; ``signature``
also requires the approval to carry an SSH signature (``ssh-keygen -Y sign``) over the
call's digest by a key in the configured allowed-signers file. An approval covers one
call: its tool and exact inputs.

Whose key made a signature is asked of ssh-keygen, which knows the file's format, its
patterns and its certificates: ``find-principals`` names the signer (the first line that
lists the key, only), and ``verify -I NAME`` against a widened copy of the file answers
whether the key is listed for NAME on any line, in any form (``verify_signature``).
"""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile
from collections.abc import Collection
from pathlib import Path
from rungd.config import Config
from rungd.core.contract import Caller, Tool
from rungd.core.vocabulary import GATE_ORDER, Gate
from rungd.core.errors import ConfigError, GateDenied

SIGNATURE_NAMESPACE = "rungd-approval"


def stricter_gate(a: Gate, b: Gate | None) -> Gate:
    """The stricter of two gates; a tool may tighten the configured gate, never loosen it."""
    if b is None:
        return a
    return a if GATE_ORDER.index(a) >= GATE_ORDER.index(b) else b


def gate_for(tool: Tool, config: Config) -> Gate:
    """The gate a call of ``tool`` passes: the configured one, or the tool's if stricter."""
    return stricter_gate(getattr(config.gates, tool.side_effect), tool.gate)


def check_gates(tools: list[Tool], config: Config) -> None:
    """Refuse to start when a tool needs signatures and no key could ever approve one.

    Raises:
        ConfigError: naming the tool and the missing setting.
    """
    signers = config.gates.allowed_signers
    for tool in tools:
        if gate_for(tool, config) == "signature" and (signers is None or not signers.is_file()):
            raise ConfigError(
                f"tool {tool.name} needs signed approvals ({tool.side_effect}), but gates.allowed_signers "
                f"{'is not set' if signers is None else f'({signers}) does not exist'}; hint: point it at an "
                "ssh allowed_signers file, or set a looser gate for that class"
            )


def is_operator(caller: Caller, config: Config) -> bool:
    """Whether the caller may approve or deny held calls (uid 0 always may)."""
    gates = config.gates
    if caller.uid == 0 or caller.uid in gates.operator_uids:
        return True
    return bool(caller.groups & {config.gid(name) for name in gates.operator_groups})


def approval_message(call_id: str, tool: str, input_digest: str) -> bytes:
    """The exact bytes an operator signs to approve one call."""
    return f"rungd approval\ncall_id {call_id}\ntool {tool}\ninputs {input_digest}\n".encode()


@dataclasses.dataclass(frozen=True)
class Signer:
    """Who signed an approval, as the allowed-signers file tells it.

    Attributes:
        principal: the principal the signature verified as (the ledger's note names it).
        listed_as: the first of the names asked about that the signing key is listed under,
            on any line and in any form (``operator,alice``, ``ali*``, ``alice@host``); None
            when it is listed under none of them.
    """

    principal: str
    listed_as: str | None


def verify_signature(allowed_signers: Path, message: bytes, signature: str, names: Collection[str] = ()) -> Signer:
    """Check an SSH signature over ``message``; say who made it and whether ``names`` could have.

    Runs ``ssh-keygen -Y find-principals`` then ``-Y verify`` (argv only, no shell), and
    for ``names`` the checks of ``_listed_as``. Blocking: call it from a worker thread.

    Args:
        names: how the one who must not have signed is spelled (a login name, a uid).

    Raises:
        GateDenied: no signature, not made by an allowed key, or not over this message; or
            the file could not be read to rule ``names`` out.
    """
    try:
        return _verify(allowed_signers, message, signature, names)
    except (OSError, subprocess.SubprocessError) as exc:
        raise GateDenied(f"the signature could not be checked: {exc}",
                         hint="the operator must make ssh-keygen available to rungd") from None


def _verify(allowed_signers: Path, message: bytes, signature: str, names: Collection[str]) -> Signer:
    with tempfile.TemporaryDirectory(prefix="rungd-sig-") as folder:
        sig = Path(folder) / "approval.sig"
        sig.write_text(signature, encoding="ascii", errors="replace")
        granted = signing_principals(allowed_signers, sig)
        if not granted:
            raise GateDenied(
                "the approval's signature is not by a key in the allowed signers file",
                hint="sign with an operator key listed in gates.allowed_signers (rungctl approve --key)",
            )
        if not verifies(allowed_signers, granted[0], sig, message):
            raise GateDenied(
                "the approval's signature does not cover this call",
                hint="sign the message rungctl approve builds for this exact call_id, tool and inputs",
            )
        listed_as = _listed_as(allowed_signers, sig, message, granted, names) if names else None
        return Signer(granted[0], listed_as)


def signing_principals(allowed_signers: Path, sig: Path) -> list[str]:
    """The principals ``allowed_signers`` lists the key that made ``sig`` under, or [].

    ssh-keygen prints one a line, all those of the first line listing the key; a negated one
    ("!bob") only narrows a pattern and names nobody who could have signed, so it is left out.
    Blocking (``ssh-keygen -Y find-principals``, 10 s at most).
    """
    found = subprocess.run(["ssh-keygen", "-Y", "find-principals", "-s", str(sig), "-f", str(allowed_signers)],
                           capture_output=True, text=True, timeout=10, check=False)
    if found.returncode != 0:
        return []
    return [p for p in found.stdout.split() if not p.startswith("!")]


def verifies(allowed_signers: Path, principal: str, sig: Path, message: bytes,
             namespace: str = SIGNATURE_NAMESPACE) -> bool:
    """Whether ssh-keygen accepts ``sig`` over ``message`` as ``principal``'s, by ``allowed_signers``."""
    verified = subprocess.run(
        ["ssh-keygen", "-Y", "verify", "-f", str(allowed_signers), "-I", principal, "-n", namespace,
         "-s", str(sig)],
        input=message, capture_output=True, timeout=10, check=False,
    )
    return verified.returncode == 0


def _listed_as(allowed_signers: Path, sig: Path, message: bytes, found: list[str],
               names: Collection[str]) -> str | None:
    """The first of ``names`` the key that made ``sig`` is listed under, or None.

    find-principals stops at the first line listing the key, and a later line may list it
    for the caller: so ssh-keygen is asked, name by name, to verify the signature as that
    name against a widened copy of the file (``_widened``), where every line also names
    its principals' users and no longer limits namespaces or dates. ssh-keygen then matches
    every line and its patterns its own way: ``ali*``, ``*`` and ``*@host`` name alice; so
    does ``!alice,*``, whose negation the copy drops (a key that may sign for nearly anyone
    is nobody's own). A principal find-principals printed is also compared by its user, as
    a certificate's principals (``alice@host``) are its own, not the file's.

    Raises:
        GateDenied: the widened copy does not even accept the signer: it cannot be
            trusted to say the key is not the caller's.
    """
    spelled = {name.lower(): name for name in names}
    for principal in found:
        if _principal_user(principal) in spelled:
            return spelled[_principal_user(principal)]
    widened = sig.with_name("allowed_signers")
    widened.write_text(_widened(allowed_signers.read_text(encoding="utf-8", errors="replace")), encoding="utf-8")
    if not verifies(widened, found[0], sig, message):
        raise GateDenied(
            "the allowed signers file could not be read to rule out that the caller signed its own call",
            hint="the operator should check gates.allowed_signers with ssh-keygen -Y find-principals",
        )
    return next((spelled[name] for name in spelled if verifies(widened, name, sig, message)), None)


def _principal_user(principal: str) -> str:
    """The user a principal names, in lower case: ``alice`` for ``Alice`` or ``alice@host``."""
    return principal.partition("@")[0].lower()


# The options an allowed_signers line may carry (ssh-keygen(1), ALLOWED SIGNERS).
_SIGNER_OPTIONS = ("cert-authority", "namespaces=", "valid-after=", "valid-before=")


def _widened(text: str) -> str:
    """``text``, an allowed_signers file, with each line granting more, never less.

    Each line keeps its key and its principals, adds each principal's user in lower case
    (``Alice@host`` also as ``alice``), drops negated principals (they only narrow) and
    every option but ``cert-authority`` (which says what the key is): whether a key is
    the caller's does not depend on the namespace or the dates it was listed for. A line
    this cannot take apart is kept as it is, for ssh-keygen to read or skip as it would.
    """
    lines = []
    for line in text.splitlines():
        fields = _signer_fields(line)
        if fields is None:
            lines.append(line)
            continue
        principals, options, key = fields
        granted = [p for p in principals.split(",") if p and not p.startswith("!")]
        if not granted:
            continue
        granted += sorted({_principal_user(p) for p in granted} - set(granted))
        ca = "cert-authority " if "cert-authority" in options else ""
        lines.append(f'"{",".join(granted)}" {ca}{key}')
    return "\n".join(lines) + "\n"


def _signer_fields(line: str) -> tuple[str, list[str], str] | None:
    """A line's principals, the names of its options (lower case) and the rest (the key and
    any comment); None for a blank line, a comment or a line of another shape.

    The principals may be quoted; the options run to the first blank outside quotes, as
    ssh-keygen reads them (``sshkey_advance_past_options``).
    """
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    if line.startswith('"'):
        principals, quote, rest = line[1:].partition('"')
        if not quote:
            return None
    else:
        principals, rest = (line.split(None, 1) + [""])[:2]
    rest = rest.lstrip()
    if not rest.lower().startswith(_SIGNER_OPTIONS):
        return (principals, [], rest) if rest else None
    quoted, end = False, 0
    while end < len(rest) and (quoted or rest[end] not in " \t"):
        if rest[end] == "\\" and rest[end + 1 : end + 2] == '"':
            end += 1
        elif rest[end] == '"':
            quoted = not quoted
        end += 1
    options, key = rest[:end], rest[end:].lstrip()
    if quoted or not key:
        return None
    names, quoted, start = [], False, 0
    for i, char in enumerate(options + ","):
        if char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            names.append(options[start:i].partition("=")[0].lower())
            start = i + 1
    return principals, names, key


def sign(key: Path, message: bytes) -> str:
    """Sign ``message`` with an operator's SSH key (``ssh-keygen -Y sign``); used by rungctl."""
    result = subprocess.run(
        ["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", SIGNATURE_NAMESPACE, "-q"],
        input=message, capture_output=True, timeout=60, check=False,
    )
    if result.returncode != 0:
        raise ValueError(f"ssh-keygen could not sign with {key}: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout.decode("ascii")
