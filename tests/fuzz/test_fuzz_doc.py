"""docs/bad_inputs.md is generated from the fuzz registry (``python tests/fuzz/make_bad_inputs.py``):
it lists every registered (entry point, parameter) pair and every fuzzed command-line option
(the messages themselves are not compared: they may be reworded without regenerating)."""

from __future__ import annotations

import re

from fuzz_registry import REGISTRY
from make_bad_inputs import CLI_HEADING, CURATED_HEADING, DOC, FUZZ_HEADING


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = min((text.index(h, start + 1) for h in (FUZZ_HEADING, CLI_HEADING, CURATED_HEADING)
               if h in text[start + 1:]), default=len(text))
    return text[start:end]


def test_bad_inputs_doc_lists_the_registry():
    text = DOC.read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", _section(text, FUZZ_HEADING), re.M))
    registered = {(e.name, p.name) for e in REGISTRY for p in e.params}
    assert documented == registered, ("docs/bad_inputs.md is out of date; run python tests/fuzz/make_bad_inputs.py",
                                      sorted(registered - documented), sorted(documented - registered))


def test_bad_inputs_doc_lists_the_cli_options():
    from test_fuzz_cli import OPTIONS

    text = DOC.read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", _section(text, CLI_HEADING), re.M))
    assert documented == {(exp.name, name) for exp, name in OPTIONS}, \
        "docs/bad_inputs.md is out of date; run python tests/fuzz/make_bad_inputs.py"
