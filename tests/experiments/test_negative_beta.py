"""Negative β (repulsive attention, 2507.22857): accepted where the mathematics holds for every
real β, refused with the reason where a law or formula assumes β > 0."""

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.experiments import REGISTRY
from transformer_pde.experiments._common import rescaled_usa_step


def test_equiangular_at_negative_beta_follows_the_reduced_ode():
    """The equiangular reduction holds for every real β: at β = −1 the particles' Gram entries
    follow the SA and USA reduced ODEs (docs: math/sphere.md), and for SA 1 − ρ decays at the
    linearized rate 2 (USA's, 2e^β, is too slow to reach the fitted range by t1 = 8)."""
    exp = REGISTRY["equiangular"]
    res = exp.compute(exp.make_config(**{**exp.tiny, "betas": (-1.0,)}))
    for model in ("SA", "USA"):
        assert float(res[f"max_deviation_{model}"][0]) < 1e-6
    np.testing.assert_allclose(res["rate_SA"][0], 2.0, rtol=1e-2)


def test_plain_attention_experiments_accept_negative_beta():
    assert REGISTRY["clustering"].make_config(beta=-0.5).beta == -0.5
    assert REGISTRY["normalization"].make_config(betas=(-1.0, 1.0)).betas == (-1.0, 1.0)
    # USA is no faster than SA for β <= 0: the authors' step rule keeps dt (sqrt(β) was NaN)
    assert rescaled_usa_step(0.1, -2.0) == 0.1
    assert rescaled_usa_step(0.1, 4.0) == pytest.approx(0.1 / (2 * np.exp(3.5)))
    # the normalized energy is defined for every β: in [1, e^{2|β|}] for β < 0 (NumPy sum)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    expect = np.mean(np.exp(-1.5 * (x @ x.T - 1.0)))
    np.testing.assert_allclose(tp.diagnostics.normalized_energy(x, -1.5), expect, rtol=1e-12)
    assert 1.0 <= expect <= np.exp(3.0)


@pytest.mark.parametrize("name,option,why", [
    ("noisy-transition", {"betas": (-1.0,)}, "noisy-sphere laws"),
    ("instability", {"beta": -1.0}, "growth rates of the uniform state"),
    ("energy-flow", {"beta": -1.0}, "negative for β < 0"),
    ("causal-clustering", {"betas": (-1.0,)}, "Rényi radii"),
    ("metastability", {"cap_betas": (-1.0,)}, "metastability laws"),
])
def test_negative_beta_is_refused_with_the_reason(name, option, why):
    with pytest.raises(ValueError, match=f"> 0; got .*-1.0; .* > 0: .*{why}"):
        REGISTRY[name].make_config(**option)


def test_normalized_energy_overflow_at_large_negative_beta_is_an_error():
    x = np.array([[1.0, 0.0], [-1.0, 0.0]])
    with pytest.raises(ValueError, match="normalized_energy overflowed at beta=-1000"):
        tp.diagnostics.normalized_energy(x, -1000.0)


def test_cli_reads_negative_values_in_lists(tmp_path, capsys):
    """``--betas -1,2`` is a value (argparse took "-1,2" for an option); a refused β gives the
    reason on one line, exit 2, nothing run."""
    from transformer_pde.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", "noisy-transition", "--betas", "-1,2", "--out", str(tmp_path / "r")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "need betas > 0; got betas=-1.0,2.0; betas > 0: the noisy-sphere laws" in err
    assert not (tmp_path / "r").exists()
