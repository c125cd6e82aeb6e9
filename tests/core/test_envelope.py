"""The byte cap on the model-facing envelope."""

from __future__ import annotations

from rungd.core.envelope import Envelope, ErrorInfo, encoded_size, fit_to_cap


def envelope(**fields) -> Envelope:
    return Envelope(call_id="c1", tool="t", status="ok", outcome="done", effect="none", fields=fields,
                    evidence=["c1.1.stdout"])


def test_small_envelope_is_untouched() -> None:
    env = envelope(a=1)
    assert fit_to_cap(env, 4096) is env
    assert env.truncated is False


def test_big_string_is_cut_with_head_and_tail_and_marked() -> None:
    text = "HEAD" + "x" * 20000 + "TAIL"
    env = fit_to_cap(envelope(out=text, keep="small"), 4096)
    assert encoded_size(env) <= 4096
    assert env.truncated is True
    assert env.fields["out"].startswith("HEAD") and env.fields["out"].endswith("TAIL")
    assert env.fields["keep"] == "small"
    assert "c1.1.stdout" in env.narrow


def test_long_list_keeps_its_first_items() -> None:
    env = fit_to_cap(envelope(rows=list(range(5000))), 1024)
    assert encoded_size(env) <= 1024
    assert env.fields["rows"][:3] == [0, 1, 2]
    assert env.truncated


def test_error_hint_is_cut_when_fields_cannot_shrink() -> None:
    env = Envelope(call_id="c1", tool="t", status="error", outcome="not_started", effect="none",
                   error=ErrorInfo(code="FAILED", message="m", retry="no", hint="h" * 10000))
    cut = fit_to_cap(env, 1024)
    assert encoded_size(cut) <= 1024
    assert cut.error.code == "FAILED"
    assert cut.truncated


def test_many_evidence_ids_shrink_to_a_pointer_before_fields_are_cut() -> None:
    env = Envelope(call_id="c1", tool="t", status="ok", outcome="done", effect="none", fields={"keep": "x" * 300},
                   evidence=[f"c1.{i}.stdout" for i in range(60)])
    cut = fit_to_cap(env, 1024)
    assert cut.fields == {"keep": "x" * 300}
    assert cut.evidence[0] == "c1.0.stdout" and "c1.* (57 more)" in cut.evidence


def test_the_cap_holds_even_when_the_words_themselves_are_long() -> None:
    env = Envelope(call_id="c1", tool="t", status="error", outcome="not_started", effect="none",
                   verified_by="v" * 3000,
                   error=ErrorInfo(code="FAILED", message="m" * 5000, retry="no", hint="h" * 5000))
    cut = fit_to_cap(env, 1024)
    assert encoded_size(cut) <= 1024
    assert cut.error.code == "FAILED" and cut.truncated


def test_a_count_of_shown_items_follows_its_list_when_the_list_is_cut() -> None:
    lines = [f"line {i} " + "x" * 40 for i in range(100)]
    env = fit_to_cap(envelope(lines=lines, lines_shown=100, lines_total=150,
                              after={"lines": lines, "lines_shown": 100}), 2048)
    assert encoded_size(env) <= 2048
    assert env.fields["lines_shown"] == len(env.fields["lines"]) < 100
    assert env.fields["after"]["lines_shown"] == len(env.fields["after"]["lines"]) < 100
    assert env.fields["lines_total"] == 150  # a total stays the total
    assert f"fields.lines: {len(env.fields['lines'])} of 100 items kept" in env.narrow
    assert f"fields.after.lines: {len(env.fields['after']['lines'])} of 100 items kept" in env.narrow
    assert "c1.1.stdout" in env.narrow


def test_a_tools_own_narrow_is_kept_and_the_byte_cap_cut_is_added_to_it() -> None:
    env = Envelope(call_id="c1", tool="t", status="ok", outcome="done", effect="none", truncated=True,
                   narrow="the first 100 of 150 lines are shown", fields={"rows": list(range(5000))})
    cut = fit_to_cap(env, 1024)
    assert cut.narrow.startswith("the first 100 of 150 lines are shown; then the result was cut to fit the byte cap")
    assert f"fields.rows: {len(cut.fields['rows'])} of 5000 items kept" in cut.narrow


def test_a_field_named_like_a_list_item_is_cut_without_a_crash() -> None:
    # "a[b" beside a list "a": the cut's bookkeeping once read "b" as an index and raised,
    # on the error path out of the call's task.
    cut = fit_to_cap(envelope(**{"a": ["x" * 10] * 4000, "a[b": "y" * 4500, "k" * 500: ["z" * 20] * 300}), 4096)
    assert cut.truncated and encoded_size(cut) <= 4096
    assert "..." in cut.narrow and len(cut.narrow) < 600  # a long key is named short
