"""Options within their meaning (issue 25 cause 5): a cosine threshold lies in [-1, 1), a
tolerance in (0, 1), and a list option names distinct values -- refused before the run
directory is made (exit status 2, one line naming the option)."""

from __future__ import annotations

import re


import pytest

from transformer_pde import cli
from transformer_pde.experiments import REGISTRY


@pytest.mark.parametrize("argv, message", [
    (["run", "sweep-phase", "--dims", "2,2"], r"option dims lists 2 twice \(items 0 and 1\)"),
    (["run", "clustering", "--models", "SA,SA"], r"option models lists 'SA' twice"),
    (["run", "clustering", "--threshold", "2"], r"threshold.*\[-1, 1\)"),
    (["run", "clustering", "--threshold", "1"], r"threshold.*\[-1, 1\)"),
    (["run", "clustering", "--tol", "0"], r"tol.*\(0, 1\)"),
    (["run", "clustering", "--tol", "1"], r"tol.*\(0, 1\)"),
    (["run", "large-n", "--threshold", "-2"], r"threshold.*\[-1, 1\)"),
])
def test_options_outside_their_meaning_are_refused_before_the_run(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
    assert not out.exists()


def test_every_default_and_tiny_config_is_valid():
    """The declared ranges and distinct lists hold for what the package ships."""
    for exp in REGISTRY.values():
        exp.config()
        if exp.tiny:
            exp.config(**exp.tiny)
