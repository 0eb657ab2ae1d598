"""Issue 14, items 3–4: the `normalization` experiment, the layer scheme of `clustering` and
`phase-diagram`, and the published runs of the authors' post-LN scheme.

The `normalization` statistics are recomputed here from the experiment's draws with plain NumPy
layer maps (the architectures written out, not the library's (F, R) pairs); the published runs
are checked against their published numbers (NOTES.md §9, sphere.md §10–11) and against a NumPy
loop of the authors' layer to round-off.
"""

import numpy as np
import pytest
from _runs import tiny_run

import transformer_pde as tp
from transformer_pde.experiments import get
from transformer_pde.experiments.normalization import draws

# ---------------------------------------------------------------------------------------------
# plain NumPy: multi-head softmax attention (heads averaged, V = I) and the seven layers
# ---------------------------------------------------------------------------------------------


def np_normalize(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def np_attention(y, Q, K, beta, causal):
    """(1/H) Σ_h Σ_j softmax_j(β⟨Q_h y_i, K_h y_j⟩) y_j, over j <= i when causal."""
    n = y.shape[0]
    out = np.zeros_like(y)
    for Qh, Kh in zip(Q, K):
        s = beta * (y @ Qh.T) @ (y @ Kh.T).T
        if causal:
            s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out += (p / p.sum(axis=1, keepdims=True)) @ y
    return out / len(Q)


def np_layers(name, x, A, L, h, *, alpha=0.2, fraction=0.25):
    """The L + 1 states of a scheme, each layer as its architecture writes it."""
    xs = [x]
    k_post = int(np.floor(fraction * L))
    for l in range(L):
        if name == "post-ln" or (name == "mix-ln" and l < k_post):
            x = np_normalize(x + h * A(x))
        elif name == "projected":
            a = A(x)
            x = np_normalize(x + h * (a - np.sum(x * a, -1, keepdims=True) * x))
        elif name in ("pre-ln", "mix-ln"):
            x = x + h * A(np_normalize(x))
        elif name == "peri-ln":
            x = x + h * np_normalize(A(np_normalize(x)))
        elif name == "ngpt":
            x = np_normalize(x + alpha * h * (np_normalize(A(x)) - x))
        elif name == "ln-scaling":
            x = x + h * A(np_normalize(x) / np.sqrt(l + 1))
        xs.append(x)
    return np.array(xs)


def np_statistics(xs, h, threshold):
    theta = np_normalize(xs)
    n = xs.shape[1]
    gram = np.einsum("lid,ljd->lij", theta, theta) > threshold
    fraction = (gram.sum(axis=(1, 2)) - np.trace(gram, axis1=1, axis2=2)) / (n * (n - 1))
    speed = np.concatenate([[np.nan], np.linalg.norm(np.diff(theta, axis=0), axis=-1).mean(-1) / h])
    return fraction, speed, np.linalg.norm(xs, axis=-1).mean(-1)


def check_against_numpy(res, cfg):
    x0, Q, K = draws(cfg)
    for s, name in enumerate(cfg.schemes):
        for b, beta in enumerate(cfg.betas):
            for c, mask in enumerate(cfg.masks):
                per_draw = [np_statistics(np_layers(name, x0[k], lambda y: np_attention(y, Q[k], K[k], beta,
                                                                                        mask == "causal"),
                                                    cfg.num_layers, cfg.step, alpha=cfg.ngpt_alpha,
                                                    fraction=cfg.mix_fraction), cfg.step, cfg.threshold)
                            for k in range(cfg.seeds)]
                for key, values in zip(("fraction", "speed", "radius"), zip(*per_draw)):
                    np.testing.assert_allclose(res[key][s, b, c], np.mean(values, axis=0), rtol=0, atol=1e-12,
                                               err_msg=f"{key}, {name}, β={beta}, mask={mask}")


# ---------------------------------------------------------------------------------------------
# normalization
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_run("normalization", tmp_path_factory)


@pytest.mark.slow
def test_normalization_tiny_matches_numpy_layers(tiny):
    """Every scheme, β and statistic of the tiny run, recomputed draw by draw with NumPy."""
    res, cfg, run_dir = tiny
    assert list(res["schemes"]) == list(cfg.schemes) == list(get("normalization").config().schemes)
    check_against_numpy(res, cfg)
    depth = res.grids["depth"]
    assert depth["fraction"].dims == ("scheme", "beta", "causal", "layer")
    np.testing.assert_array_equal(depth["speed"].sel(scheme="ngpt", beta=9.0, causal=False).values,
                                  res["speed"][list(cfg.schemes).index("ngpt"), 1, 0])
    assert np.allclose(depth["t"].values, cfg.step * np.arange(cfg.num_layers + 1))
    assert (run_dir / "normalization_none.png").exists()


@pytest.mark.slow
def test_normalization_speed_regulation_bounds(tiny):
    """Bounds that hold layer by layer: the sphere schemes keep |x| = 1; nGPT's step is the post-type
    step α_h/(1 − α_h) of a unit field, so its tokens move at most α/(1 − αh) per unit depth."""
    res, cfg, _ = tiny
    names = list(cfg.schemes)
    for name in ("post-ln", "projected", "ngpt"):
        np.testing.assert_allclose(res["radius"][names.index(name)], 1.0, atol=1e-12)
    ngpt = res["speed"][names.index("ngpt"), ..., 1:]
    assert np.all(ngpt <= cfg.ngpt_alpha / (1 - cfg.ngpt_alpha * cfg.step) + 1e-12)
    # LN-scaling feeds N(x)/√ℓ to the attention: its speed falls below Pre-LN's after the first layer
    pre, lns = (res["speed"][names.index(n), ..., 2:] for n in ("pre-ln", "ln-scaling"))
    assert np.all(lns < pre)


@pytest.mark.slow
def test_normalization_causal_mask_matches_numpy():
    exp = get("normalization")
    cfg = exp.make_config(**{**exp.tiny, "masks": ("causal",), "schemes": ("pre-ln", "mix-ln")})
    res = exp.compute(cfg)
    assert res["causal"].tolist() == [True]
    check_against_numpy(res, cfg)


@pytest.mark.slow
def test_normalization_post_ln_clusters_by_t20_and_pre_ln_does_not():
    """The published set-up (d = 16, n = 64, 8 heads averaged, V = I, h = 0.1): post-LN → 1.00
    clustered at t = 20 for β = 1, 5, 9 (sphere.md §11, the check). Pre-LN's radius grows and its
    tokens slow down: hardly a clustered pair by t = 20 (the authors' public 0.42/0.29/0.20 use a
    coordinate-sum radius, not this model)."""
    exp = get("normalization")
    cfg = exp.make_config(schemes=("post-ln", "pre-ln"), masks=("none",), t1=20.0, seeds=4)
    res = exp.compute(cfg)
    post, pre = res["fraction"][:, :, 0, -1]
    assert np.all(post > 0.99), post
    assert np.all(pre < 0.1), pre
    speed, radius = res["speed"][1, :, 0], res["radius"][1, :, 0]
    assert np.all(radius[:, -1] > 3) and np.all(speed[:, -1] < speed[:, 10] / 10)


@pytest.mark.slow
def test_normalization_reproduces_the_authors_post_ln_and_ngpt():
    """The authors' published P(clustered pair) at t = 20 for the two schemes their code models as
    here (sphere.md §11): post-LN 1.00 and nGPT 0.28/0.03/0.01 at β = 1/5/9. Their nGPT layer
    θ ← N(θ + 0.2hÂ) is ours with αh/(1 − αh) = 0.2h, α = 0.2/1.02 (the module docstring)."""
    exp = get("normalization")
    cfg = exp.make_config(schemes=("post-ln", "ngpt"), masks=("none",), t1=20.0, seeds=16, ngpt_alpha=0.2 / 1.02)
    res = exp.compute(cfg)
    post, ngpt = res["fraction"][:, :, 0, -1]
    assert np.all(post > 0.99), post
    sem = res["fraction_sem"][1, :, 0, -1]
    np.testing.assert_array_less(np.abs(ngpt - [0.28, 0.03, 0.01]), 3 * sem + 0.005)


def test_normalization_config_rejects_bad_values():
    exp = get("normalization")
    with pytest.raises(ValueError, match="whole number of layers"):
        exp.make_config(t1=1.05)
    with pytest.raises(ValueError, match="schemes lists 'pre-ln' twice"):
        exp.make_config(schemes=("pre-ln", "pre-ln"))
    with pytest.raises(ValueError, match="ngpt_alpha"):
        exp.make_config(ngpt_alpha=20.0)
    with pytest.raises(ValueError, match=r"schemes: item 1 \('rms'\) must be one of"):
        exp.make_config(schemes=("pre-ln", "rms"))


def test_normalization_draws_have_unit_variance_scores():
    """KᵀQ per head = G₁ᵀG₂/√d: entries of mean 0 and variance 1 (the authors' randomKQ=1)."""
    cfg = get("normalization").make_config(seeds=50)
    x0, Q, K = draws(cfg)
    np.testing.assert_allclose(np.linalg.norm(x0, axis=-1), 1.0, atol=1e-14)
    kq = np.einsum("shkd,shke->shde", K, Q)
    assert abs(kq.mean()) < 0.02 and abs(kq.var() - 1) < 0.05


# ---------------------------------------------------------------------------------------------
# the authors' post-LN in clustering and phase-diagram: the published runs to round-off
# ---------------------------------------------------------------------------------------------


def np_post_ln(x, field, h, L, projected=False):
    for _ in range(L):
        a = field(x)
        if projected:
            a = a - np.sum(x * a, -1, keepdims=True) * x
        x = np_normalize(x + h * a)
    return x


@pytest.mark.slow
def test_five_token_circle_movie(tmp_path):
    """GKPR kinetic.py: n = 5, d = 2, SA, β = 4, h = 0.1, 4000 post-LN layers from their z0 →
    final angle 105.52°, merges at t = 1.4, 2.6, 5.7 and last at 364.1 (NOTES.md §9)."""
    from transformer_pde.experiments.clustering import KINETIC_Z0

    exp = get("clustering")
    cfg = exp.make_config(start="kinetic", n=5, d=2, beta=4.0, t1=400.0, dt=0.1, models=("SA",),
                          scheme="post-ln", solver="euler", num_saves=4001, animate=False)
    res = exp.compute(cfg, False, checkpoint=tp.runs.Checkpoint(tmp_path, every=4000))  # one chunk
    xs, counts, ts = res["xs_SA"], res["clusters_SA"], res["ts"]
    angle = np.degrees(np.arctan2(xs[-1, :, 1], xs[-1, :, 0]))
    assert np.ptp(angle) < 1e-10 and round(float(angle.mean()), 2) == 105.52
    merges = [round(float(ts[l]), 1) for l in range(1, len(ts)) if counts[l] != counts[l - 1]]
    assert merges == [1.4, 2.6, 5.7, 364.1] and counts[-1] == 1

    def sa(y):
        s = 4.0 * y @ y.T
        p = np.exp(s - s.max(axis=1, keepdims=True))
        return (p / p.sum(axis=1, keepdims=True)) @ y

    z0 = np_normalize(KINETIC_Z0)
    np.testing.assert_allclose(xs[0], z0, atol=1e-15)
    np.testing.assert_allclose(xs[500], np_post_ln(z0, sa, 0.1, 500), atol=1e-11)


@pytest.mark.slow
def test_usa_64_tokens_post_ln_vs_projected():
    """USA, β = 4, h = 0.1, d = 3, n = 64, t = 15 (150 layers, raw step): the authors' post-LN
    leaves 2 clusters, the projected layer many (NOTES.md §9: 2 in 9/10 seeds vs 7–24); both
    equal a NumPy loop of their layer to round-off."""
    import jax

    exp = get("clustering")
    counts = {}
    for scheme in ("post-ln", "projected"):
        counts[scheme] = []
        for seed in range(5):
            cfg = exp.make_config(n=64, d=3, beta=4.0, t1=15.0, dt=0.1, models=("USA",), scheme=scheme,
                                  solver="euler", usa_step="raw", num_saves=4, seed=seed, animate=False)
            res = exp.compute(cfg, False)
            counts[scheme].append(int(res["clusters_USA"][-1]))
            if seed == 0:
                x0 = np.asarray(tp.uniform_sphere(jax.random.key(seed), 64, 3))
                ref = np_post_ln(x0, lambda y: np.exp(4.0 * y @ y.T) @ y / 64, 0.1, 150, scheme == "projected")
                np.testing.assert_allclose(res["xs_USA"][-1], ref, atol=1e-12)
    assert max(counts["post-ln"]) <= 2, counts
    assert min(counts["projected"]) >= 7 and np.median(counts["projected"]) >= 12, counts


def test_clustering_scheme_and_solver_options():
    exp = get("clustering")
    assert exp.make_config().scheme == "projected" and exp.make_config().solver == "tsit5"
    assert get("phase-diagram").make_config().scheme == "post-ln"  # the authors' layer, as before
    with pytest.raises(ValueError, match="five tokens on the circle"):
        exp.make_config(start="kinetic")
    with pytest.raises(ValueError, match="must fall on layers of USA's step"):
        exp.make_config(solver="euler", t1=15.0, num_saves=16)  # USA's rescaled step
    with pytest.raises(ValueError, match="must fall on layers of SA's step"):
        exp.make_config(solver="euler", models=("SA",), t1=15.0, num_saves=61)  # saves every 0.25


def test_depth_statistics_in_batches_of_draws_match_numpy():
    """The statistics computed a few draws at a time (11 draws: one full batch and a remainder)
    against plain NumPy on the whole array: P(⟨θ_i, θ_j⟩ > threshold) over ordered pairs i ≠ j,
    the speed mean_i |θ_i(l) − θ_i(l−1)|/h and the mean radius."""
    import jax.numpy as jnp

    from transformer_pde.experiments.normalization import STATISTICS_BATCH, depth_statistics

    rng = np.random.default_rng(0)
    S, L1, n, d, h, thr = STATISTICS_BATCH + 3, 5, 6, 3, 0.1, 0.5
    xs = rng.standard_normal((S, L1, n, d)) * rng.uniform(0.5, 2.0, (S, L1, n, 1))
    frac, speed, radius, bad = (np.asarray(a) for a in depth_statistics(jnp.asarray(xs), h, thr))
    assert not bad.any()
    r = np.linalg.norm(xs, axis=-1)
    th = xs / r[..., None]
    gram = np.einsum("slid,sljd->slij", th, th)
    off = ~np.eye(n, dtype=bool)
    np.testing.assert_allclose(frac, (gram[..., off] > thr).sum(-1) / (n * (n - 1)), atol=1e-15)
    np.testing.assert_allclose(speed[:, 1:], np.linalg.norm(np.diff(th, axis=1), axis=-1).mean(-1) / h, rtol=1e-12)
    assert np.isnan(speed[:, 0]).all()
    np.testing.assert_allclose(radius, r.mean(-1), rtol=1e-12)
    # a zero token has no direction: flagged for its draw only (a NaN the statistics cannot see)
    xs[STATISTICS_BATCH + 1, 2, 3] = 0.0
    np.testing.assert_array_equal(np.asarray(depth_statistics(jnp.asarray(xs), h, thr)[3]),
                                  np.arange(S) == STATISTICS_BATCH + 1)


def test_normalization_second_compute_compiles_nothing():
    """A second ``compute`` with the same config in one process reuses its programs: no XLA
    compilation (a fresh jitted closure per call compiled every scheme's states again)."""
    import jax

    exp = get("normalization")
    cfg = exp.make_config(schemes=("post-ln", "ngpt"), masks=("none", "causal"), seeds=2, t1=0.5, betas=(1.0, 5.0))
    first = exp.compute(cfg, False)
    compiles = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        second = exp.compute(cfg, False)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiles == []
    np.testing.assert_array_equal(second["fraction"], first["fraction"])


def test_normalization_checks_its_draws_and_reports_non_finite_runs():
    """The states' program holds no runtime check (so it can be kept): the draws are checked
    before it (finite, unit starts), and a NaN it reports as a value is raised naming the scheme,
    mask, β and draw."""
    from transformer_pde.experiments.normalization import check_draws, raise_if_nonfinite

    cfg = get("normalization").make_config(seeds=3, n=4, d=3, heads=2)
    x0, Q, K = draws(cfg)
    check_draws(x0, Q, K, np.float32)
    Q[1, 0, 2, 1] = np.nan
    with pytest.raises(ValueError, match=r"the draw Q holds NaN or inf at \(1, 0, 2, 1\)"):
        check_draws(x0, Q, K, np.float32)
    with pytest.raises(ValueError, match=r"the start x0\[2, 3\] is off the unit sphere by 0.01"):
        check_draws(x0 * np.where(np.arange(4) == 3, 1.01, 1.0)[:, None] * (np.arange(3) == 2)[:, None, None]
                    + x0 * (np.arange(3) != 2)[:, None, None], K, K, np.float32)
    with pytest.raises(ValueError, match=r"option betas: item 1 \(inf\) must be finite"):  # trusted by the program
        get("normalization").make_config(betas=(1.0, float("inf")))
    never = np.full(3, np.inf)
    raise_if_nonfinite(never, np.zeros(3, bool), "ngpt", "causal", 5.0)
    with pytest.raises(tp.NonFiniteStateError, match=r"scheme ngpt, mask causal, beta = 5: the tokens became non-finite \(NaN or inf\) by t = 2.5 "
                                                   r"at draw = 1 \(2 of 3 runs\)"):
        raise_if_nonfinite(np.array([np.inf, 2.5, 1.0]), np.zeros(3, bool), "ngpt", "causal", 5.0)
    with pytest.raises(tp.NonFiniteStateError, match="draw 2 reached a zero token"):
        raise_if_nonfinite(never, np.array([False, False, True]), "pre-ln", "none", 1.0)
