"""The result envelope: what every call returns, success or failure.

One shape for every outcome, so agent code branches on ``status``, ``outcome``, ``effect``
and ``error.code`` and never parses prose. The model-facing envelope has a byte cap
(default 4096): when the tool's fields do not fit, ``fit_to_cap`` cuts them down, sets
``truncated`` and says in ``narrow`` what it cut (``fields.lines: 25 of 100 items kept``) and
how to ask for less. A count beside a list that says how many of its items are shown
(``lines_shown`` beside ``lines``: the ``<list>_shown`` convention) is kept equal to what is
left, so no count in an envelope claims more than it shows. The output stays on disk as
evidence (up to the evidence cap, whose file says what it did not keep), and the envelope
carries its ids.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec

from rungd.core.errors import NextAction, Outcome, Retry

Status = Literal["ok", "error", "pending"]
Effect = Literal["changed", "existing", "no_change", "none"]

DEFAULT_CAP_BYTES = 4096


class ErrorInfo(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The error part of an envelope: a stable code and words a model can act on."""

    code: str
    message: str
    retry: Retry
    hint: str = ""


class Settle(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The read to run when the outcome is unknown: tool name, its inputs, and the fields
    it shows if the effect happened (empty when the tool cannot say)."""

    tool: str
    inputs: dict[str, Any] = {}
    expect: dict[str, Any] = {}
    # What the same read showed before the act, of the expected fields (``state_digest``),
    # when the call made one: a reconcile that finds the effect absent and this state moved
    # cannot say the effect did not happen (a part of it may be done).
    before: str | None = None


def state_digest(fields: dict[str, Any], expect: dict[str, Any]) -> str:
    """A digest of what ``fields`` hold under the keys ``expect`` names: equal for two reads
    that show the same there."""
    shown = {key: fields.get(key) for key in expect}
    return hashlib.sha256(msgspec.json.encode(shown, order="sorted")).hexdigest()[:32]


class Envelope(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The result of one call. Every field is always present on the wire.

    Frozen: observers and clients get the very envelope the caller gets, and none of
    them may change it (``msgspec.structs.replace`` makes a changed copy).
    """

    call_id: str
    tool: str
    status: Status
    outcome: Outcome
    effect: Effect
    request_id: str | None = None
    fields: dict[str, Any] = {}
    verified_by: str | None = None
    truncated: bool = False
    narrow: str | None = None
    as_of: str | None = None
    error: ErrorInfo | None = None
    next_action: NextAction = "continue"
    settle: Settle | None = None
    evidence: list[str] = []
    elapsed_ms: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


_json = msgspec.json.Encoder()


def encoded_size(envelope: Envelope) -> int:
    """Size in bytes of the envelope as a model reads it (compact JSON)."""
    return len(_json.encode(envelope))


def fit_to_cap(envelope: Envelope, cap_bytes: int = DEFAULT_CAP_BYTES) -> Envelope:
    """Return the envelope cut down to at most ``cap_bytes`` of JSON.

    Cutting order: a long list of evidence ids is shortened to a pointer (it is not cut
    data: every file stays on disk); then the longest string or list in ``fields`` is halved (strings keep head
    and tail, lists keep their first items) until the envelope fits; then the error hint
    is shortened; as a last resort ``fields`` is emptied. Whenever anything is cut,
    ``truncated`` is set and ``narrow`` says so, pointing at the evidence ids.
    """
    if encoded_size(envelope) <= cap_bytes:
        return envelope
    if len(envelope.evidence) > 4:
        # Operators find every file of a call by its id; the model needs only a pointer.
        kept = [*envelope.evidence[:2], f"{envelope.call_id}.* ({len(envelope.evidence) - 3} more)",
                envelope.evidence[-1]]
        envelope = msgspec.structs.replace(envelope, evidence=kept)
        if encoded_size(envelope) <= cap_bytes:
            return envelope
    fields = _deepcopy(envelope.fields)
    hint = envelope.error.hint if envelope.error else ""
    cuts: dict[_Path, tuple[int, int, str]] = {}
    narrow = _narrow(envelope, cuts)
    for _ in range(200):
        candidate = _rebuild(envelope, fields, hint, narrow)
        if encoded_size(candidate) <= cap_bytes:
            return candidate
        if not _halve_largest(fields, cuts):
            break
        narrow = _narrow(envelope, cuts)
    while hint and len(hint) > 64:
        hint = _cut_string(hint, len(hint) // 2)
        candidate = _rebuild(envelope, fields, hint, narrow)
        if encoded_size(candidate) <= cap_bytes:
            return candidate
    # Nothing left to halve: keep only the fact that fields were dropped, and shorten the
    # daemon's own words too, so the cap holds whatever a tool put in its messages.
    last = _rebuild(envelope, {"_omitted": "fields did not fit the byte cap"}, hint[:64], narrow[:200])
    if encoded_size(last) <= cap_bytes:
        return last
    error = msgspec.structs.replace(last.error, message=_cut_string(last.error.message, 160)) if last.error else None
    return msgspec.structs.replace(
        last, error=error, settle=None if last.settle and len(_json.encode(last.settle)) > 512 else last.settle,
        verified_by=last.verified_by[:120] if last.verified_by else None, evidence=last.evidence[:2],
    )


_NARROW_CUTS = 4  # fields named in narrow; more are summed up, so narrow stays short


def _narrow(envelope: Envelope, cuts: dict[_Path, tuple[int, int, str]]) -> str:
    """The tool's own narrow, if any, then what the byte cap cut and how to ask for less."""
    named = [f"{_named(path)}: {kept} of {had} {unit} kept"
             for path, (had, kept, unit) in list(cuts.items())[:_NARROW_CUTS]]
    if len(cuts) > _NARROW_CUTS:
        named.append(f"{len(cuts) - _NARROW_CUTS} more cut")
    what = f" ({', '.join(named)})" if named else ""
    if envelope.narrow:
        return f"{envelope.narrow}; then the result was cut to fit the byte cap{what}"
    where = (f" the output rungd kept is evidence {', '.join(envelope.evidence)}: read it with the evidence request "
             f"(rungctl evidence {envelope.evidence[0]});" if envelope.evidence else "")
    return f"result cut to fit the byte cap{what};{where} ask for fewer rows or a narrower filter"


def _rebuild(envelope: Envelope, fields: dict[str, Any], hint: str, narrow: str) -> Envelope:
    error = msgspec.structs.replace(envelope.error, hint=hint) if envelope.error else None
    return msgspec.structs.replace(
        envelope, fields=_deepcopy(fields), error=error, truncated=True, narrow=narrow
    )


def _deepcopy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deepcopy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deepcopy(v) for v in value]
    return value


_CUT_MARK = " …[cut]… "


def _cut_string(text: str, keep: int) -> str:
    """Keep ``keep`` characters: two thirds from the head, one third from the tail."""
    head = (keep * 2) // 3
    tail = keep - head
    return text[:head] + _CUT_MARK + (text[-tail:] if tail else "")



# Where a value sits in the fields: its keys and list indexes, from the top.
_Path = tuple[str | int, ...]


def _named(path: _Path, most: int = 60) -> str:
    """A cut's path as narrow names it (``fields.after.lines``), short: a key from a
    program's output may be long."""
    text = "fields" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
    return text if len(text) <= most else text[: most - 3] + "..."


def _halve_largest(container: Any, cuts: dict[_Path, tuple[int, int, str]]) -> bool:
    """Halve the largest string or list found anywhere inside ``container``, in place.

    Records in ``cuts`` each value cut, by path: its length before the first cut, its length
    now and the unit. A ``<key>_shown`` count beside a list cut becomes the list's new length.
    """
    best: tuple[int, Any, Any, _Path] | None = None  # (size, parent, key, path)

    def visit(parent: Any, key: Any, value: Any, path: _Path) -> None:
        nonlocal best
        if isinstance(value, str) and len(value) > 32:
            size = len(value)
        elif isinstance(value, list) and len(value) > 1:
            size = len(_json.encode(value))
        else:
            size = 0
        if size and (best is None or size > best[0]):
            best = (size, parent, key, path)
        if isinstance(value, dict):
            for k, v in value.items():
                visit(value, k, v, (*path, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                visit(value, i, v, (*path, i))

    for k, v in container.items():
        visit(container, k, v, (k,))
    if best is None:
        return False
    _, parent, key, path = best
    value = parent[key]
    had = cuts[path][0] if path in cuts else len(value)
    if isinstance(value, str):
        parent[key] = _cut_string(value, len(value) // 2)
        cuts[path] = (had, len(value) // 2, "characters")
        return True
    kept = len(value) // 2
    parent[key] = value[:kept]
    depth = len(path)  # below a list, the next part of a path is an index
    for gone in [inner for inner in cuts if inner[:depth] == path and len(inner) > depth and inner[depth] >= kept]:
        del cuts[gone]  # a cut inside an item no longer shown
    cuts[path] = (had, kept, "items")
    if isinstance(parent, dict) and isinstance(parent.get(f"{key}_shown"), int):
        parent[f"{key}_shown"] = kept
    return True
