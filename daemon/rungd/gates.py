"""Gates: which calls need a person, who counts as one, and how a signature is checked.

The operator's configuration maps each side-effect class to a gate; a tool may ask for a
stricter one, never a looser one. ``none`` and ``log`` run at once (every call is in the
ledger either way); ``review`` holds the call until an operator approves it; ``signature``
also requires the approval to carry an SSH signature (``ssh-keygen -Y sign``) over the
call's digest by a key in the configured allowed-signers file. An approval covers one
call: its tool and exact inputs.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rungd.errors import ConfigError, GateDenied

if TYPE_CHECKING:  # gates sit below the config and the contract, which both name a Gate
    from rungd.config import Config
    from rungd.contract import Caller, Tool

Gate = Literal["none", "log", "review", "signature"]
# From loosest to strictest: a tool may move its call to the right of the configured gate.
GATE_ORDER: tuple[Gate, ...] = ("none", "log", "review", "signature")

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


def verify_signature(allowed_signers: Path, message: bytes, signature: str) -> str:
    """Check an SSH signature over ``message``; return the signer's principal.

    Runs ``ssh-keygen -Y find-principals`` then ``-Y verify`` (argv only, no shell).
    Blocking: call it from a worker thread.

    Raises:
        GateDenied: no signature, not made by an allowed key, or not over this message.
    """
    try:
        return _verify(allowed_signers, message, signature)
    except (OSError, subprocess.SubprocessError) as exc:
        raise GateDenied(f"the signature could not be checked: {exc}",
                         hint="the operator must make ssh-keygen available to rungd") from None


def _verify(allowed_signers: Path, message: bytes, signature: str) -> str:
    with tempfile.TemporaryDirectory(prefix="rungd-sig-") as folder:
        sig = Path(folder) / "approval.sig"
        sig.write_text(signature, encoding="ascii", errors="replace")
        found = subprocess.run(
            ["ssh-keygen", "-Y", "find-principals", "-s", str(sig), "-f", str(allowed_signers)],
            capture_output=True, text=True, timeout=10, check=False,
        )
        principals = found.stdout.split()
        if found.returncode != 0 or not principals:
            raise GateDenied(
                "the approval's signature is not by a key in the allowed signers file",
                hint="sign with an operator key listed in gates.allowed_signers (rungctl approve --key)",
            )
        verified = subprocess.run(
            ["ssh-keygen", "-Y", "verify", "-f", str(allowed_signers), "-I", principals[0],
             "-n", SIGNATURE_NAMESPACE, "-s", str(sig)],
            input=message, capture_output=True, timeout=10, check=False,
        )
        if verified.returncode != 0:
            raise GateDenied(
                "the approval's signature does not cover this call",
                hint="sign the message rungctl approve builds for this exact call_id, tool and inputs",
            )
        return principals[0]


def sign(key: Path, message: bytes) -> str:
    """Sign ``message`` with an operator's SSH key (``ssh-keygen -Y sign``); used by rungctl."""
    result = subprocess.run(
        ["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", SIGNATURE_NAMESPACE, "-q"],
        input=message, capture_output=True, timeout=60, check=False,
    )
    if result.returncode != 0:
        raise ValueError(f"ssh-keygen could not sign with {key}: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout.decode("ascii")
