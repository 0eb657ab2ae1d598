"""Options within their meaning (issue 25 cause 5): a cosine threshold lies in [-1, 1), a
tolerance in (0, 1), and a list option names distinct values -- refused before the run
directory is made (exit status 2, one line naming the option)."""

from __future__ import annotations

import math
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


@pytest.mark.parametrize("argv, message", [
    # sizes whose arrays could not be held: refused from the footprint the config declares
    (["run", "phase-diagram", "--batch", "2000000000"],
     r"attention scores of num_betas × batch × n × n = 25 × 2000000000 × 32 × 32 "
     r".* lower num_betas or batch or n"),
    (["run", "normalization", "--heads", "100000000"], r"seeds × heads × n × n = 32 × 100000000 × 64 × 64"),
    (["run", "sweep-phase", "--num-betas", "100000000"], r"num_betas × seeds × n × n"),
    (["run", "sweep-phase", "--chunk-size", "3000000"], r"chunk_size × n × n"),
    (["run", "random-heads", "--chain-paths", "2000000000"], r"chain states of chain_paths × n × d"),
    (["run", "causal-clustering", "--n", "100000"], r"attention scores of n × n = 100000 × 100000"),
    (["run", "clustering", "--n", "100000", "--max-tokens-saved", "100000"],
     r"num_saves × min\(n, max_tokens_saved\) × min\(n, max_tokens_saved\) "
     r".* lower num_saves or n or max_tokens_saved"),
    # floats checked in the dtype the runs use: finite in float64, inf or zero in float32
    (["run", "phase-diagram", "--beta-max", "1e39"], r"option beta_max must be 0 or of magnitude in .*float32"),
    (["run", "sweep-phase", "--beta-max", "3.5e38"], r"option beta_max .*float32"),
    (["run", "clustering", "--dt", "1e-40"], r"option dt .*float32"),
])
def test_sizes_beyond_the_budget_are_refused_before_the_run(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--out", str(out), "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(message, err), err
    assert not out.exists()


def test_footprint_budget_edge():
    """An array of exactly the budget is allowed, one more element refused (the check counts
    in Python integers: no overflow)."""
    from transformer_pde.experiments._options import ELEMENT_BUDGET
    from transformer_pde.experiments.phase_diagram import PhaseDiagramConfig

    n = 32
    at_budget = ELEMENT_BUDGET // (n * n)  # num_betas * batch with scores of exactly the budget
    PhaseDiagramConfig(num_betas=1, batch=at_budget, n=n)
    with pytest.raises(ValueError, match="above the budget"):
        PhaseDiagramConfig(num_betas=1, batch=at_budget + 1, n=n)


def test_every_experiment_declares_its_footprint():
    """Every experiment's sizes are bounded before its run: its config declares its largest
    arrays (Options.footprint), each an axis of options, nonempty, within the budget at the
    defaults."""
    from transformer_pde.experiments._options import ELEMENT_BUDGET, Options

    for exp in REGISTRY.values():
        assert exp.config.footprint is not Options.footprint, f"{exp.name} declares no footprint"
        fp = exp.config().footprint()
        assert fp and all(axes for axes in fp.values()), exp.name
        assert all(math.prod(n for _, n in axes) <= ELEMENT_BUDGET for axes in fp.values()), exp.name
