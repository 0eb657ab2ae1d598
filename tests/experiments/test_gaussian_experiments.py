"""The Gaussian-closure and stability experiments at their tiny sizes, with asserted outcomes
(the session's shared tiny runs, ``tests/_runs.py``, read back from disk)."""

import numpy as np
import pytest
from _runs import tiny_run

from transformer_pde import experiments
from transformer_pde.experiments import gaussian_anisotropy as ga
from transformer_pde.theory.gaussian import identity_value_blowup_time


def _run(name, tmp_path_factory):
    return tiny_run(name, tmp_path_factory)[0]


@pytest.mark.slow
def test_gaussian_anisotropy_tiny(tmp_path_factory):
    res, cfg, _ = tiny_run("gaussian-anisotropy", tmp_path_factory)
    code = {name: i for i, name in enumerate(ga.OUTCOMES)}
    outcome = lambda regime, v: res[f"{regime}__{v}__outcome"]
    # the labelled grid of a regime holds the same runs (variant × start × save)
    two = res.grids["two_lines"]
    assert two["covs"].dims == ("variant", "start", "save", "row", "col")
    np.testing.assert_array_equal(two["outcome"].sel(variant="sinkhorn").values,
                                  outcome("two-lines", "sinkhorn"))
    # convergence to 0 for every variant with V = GGᵀ, K = −Q (euclidean.md §8); for softmax
    # tr(V⁻¹Σ) is non-increasing along the way (§5.2)
    variants = cfg.variants
    for v in variants:
        assert np.all(outcome("zero", v) == code["to zero"]), v
    Vinv = np.linalg.inv(res["zero__V"])
    covs = res["zero__softmax__covs"]
    lyap = np.einsum("ij,nkji->nk", Vinv, covs)
    assert np.all(np.diff(lyap, axis=1) <= 1e-12)
    # convergence to the line q⊥ (softmax, ℓ², Sinkhorn); softmax equals the closed form
    q = res["line__Q"][0]
    for v in set(variants) - {"multihead"}:
        assert np.all(outcome("line", v) == code["rank one"]), v
        final = res[f"line__{v}__final_cov"]
        assert np.all(np.einsum("i,nij,j->n", q, final, q) < 0.02 * np.trace(final, axis1=1, axis2=2))
    A = res["line__K"].T @ res["line__Q"] / np.sqrt(2)
    t1 = res["line__softmax__final_time"][0]
    for c0, c in zip(res["line__covs0"], res["line__softmax__final_cov"]):
        ref = np.linalg.inv(np.linalg.inv(c0) - t1 * (A + A.T))
        np.testing.assert_allclose(c, ref, rtol=1e-4, atol=1e-7)
    # two lines: rank-one limits on the isotropic lines uᵀ(A + Aᵀ)u = 0, and both lines are hit
    B = res["two-lines__K"].T @ res["two-lines__Q"]
    B = B + B.T
    for v in set(variants) & {"softmax", "l2", "sinkhorn"}:
        out = outcome("two-lines", v)
        assert np.all((out == code["rank one"]) | (out == code["to zero"])), v
        _, U = np.linalg.eigh(res[f"two-lines__{v}__final_cov"][out == code["rank one"]])
        u = U[:, :, -1]
        assert np.all(np.abs(np.einsum("ni,ij,nj->n", u, B, u)) < 1e-3 * np.linalg.norm(B, 2))
        hit = {int(np.argmax([abs(x @ e) for e in ga.isotropic_directions(B)])) for x in u}
        assert hit == {0, 1}, v
    # blow-up: softmax at t* of euclidean.md §5.1, multi-head in finite time; ℓ² and Sinkhorn
    # cross the threshold only later (exponential growth, no finite-time blow-up)
    A = res["blowup__K"].T @ res["blowup__Q"] / np.sqrt(2)
    tstar = np.array([float(identity_value_blowup_time(c, A)) for c in res["blowup__covs0"]])
    tb = res["blowup__softmax__blowup_time"]
    np.testing.assert_allclose(tb, tstar, rtol=1e-3)
    assert np.all(tb <= tstar)
    for v in set(variants) & {"softmax", "multihead"}:
        assert np.all(outcome("blowup", v) == code["blow-up"]), v
    # growth at most exponential (euclidean.md §5.4), tr Σ ≤ 2‖Σ‖ and ‖Σ0‖ ≤ tr Σ0 = 1:
    # Sinkhorn tr Σ ≤ 2e^{2‖V‖t}, ℓ² tr Σ ≤ 2e^{2‖V‖‖K⁻¹Q‖t}, so tr Σ = 1e4 comes no earlier
    K, Q = res["blowup__K"], res["blowup__Q"]
    rates = {"sinkhorn": 1.0, "l2": np.linalg.norm(np.linalg.solve(K, Q), 2)}
    for v, rate in rates.items():
        if v not in variants:
            continue
        assert np.all(outcome("blowup", v) == code["unbounded"]), v
        assert np.all(res[f"blowup__{v}__blowup_time"] >= np.log(1e4 / 2) / (2 * rate)), v


