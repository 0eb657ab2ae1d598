"""Regenerate ``docs/bad_inputs.md`` from the fuzz registry: ``python tests/fuzz/make_bad_inputs.py``.

For every registered (entry point, parameter) and each kind of bad value it is fuzzed with, one
value is run (concrete, and traced under ``jax.jit`` where the registry says the parameter can
be) and the error obtained is written down; the command line's options get one bad value each
(option parsing only, nothing runs). The hand-checked cases of ``tests/test_validation.py``
(messages matched by regular expressions) and its list of silent failures follow.
``tests/fuzz/test_fuzz_doc.py`` checks the file lists the registry's (entry, parameter) pairs.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DOC = ROOT / "docs" / "bad_inputs.md"
FUZZ_HEADING = "## Every entry point, fuzzed (`tests/fuzz/`)"
CLI_HEADING = "## Every command-line option, fuzzed (`tests/fuzz/test_fuzz_cli.py`)"
CURATED_HEADING = "## Hand-checked cases (`tests/test_validation.py`)"


def _cell(text: str, limit: int = 170) -> str:
    text = " ".join(str(text).split())
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return text.replace("|", "\\|")


def _value(v) -> str:
    import numpy as np

    if isinstance(v, np.ndarray):
        return f"array {v.shape}" + (f" with {v.ravel()[1]!r}" if v.size > 1 and v.dtype.kind in "fc" else
                                     f" of dtype {v.dtype}")
    return repr(v)


def fuzz_rows():
    """(entry, parameter, value, message) for each registered pair and kind."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jaxtyping

    jaxtyping.config.update("jaxtyping_disable", True)
    from fuzz_registry import KINDS, REGISTRY, TRACEABLE, bad_value, run_case
    from test_fuzz import KNOWN, valid_value

    for entry in REGISTRY:
        for param in entry.params:
            valid = valid_value(entry, param)
            for kind in param.bad + param.ok:
                for traced in ([False, True] if param.traced and kind in TRACEABLE else [False]):
                    value = bad_value(kind, valid, param, index=1)
                    try:
                        with contextlib.redirect_stderr(io.StringIO()):
                            out = run_case(entry, param, value, traced)
                        if out.kind == "refused":
                            text = f"{out.error.split(':', 1)[0]}: {out.message}"
                        elif kind in param.ok:
                            text = "a meaningful value: " + ("a finite answer" if not out.message else out.message)
                        else:
                            text = f"**accepted** ({out.message or 'a finite result'})"
                    except Exception as e:  # an obscure error: the doc shows it as it is
                        text = f"**{type(e).__name__}**: {e}"
                    if (entry.name, param.name) in KNOWN and not text.startswith(("ValueError", "TypeError",
                                                                                   "EquinoxRuntimeError",
                                                                                   "a meaningful")):
                        text += f" (known: {KNOWN[(entry.name, param.name)]})"
                    shown = f"{KINDS[kind].split(' (')[0]}: `{_cell(_value(value), 60)}`" + (" under jit" if traced else "")
                    yield entry.name, param.name, shown, text


def cli_rows():
    """(experiment, option, text, message): the first bad text of each option."""
    import transformer_pde.runs as runs_pkg
    import transformer_pde.runs.compile_cache as compile_cache
    from test_fuzz_cli import OPTIONS, RanAnyway, bad_texts
    from transformer_pde import cli

    def refuse(*a, **k):
        raise RanAnyway("ran")

    runs_pkg.run_experiment, compile_cache.enable_compile_cache = refuse, lambda *a, **k: None
    with tempfile.TemporaryDirectory() as tmp:
        for exp, name in OPTIONS:
            text = bad_texts(exp, name)[0]
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    cli.main(["run", exp.name, f"{cli.option_flag(name)}={text}", "--out",
                              os.path.join(tmp, "out")])
                    msg = "**accepted**"
                except SystemExit as e:
                    msg = f"exit {e.code}: " + err.getvalue().strip().removeprefix("transformer-pde: error: ")
            yield exp.name, name, text, msg


def render(fuzz, cli_cases) -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    import test_validation

    curated = test_validation.render_doc().split("\n", 2)[2]  # its table, without its title
    lines = [
        "# Bad inputs and the errors they give", "",
        "Concrete bad values raise `ValueError` (or `TypeError`) naming the parameter, the value and what "
        "was expected; inside `jit` the same checks become `eqx.error_if` (an `EquinoxRuntimeError` with the "
        "same message); a NaN/inf produced during a run raises `NonFiniteStateError` naming the time it "
        "appeared (with `throw=False`, reported in `Solution.nonfinite_time` and `Solution.result`). "
        "Command-line mistakes exit with status 2 and one line on stderr, before any run directory is made.",
        "",
        "This file is generated: `python tests/fuzz/make_bad_inputs.py` (the fuzz harness's registry, "
        "`tests/fuzz/fuzz_registry.py`, one value of each kind; then the hand-checked cases). A row marked "
        "**accepted** or with an error type in bold is a case the harness still fails (its cause in "
        "`KNOWN`, `tests/fuzz/test_fuzz.py`).", "",
        FUZZ_HEADING, "",
        "| entry point | parameter | bad value | error |", "|---|---|---|---|",
    ]
    lines += [f"| `{e}` | `{p}` | {v} | {_cell(m)} |" for e, p, v, m in fuzz]
    lines += ["", CLI_HEADING, "",
              "One bad value of each option (the harness draws among a dozen per option: NaN, inf, a "
              "non-number, an empty list item, a non-integer, just outside the declared range, a duplicate).",
              "", "| experiment | option | bad text | error |", "|---|---|---|---|"]
    lines += [f"| `{e}` | `{o}` | `{_cell(t, 40)}` | {_cell(m, 200)} |" for e, o, t, m in cli_cases]
    lines += ["", CURATED_HEADING, "", curated.strip()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(ROOT / "tests"))
    import jax

    jax.config.update("jax_enable_x64", True)
    fuzz = list(fuzz_rows())
    cli_cases = list(cli_rows())
    DOC.write_text(render(fuzz, cli_cases))
    print(f"wrote {DOC}: {len(fuzz)} fuzzed values, {len(cli_cases)} options")
