"""The convergence experiment on a law that moves (issue 22): the perturbed uniform law on S¹
against the deterministic quadrature reference, with exact W₁ and its reference error."""

import numpy as np
import pytest

from transformer_pde.experiments import get
from transformer_pde.experiments.convergence import growth_rates, leave_times
from transformer_pde.runs import run_experiment

TINY_CIRCLE = dict(model="circle", d=2, beta=9.0, log2_n_min=5, log2_n_max=6, log2_n_step=2, seeds=2, t1=0.5,
                   dt=0.1, num_times=3, order=32)


@pytest.mark.slow
def test_circle_study_tiny(tmp_path):
    exp = get("convergence")
    cfg = exp.make_config(**TINY_CIRCLE)
    res = run_experiment(exp, cfg, tmp_path / "run", progress=False)["results"]
    for f in ("convergence.png", "distance_vs_t.png", "report.txt", "errors.csv"):
        assert (tmp_path / "run" / f).exists(), f
    assert str(res["primary"]) == "w1" and "quadrature" in str(res["reference"])
    w1, ref = res["err_w1"], res["ref_w1"]
    assert np.all(np.isfinite(w1)) and np.all(w1 > 1e-3)
    assert np.all(ref < 1e-4), ref  # order 32 against 16, resolution 2048 against 1024
    report = (tmp_path / "run" / "report.txt").read_text()
    assert "exact W1 on the circle" in report and "reference error" in report


def test_growth_and_leave_times():
    ts = np.array([0.0, 1.0, 2.0, 3.0])
    e = np.stack([np.exp(0.5 + 1.2 * ts), np.exp(0.1 + 0.4 * ts)])[:, None, :].repeat(3, axis=1)
    np.testing.assert_allclose(growth_rates(ts, e), [1.2, 0.4], rtol=1e-12)
    # 10 is crossed when 0.5 + 1.2 t > log 10 (t = 2 on the grid) and 0.1 + 0.4 t > log 10 (never
    # by t = 3); 1.5 is crossed at t = 0 by the first and at t = 1 by the second
    np.testing.assert_array_equal(leave_times(ts, e, 10.0)[:1], [2.0])
    assert np.isnan(leave_times(ts, e, 10.0)[1])
    np.testing.assert_array_equal(leave_times(ts, e, 1.5), [0.0, 1.0])


def test_bad_options_are_clear_errors():
    exp = get("convergence")
    with pytest.raises(ValueError, match="d=2"):
        exp.make_config(model="circle", d=3)
    with pytest.raises(ValueError, match="perturbation"):
        exp.make_config(model="circle", d=2, perturbation=1.5)
    with pytest.raises(ValueError, match="stationary"):
        exp.make_config(model="sphere", reference="quadrature")