@pytest.mark.slow
def test_rank_histograms_tiny(tmp_path_factory):
    from transformer_pde.experiments.rank_histograms import UNCONVERGED

    res = _run("rank-histograms", tmp_path_factory)
    for d in (3, 4):
        for v in experiments.get("rank-histograms").tiny["variants"]:
            for vname in ("identity", "spd"):
                ranks = res[f"d{d}__{v}__{vname}__ranks"]
                decided = ranks[ranks != UNCONVERGED]
                assert np.all((0 <= decided) & (decided <= (d + 1) // 2)), (d, v, vname, ranks)
                assert res[f"d{d}__{v}__{vname}__unconverged"] == np.sum(ranks == UNCONVERGED)
                assert res[f"d{d}__{v}__{vname}__unconverged"] <= 1
                assert not np.isfinite(res[f"d{d}__{v}__{vname}__blowup_time"]).any()
                # a rank is read when the kept eigenvalues moved by < settle_tol over the last decade
                t = res[f"d{d}__{v}__{vname}__decided_time"]
                assert np.all(t >= 1e4) and np.all(np.log10(t) % 1 < 1e-9)
            # V = I: exactly dim ker(A + Aᵀ) = ⌈d/2⌉ (euclidean.md §5.1)
            ranks = res[f"d{d}__{v}__identity__ranks"]
            assert np.all(ranks[ranks != UNCONVERGED] == (d + 1) // 2)


@pytest.mark.slow
def test_rank_histograms_no_longer_counts_a_shrinking_eigenvalue():
    """d = 3, V = GᵀG, seed 40, run 58 of 100: its third eigenvalue decays like 1/(c + εt) with
    εt ≪ c until t ~ 1e5 (4e-3, 3e-3, 2e-3 at t = 1e3, 1e4, 1e5; 6e-5 at 1e7). The earlier rule,
    λ(t_long) > keep_ratio · λ(t_long/10), counted it: rank 3 > ⌈d/2⌉ = 2. Now its change grows from
    decade to decade, so the run is integrated on, and decided at rank 2 once it has vanished."""
    import diffrax
    import jax

    import transformer_pde as tp
    from transformer_pde.experiments import rank_histograms as rh

    cfg = experiments.get("rank-histograms").make_config(t_max=1e7)
    Q, S0, V = rh.draw(3, 100, cfg.seed)
    pid = diffrax.PIDController(rtol=cfg.rtol, atol=1e-3 * cfg.rtol)
    with jax.enable_x64(True):
        out = rh.limit_rank(rh._attention("softmax", Q[58], V[58], 3), S0[58], cfg, pid)
    assert out["rank"] == 2 and out["decided_time"] == 1e7, out
    lam = out["eigenvalues"]
    assert lam[0] < 1e-4 < 0.1 < lam[1]  # the vanishing one, and the two that persist
    # at t_long = 1e5 the old rule counted 3; the new one is undecided (integrate on)
    with jax.enable_x64(True):
        sol = tp.solve(rh._attention("softmax", Q[58], V[58], 3), tp.Gaussian(np.zeros(3), S0[58]),
                       t1=cfg.t_long, dt0=1e-3, solver=diffrax.Kvaerno5(), stepsize_controller=pid,
                       max_steps=cfg.max_steps, throw=False, saveat=cfg.decades[:3])
    covs = np.asarray(sol.covs)
    _, old_mid, old_end = np.linalg.eigvalsh(covs)
    assert np.sum(old_end > cfg.keep_ratio * old_mid) == 3
    assert rh.decided_rank(covs, cfg.keep_ratio, cfg.settle_tol, 10 * cfg.rtol, 0.1 * cfg.rtol)[0] is None


@pytest.mark.slow
def test_stability_tiny(tmp_path_factory):
    res = _run("stability", tmp_path_factory)
    for v in experiments.get("stability").tiny["variants"]:
        R, bound = res[f"{v}__radius"], res[f"{v}__radius_bound"]
        np.testing.assert_allclose(R[0], 1.0)
        assert np.all(R <= bound * (1 + 1e-12)), v
    ratio, bound = res["w2_ratio"], res["stability_bound"]
    assert np.all(ratio[:, 0] == 1.0) and np.all(np.isfinite(ratio))
    assert np.all(ratio <= bound[None, :])
    # W₂(μ_0, ν_0) ≤ δ·rms(ξ) (the identity coupling), and it scales with δ
    w0 = res["w2_initial"]
    np.testing.assert_allclose(w0[1] / w0[0], res["deltas"][1] / res["deltas"][0], rtol=0.05)


def test_experiment_configs_reject_bad_options():
    with pytest.raises(ValueError, match=r"option regimes: item 1 \('nope'\) must be one of zero, line"):
        experiments.get("gaussian-anisotropy").make_config(regimes=("zero", "nope"))
    with pytest.raises(ValueError, match="need dims >= 2"):
        experiments.get("rank-histograms").make_config(dims=(1,))
    with pytest.raises(ValueError, match="need .*deltas > 0"):
        experiments.get("stability").make_config(deltas=(0.1, -1.0))
