"""No docstring formula renders as a broken link on the documentation site (issue 37, item 11).

mkdocstrings renders docstrings as Markdown, so a formula such as B[μ](x_i) outside inline code
or math is read as a link ``[μ](x_i)`` to a page "x_i", and Γ[μ][x] as a reference link that
autorefs tries to resolve. Such formulas belong in backticks (``B[μ](x_i)``) or math
(``$B[\\mu](x_i)$``). Every docstring of the package (modules, classes, functions, methods) is
scanned with its fenced code, inline code and math removed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "transformer_pde"

_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.S | re.M)
_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)  # ``x``, `x`
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$|\\\(.+?\\\)|\\\[.+?\\\]", re.S)
_INDENTED = re.compile(r"(^[ \t]*\n)((?:(?: {4}|\t).*\n?|[ \t]*\n)+)", re.M)
"""A block indented by 4 spaces after a blank line: a Markdown code block (a Google section's
items follow their header with no blank line, and stay text)."""
_LINK = re.compile(r"\]\(|\]\[")


def _visible(doc: str) -> str:
    """The docstring's text as Markdown renders it as text: no fenced code, inline code or math."""
    doc = _FENCE.sub(" ", doc)
    doc = _INDENTED.sub(r"\1", doc)
    for pattern in (_CODE, _MATH):
        doc = pattern.sub(" ", doc)
    return doc


def offenders(source: str, where: str) -> list[str]:
    out = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if not doc:
                continue
            for line in _visible(doc).splitlines():
                if _LINK.search(line):
                    name = getattr(node, "name", "<module>")
                    out.append(f"{where}:{name}: {line.strip()}")
    return out


def test_the_scanner_finds_link_patterns_outside_code_and_math():
    src = '''r"""v[μ](t, x) and Γ[μ][x] are links; `B[μ](x_i)`, ``A_B[μ](x)``, $B[\\mu](x)$ are not."""'''
    found = offenders(src, "m.py")
    assert len(found) == 1 and "v[μ](t, x)" in found[0]
    assert offenders('"""```python\\nf[0](x)\\n```"""', "m.py") == []
    assert offenders('"""Text:\\n\\n    v[μ](x) in a code block\\n\\nmore text\\n"""', "m.py") == []
    assert len(offenders('"""Args:\\n    x: v[μ](x), a section item\\n"""', "m.py")) == 1


def test_no_docstring_formula_reads_as_a_markdown_link():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        bad += offenders(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not bad, "docstring text read as a Markdown link (wrap it in backticks or $...$):\n" + "\n".join(bad)
