"""Small closed vocabularies the contract, the config and the wire share, in a module that
costs nothing to import (every ``rungctl`` imports the config and the protocol)."""

from __future__ import annotations

from typing import Literal

# Who must agree before a call runs; the operator's config maps side effects to one, and a
# tool may only ask for a stricter one (rungd.service.gates decides and checks).
Gate = Literal["none", "log", "review", "signature"]
# From loosest to strictest: a tool may move its call to the right of the configured gate.
GATE_ORDER: tuple[Gate, ...] = ("none", "log", "review", "signature")

# Characters a reader cannot see, that change what text shows or make two texts look alike:
# bidi marks, embeddings, overrides and isolates ("\u202eecnalab-tes" shows as "set-balance"),
# and Unicode's default-ignorable code points (zero-width space, word joiner, soft hyphen,
# variation selectors, Hangul fillers, tag characters: "report.txt" plus invisible tags
# names another file), but for the zero-width joiner and non-joiner, which scripts and
# emoji need. Refused in every tool input (rungd.core.contract): an operator approves what a held
# call's inputs show.
DISGUISING = ("\\u00ad\\u034f\\u061c\\u115f\\u1160\\u17b4\\u17b5\\u180b-\\u180f\\u200b\\u200e\\u200f"
              "\\u202a-\\u202e\\u2060-\\u206f\\u3164\\ufe00-\\ufe0f\\ufeff\\uffa0\\ufff0-\\ufffb"
              "\\U0001bca0-\\U0001bca3\\U0001d173-\\U0001d17a\\U000e0000-\\U000e0fff")
# Characters a terminal or a log acts on rather than shows: C0 and C1 controls (escape
# sequences, line breaks, a carriage return that overwrites), line and paragraph separators,
# and the disguising ones. A regular expression character class; journal.visible escapes the same.
INVISIBLE = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029" + DISGUISING
