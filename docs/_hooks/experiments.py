"""MkDocs hook: the page ``experiments.md``, every registered experiment with its options.

Generated at build time from :data:`transformer_pde.experiments.REGISTRY`, with the same option
texts as ``transformer-pde run NAME --help`` (types, declared ranges, defaults, the fields'
docstrings), so the page cannot drift from the code. ``experiments_page()`` is also what
``tests/test_docs_coverage.py`` checks.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = "experiments.md"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _flag(name: str, value) -> str:
    """An option as it is typed: ``--n 32``, ``--animate`` / ``--no-animate`` for booleans."""
    from transformer_pde.experiments._options import format_value

    flag = name.replace("_", "-")
    if isinstance(value, bool):
        return f"--{flag}" if value else f"--no-{flag}"
    return f"--{flag} {format_value(value)}"


def _module_doc(exp) -> str:
    """The docstring of the experiment's computation (its entry names it: ``Deferred(module, ...)``)."""
    return (importlib.import_module(exp.compute.module).__doc__ or "").strip()


def experiments_page() -> str:
    """The Markdown of the experiment list, one section per registered experiment."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from transformer_pde.experiments import REGISTRY
    from transformer_pde.experiments._options import (
        describe_range,
        format_value,
        option_bounds,
        option_docs,
        type_name,
    )

    out = [
        "# Experiments",
        "",
        "Every published experiment, as `transformer-pde list` shows them. Run one with",
        "`transformer-pde run NAME --out runs/NAME`, change an option with `--OPTION VALUE` (lists",
        "comma-separated) or a TOML file (`--config file.toml`), and make a quick small run with the",
        "options of its *tiny* size. This page is generated from the experiment registry",
        "([`transformer_pde.experiments.REGISTRY`][transformer_pde.experiments.REGISTRY]) when the",
        "site is built; the figures are in the [gallery](gallery.md).",
        "",
    ]
    for name in sorted(REGISTRY):
        out.append(f"- [`{name}`](#{name.replace('_', '-')}): {_cell(REGISTRY[name].summary)}")
    out.append("")
    for name in sorted(REGISTRY):
        exp = REGISTRY[name]
        hints = exp.option_types()
        bounds, docs = option_bounds(exp.config), option_docs(exp.config)
        out += [f"## {name} {{#{name.replace('_', '-')}}}", "", f"*{_cell(exp.summary)}*", ""]
        doc = _module_doc(exp)
        if doc:
            out += [doc, ""]
        cmd = f"transformer-pde run {name} --out runs/{name}"
        tiny = " ".join(_flag(k, v) for k, v in exp.tiny.items())
        out += ["```bash", cmd, "```", ""]
        if tiny:
            out += [f"A tiny run (the test suite's size): `transformer-pde run {name} {tiny}`.", ""]
        if exp.resumable:
            out += ["Resumable: a killed run continues with `transformer-pde run --resume RUN_DIR`.", ""]
        out += [f"Options (`{exp.config.__module__}.{exp.config.__qualname__}`):", "",
                "| option | type | default | range | meaning |", "| --- | --- | --- | --- | --- |"]
        for f in dataclasses.fields(exp.config):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            rng = describe_range(bounds[f.name]) if f.name in bounds else ""
            flag = "--" + f.name.replace("_", "-")
            out.append(f"| `{flag}` | `{_cell(type_name(hints[f.name]))}` | `{_cell(format_value(default))}` "
                       f"| {_cell(rng)} | {_cell(docs.get(f.name, ''))} |")
        out.append("")
    return "\n".join(out) + "\n"


def on_files(files, config):
    """Add the generated page to the site (MkDocs calls this before it builds the nav)."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=experiments_page()))
    return files


__all__ = ["experiments_page", "on_files"]
