"""MkDocs hook: the docstrings' Sphinx roles (``:class:`X```, ``:func:`~a.b.f```) read as code.

The package's docstrings are Google style with Sphinx cross-reference roles; mkdocstrings renders
a role as the text ``:class:`` before a code span. This drops the role and, as Sphinx does, shows
only the last component of a ``~``-prefixed path.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|mod|func|meth|attr|data|exc|obj|const):(<code>)")
_TILDE = re.compile(r"<code>~(?:[\w]+\.)*([\w]+)</code>")


def clean_roles(html: str) -> str:
    """``:class:<code>~a.b.C</code>`` -> ``<code>C</code>``."""
    return _TILDE.sub(r"<code>\1</code>", _ROLE.sub(r"\1", html))


def on_page_content(html, page, config, files):
    return clean_roles(html)
