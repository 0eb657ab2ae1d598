"""solve() and layers(): invariants, convergence orders, jit/vmap/grad, bad input."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref

import transformer_pde as tp
from transformer_pde import _checks


def _random_attention(seed=0, d=3, beta=0.8):
    rng = np.random.default_rng(seed)
    Q, K, V = rng.normal(size=(2, d)), rng.normal(size=(2, d)), rng.normal(size=(d, d)) / 2
    return tp.SoftmaxAttention(Q, K, V, beta), (Q, K, V, beta)


def _x0(n=8, d=3, seed=1):
    return np.random.default_rng(seed).normal(size=(n, d))


@pytest.mark.slow
def test_sphere_stays_on_sphere_and_is_tangent():
    x0 = tp.uniform_sphere(jax.random.key(3), 16, 3)
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, beta=4.0))
    v = dyn.velocity(x0)
    np.testing.assert_allclose(jnp.sum(v * x0, axis=1), 0.0, atol=1e-14)
    ts = jnp.linspace(0.0, 100.0, 11)
    for solver in (diffrax.Euler(), diffrax.Tsit5()):
        sol = tp.solve(dyn, x0, t1=100.0, dt0=0.01, saveat=ts, solver=solver)  # 10^4 steps
        assert int(sol.num_steps) == 10_000
        norms = jnp.linalg.norm(sol.xs, axis=-1)
        assert float(jnp.max(jnp.abs(norms - 1.0))) < 1e-6


def _errors(dyn, x0, solver, dts, t1=1.0):
    reference = tp.solve(dyn, x0, t1=t1, dt0=1e-3, solver=diffrax.Tsit5()).final
    return [float(jnp.max(jnp.abs(tp.solve(dyn, x0, t1=t1, dt0=dt, solver=solver).final - reference)))
            for dt in dts]


@pytest.mark.parametrize("solver, order, dts", [
    (diffrax.Euler(), 1, [0.1, 0.05, 0.025, 0.0125]),
    (diffrax.Heun(), 2, [0.1, 0.05, 0.025, 0.0125]),
    (diffrax.Tsit5(), 5, [0.2, 0.1, 0.05]),
])
@pytest.mark.slow
def test_convergence_order_on_rd(solver, order, dts):
    attn, _ = _random_attention()
    errs = _errors(attn, jnp.asarray(_x0()), solver, dts)
    slope = np.polyfit(np.log(dts), np.log(errs), 1)[0]
    # Tsit5's leading error term is still settling at these steps (local slopes 5.5, 5.3)
    assert abs(slope - order) < (0.5 if order == 5 else 0.2), (slope, errs)


@pytest.mark.slow
def test_retraction_keeps_heun_second_order_on_sphere():
    x0 = tp.uniform_sphere(jax.random.key(0), 8, 3)
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, beta=2.0))
    dts = [0.1, 0.05, 0.025, 0.0125]
    errs = _errors(dyn, x0, diffrax.Heun(), dts, t1=2.0)
    slope = np.polyfit(np.log(dts), np.log(errs), 1)[0]
    assert abs(slope - 2) < 0.3, (slope, errs)


def test_layers_equal_euler_on_rd():
    attn, _ = _random_attention()
    x0 = _x0()
    lay = tp.layers(attn, x0, num_layers=20, step=0.05)
    sol = tp.solve(attn, x0, t1=1.0, dt0=0.05, solver=diffrax.Euler(), saveat=jnp.linspace(0, 1, 21))
    np.testing.assert_allclose(lay.ts, sol.ts, atol=1e-12)
    np.testing.assert_allclose(lay.xs, sol.xs, rtol=1e-11, atol=1e-12)


def test_layers_on_sphere_are_residual_layers_with_layer_norm():
    """Against a NumPy Transformer: x <- N(x + h P⊥Γ(x)) with per-layer V_l."""
    rng = np.random.default_rng(4)
    Q, K = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    Vs = rng.normal(size=(5, 3, 3))
    h = 0.2
    dyn = tp.Sphere(tp.SoftmaxAttention(Q, K, tp.PiecewiseConstant(Vs, dt=h), beta=1.5))
    x = np.asarray(tp.uniform_sphere(jax.random.key(1), 6, 3))
    out = tp.layers(dyn, x, num_layers=5, step=h)
    w = np.full(6, 1 / 6)
    for l in range(5):
        g = ref.softmax_field(x, x, w, Q, K, Vs[l], 1.5)
        g = g - np.sum(g * x, axis=1, keepdims=True) * x
        x = x + h * g
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        np.testing.assert_allclose(out.xs[l + 1], x, rtol=1e-11, atol=1e-12)
    euler = tp.solve(dyn, out.xs[0], t1=1.0, dt0=h, solver=diffrax.Euler())
    np.testing.assert_allclose(euler.final, x, rtol=1e-10, atol=1e-12)


def test_layers_save_a_statistic_instead_of_the_states():
    """fn(t, x, args) at every save_every-th layer, layer 0 included, against the NumPy layer map
    x <- N(x + h P⊥Γ(x)); no state is kept."""
    rng = np.random.default_rng(5)
    Q, K, V = (rng.normal(size=(3, 3)) for _ in range(3))
    h, n = 0.1, 7
    dyn = tp.Sphere(tp.SoftmaxAttention(Q, K, V, beta=1.2))
    x = np.asarray(tp.uniform_sphere(jax.random.key(2), n, 3))
    out = tp.layers(dyn, x, num_layers=6, step=h, save_every=2,
                    fn=lambda t, y, args: {"t": t, "mean": jnp.mean(y, axis=0), "top": jnp.argmax(y[:, 0])})
    assert out.xs is None and float(out.nonfinite_time) == np.inf
    w = np.full(n, 1 / n)
    for l in range(7):
        if l % 2 == 0:
            k = l // 2
            np.testing.assert_allclose(out.stats["mean"][k], x.mean(axis=0), rtol=1e-12, atol=1e-13)
            assert out.stats["top"][k] == np.argmax(x[:, 0])
            assert float(out.stats["t"][k]) == pytest.approx(l * h, abs=1e-14)
        g = ref.softmax_field(x, x, w, Q, K, V, 1.2)
        x = x + h * (g - np.sum(g * x, axis=1, keepdims=True) * x)
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    np.testing.assert_allclose(out.ts, h * np.arange(0, 7, 2), atol=1e-15)
    with pytest.raises(ValueError, match="layers fn must return arrays.*str"):
        tp.layers(dyn, x, num_layers=2, step=h, fn=lambda t, y, args: "mean")


def test_layers_report_non_finite_tokens_under_jit_and_vmap():
    """x' = e^{|x|²} x (USA unnormalized, Q = K = V = I) blows up at T = E1(|x0|²)/2: every way of
    calling layers reports it, with the statistic too (which no longer checks the tokens itself)."""
    usa = tp.UnnormalizedAttention.identity(2, 1.0)
    x0 = jnp.ones((3, 2)) / np.sqrt(2.0)
    frac = lambda t, y, args: tp.diagnostics.clustered_pair_fraction(y, 0.9)  # noqa: E731
    with pytest.raises(tp.NonFiniteStateError, match=r"by layer \d+ \(t = "):
        tp.layers(usa, x0, 200, 0.01, fn=frac)
    runtime_errors = (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError)  # jax.jit wraps equinox's
    with pytest.raises(runtime_errors, match="tokens became non-finite"):
        jax.jit(lambda x: tp.layers(usa, x, 200, 0.01).xs)(x0)
    with pytest.raises(runtime_errors, match="tokens became non-finite"):
        jax.vmap(lambda s: tp.layers(usa, s * x0, 200, 0.01, save_every=10, fn=frac).stats)(jnp.array([0.1, 1.0]))
    # finite runs pass, and report no time
    ok = jax.jit(lambda x: tp.layers(usa, x, 20, 0.01, fn=frac))(0.1 * x0)
    assert np.isinf(ok.nonfinite_time) and np.isfinite(ok.stats).all()
    # throw=False: which run blew up, when (the first save after T = E1(|x0|²)/2 ≈ 0.11 for
    # |x0| = 1: scipy.special.exp1(1)/2), the saves from there on inf, the others untouched
    sweep = jax.vmap(lambda s: tp.layers(usa, s * x0, 200, 0.01, save_every=10, throw=False))(jnp.array([0.1, 1.0]))
    t_bad = float(sweep.nonfinite_time[1])
    assert np.isinf(sweep.nonfinite_time[0]) and 0.1097 < t_bad <= 0.1097 + 0.1 + 1e-6
    k = int(round(t_bad / 0.1))
    assert np.isinf(sweep.xs[1, k:]).all() and np.isfinite(sweep.xs[1, :k]).all()
    np.testing.assert_array_equal(sweep.xs[0], tp.layers(usa, 0.1 * x0, 200, 0.01, save_every=10).xs)
    with pytest.raises(ValueError, match="fn must be a statistic fn.*got 3"):
        tp.layers(usa, x0, 2, 0.01, fn=3)


def test_layers_on_a_normalized_start_hold_no_runtime_check():
    """A traced start that is a normalization (tp.uniform_sphere, tp.normalize) needs no runtime
    check of |x_i| = 1 and, with throw=False, its NaN is the watch's (nonfinite_time = t0): such a
    program holds no host callback (JAX can keep it in its persistent cache). Any other traced
    start is still checked at run time, off the sphere or NaN."""
    dyn = tp.PostLN(tp.SoftmaxAttention.identity(2, 3.0))
    runtime_errors = (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError)

    def run(start, throw=False):
        return jax.jit(lambda k: tp.layers(dyn, start(k), 4, 0.1, throw=throw))

    key = jax.random.key(0)
    start = lambda k: tp.uniform_sphere(k, 5, 2)  # noqa: E731
    assert "callback" not in run(start).lower(key).as_text()
    np.testing.assert_allclose(run(start)(key).xs, tp.layers(dyn, start(key), 4, 0.1).xs, rtol=1e-13)  # eager
    # tp.normalize's output is marked too (its own checks of its input stay)
    marked = []
    jax.jit(lambda y: marked.append(_checks.has_unit_rows(tp.normalize(y))) or y)(jnp.ones((3, 2)))
    assert marked == [True]
    with pytest.raises(runtime_errors, match="must lie on the unit sphere"):
        run(lambda k: 2.0 * tp.uniform_sphere(k, 5, 2))(key)  # scaled: no longer a normalization
    nan_start = lambda k: tp.uniform_sphere(k, 5, 2).at[1, 0].set(jnp.nan)  # noqa: E731
    assert float(run(nan_start)(key).nonfinite_time) == 0.0
    with pytest.raises(runtime_errors, match="non-finite"):
        run(nan_start, throw=True)(key)


@pytest.mark.slow
def test_stats_saved_instead_of_states_and_weights():
    attn, _ = _random_attention()
    x0 = _x0(n=6)
    w = np.arange(1.0, 7.0) / 21.0
    ts = jnp.linspace(0.0, 1.0, 5)
    full = tp.solve(attn, tp.Particles(x0, w), t1=1.0, dt0=0.05, saveat=ts)
    mean = tp.solve(attn, tp.Particles(x0, w), t1=1.0, dt0=0.05,
                    saveat=diffrax.SaveAt(ts=ts, fn=lambda t, x, args: {"mean": w @ x, "t": t}))
    assert mean.xs is None
    np.testing.assert_allclose(mean.stats["mean"], jnp.einsum("n,tnd->td", w, full.xs), rtol=1e-12)
    np.testing.assert_allclose(mean.stats["t"], ts)
    # weights change the dynamics (they are the measure)
    uniform = tp.solve(attn, x0, t1=1.0, dt0=0.05)
    assert float(jnp.max(jnp.abs(uniform.final - full.final))) > 1e-3


def test_several_saves_each_at_its_own_times():
    """SaveAt(subs=[...]): statistics and states at their own times from one run, against the
    states of a plain run (with NumPy's mean), under vmap too; a Gaussian and a steps save refuse."""
    attn, _ = _random_attention()
    x0 = _x0(n=6)
    ts, few = jnp.linspace(0.0, 1.0, 5), jnp.asarray([0.25, 1.0])
    saveat = diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=ts, fn=lambda t, x, args: x.mean(axis=0)),
                                  diffrax.SubSaveAt(ts=few)])
    full = tp.solve(attn, x0, t1=1.0, dt0=0.05, saveat=ts)
    sol = tp.solve(attn, x0, t1=1.0, dt0=0.05, saveat=saveat)
    assert sol.xs is None and len(sol.ts) == len(sol.stats) == 2
    np.testing.assert_allclose(sol.ts[1], few)
    np.testing.assert_allclose(sol.stats[0], np.asarray(full.xs).mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(sol.stats[1], np.asarray(full.xs)[[1, 4]], rtol=1e-12)
    starts = np.stack([x0, _x0(n=6, seed=2)])
    means, states = jax.vmap(lambda x: tp.solve(attn, x, t1=1.0, dt0=0.05, saveat=saveat).stats)(starts)
    second = tp.solve(attn, starts[1], t1=1.0, dt0=0.05, saveat=few)
    np.testing.assert_allclose(states[1], second.xs, rtol=1e-12)
    assert means.shape == (2, 5, 3)
    with pytest.raises(ValueError, match=r"no SaveAt\(subs"):
        tp.solve(attn, tp.Gaussian(np.zeros(3), np.eye(3)), t1=1.0, saveat=saveat)
    with pytest.raises(ValueError, match="no t0, steps or dense"):
        tp.solve(attn, x0, t1=1.0, dt0=0.05, saveat=diffrax.SaveAt(subs=[diffrax.SubSaveAt(steps=True)]))


def test_adaptive_dopri5():
    attn, _ = _random_attention()
    x0 = jnp.asarray(_x0())
    ref_sol = tp.solve(attn, x0, t1=1.0, dt0=1e-3)
    sol = tp.solve(attn, x0, t1=1.0, dt0=0.1, solver=diffrax.Dopri5(),
                   stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10))
    np.testing.assert_allclose(sol.final, ref_sol.final, atol=1e-7)
    assert 5 < int(sol.num_steps) < 1000


class _Counting(tp.AbstractDynamics):
    inner: tp.SoftmaxAttention
    traces: list = eqx.field(static=True)

    @property
    def dim(self):
        return self.inner.dim

    def vector_field(self, x, w, t):
        self.traces.append(1)
        return self.inner.vector_field(x, w, t)


def test_compiled_once_per_shape():
    traces = []
    x0 = _x0()
    a1 = _Counting(tp.SoftmaxAttention.identity(3, beta=1.0), traces)
    tp.solve(a1, x0, t1=1.0, dt0=0.1)
    first = len(traces)
    assert first > 0
    a2 = _Counting(tp.SoftmaxAttention.identity(3, beta=3.0), traces)
    tp.solve(a2, tp.Particles(2 * x0, np.arange(1.0, 9.0) / 36), t1=1.2, dt0=0.1)
    assert len(traces) == first  # new values (x0, beta, weights, t1): no retrace


@pytest.mark.slow
def test_vmap_over_initial_data_and_beta():
    attn, _ = _random_attention()
    batch = jnp.asarray(np.random.default_rng(2).normal(size=(3, 8, 3)))
    run = lambda x: tp.solve(attn, x, t1=0.5, dt0=0.05).final  # noqa: E731
    np.testing.assert_allclose(jax.vmap(run)(batch), jnp.stack([run(x) for x in batch]), rtol=1e-12)

    x0 = tp.uniform_sphere(jax.random.key(0), 8, 3)

    def final(beta):
        return tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(3, beta)), x0, t1=0.5, dt0=0.05).final

    betas = jnp.asarray([0.5, 1.0, 4.0])
    np.testing.assert_allclose(jax.vmap(final)(betas), jnp.stack([final(float(b)) for b in betas]),
                               rtol=1e-12)


@pytest.mark.slow
def test_grad_matches_finite_differences():
    _, (Q, K, V, beta) = _random_attention(seed=3)
    x0 = _x0(n=5, seed=6)
    c = np.random.default_rng(9).normal(size=x0.shape)

    def loss(x0, Q, K, V, beta):
        attn = tp.SoftmaxAttention(Q, K, V, beta)
        return jnp.sum(c * tp.solve(tp.Sphere(attn), tp.normalize(x0), t1=1.0, dt0=0.05).final)

    args = tuple(jnp.asarray(a) for a in (x0, Q, K, V, beta))
    grads = jax.grad(loss, argnums=range(5))(*args)
    rng = np.random.default_rng(11)
    dirs = tuple(rng.normal(size=np.shape(a)) for a in args)
    eps = 1e-6
    plus = loss(*(a + eps * u for a, u in zip(args, dirs)))
    minus = loss(*(a - eps * u for a, u in zip(args, dirs)))
    fd = (plus - minus) / (2 * eps)
    analytic = sum(jnp.sum(g * u) for g, u in zip(grads, dirs))
    np.testing.assert_allclose(analytic, fd, rtol=1e-6)
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in grads)


def test_forward_mode_gradient_and_blowup_watch():
    """diffrax.ForwardMode (jax.jacfwd) through a solve on S²: the derivative in β is the reverse
    one (the default adjoint, checked against finite differences above) and a central difference;
    the blow-up watch stays on: x' = e^{|x|²} x blows up at T = E1(1)/2 (closed form)."""
    from scipy.special import exp1

    x0 = tp.normalize(_x0(n=6, seed=2))
    c = np.random.default_rng(4).normal(size=x0.shape)

    def loss(beta, adjoint=None):
        dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, beta))
        return jnp.sum(c * tp.solve(dyn, x0, t1=1.0, dt0=0.1, adjoint=adjoint).final)

    forward = jax.jacfwd(loss)(2.0, diffrax.ForwardMode())
    np.testing.assert_allclose(forward, jax.grad(loss)(2.0), rtol=1e-12)
    np.testing.assert_allclose(forward, (loss(2.0 + 1e-6) - loss(2.0 - 1e-6)) / 2e-6, rtol=1e-6)
    usa, one = tp.UnnormalizedAttention.identity(2, 1.0), jnp.array([[1.0, 0.0]])
    for watch in (tp.BlowUp(), tp.BlowUpAtSaves()):
        with pytest.raises(tp.NonFiniteStateError, match=r"at t = ") as info:
            tp.solve(usa, one, t1=1.0, dt0=1e-3, saveat=jnp.linspace(0, 1, 11), event=watch,
                     adjoint=diffrax.ForwardMode())
        t_reported = float(str(info.value).split("at t = ")[1].split(" ")[0])
        assert exp1(1.0) / 2 <= t_reported <= exp1(1.0) / 2 + 0.1  # the step's end, or the next save


def test_float32_run():
    x0 = tp.uniform_sphere(jax.random.key(0), 32, 3, dtype=jnp.float32)
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, beta=1.0, dtype=jnp.float32))
    sol = tp.solve(dyn, x0, t1=5.0, dt0=0.1, saveat=jnp.linspace(0, 5, 3))
    assert sol.xs.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(jnp.linalg.norm(sol.xs, axis=-1) - 1))) < 1e-5


@pytest.mark.package_errors
def test_bad_inputs():
    attn, _ = _random_attention()
    x0 = _x0()
    with pytest.raises(ValueError, match=r"t1 > t0, got t0=2.0 and t1=1.0"):
        tp.solve(attn, x0, t0=2.0, t1=1.0, dt0=0.1)
    with pytest.raises(ValueError, match=r"dt0 must be > 0, got -0.1"):
        tp.solve(attn, x0, t1=1.0, dt0=-0.1)
    with pytest.raises(ValueError, match=r"dt0 is required"):
        tp.solve(attn, x0, t1=1.0)
    bad = x0.copy()
    bad[2, 0] = np.nan
    with pytest.raises(ValueError, match=r"x0\[2, 0\] = nan"):
        tp.solve(attn, bad, t1=1.0, dt0=0.1)
    with pytest.raises(ValueError, match=r"saveat times must lie in \[t0, t1\]"):
        tp.solve(attn, x0, t1=1.0, dt0=0.1, saveat=jnp.array([0.0, 2.0]))
    with pytest.raises(ValueError, match=r"non-decreasing"):
        tp.solve(attn, x0, t1=1.0, dt0=0.1, saveat=jnp.array([0.5, 0.2]))
    with pytest.raises(ValueError, match=r"shape \(n, d\).*\(8,\)"):
        tp.solve(attn, x0[:, 0], t1=1.0, dt0=0.1)
    with pytest.raises(ValueError, match=r"weights must sum to 1"):
        tp.solve(attn, tp.Particles(x0, np.ones(8)), t1=1.0, dt0=0.1)
    with pytest.raises(ValueError, match=r"dynamics must be an attention"):
        tp.solve(lambda x: x, x0, t1=1.0, dt0=0.1)
    with pytest.raises(ValueError, match=r"adjoint must be .*got BacksolveAdjoint"):
        tp.solve(attn, x0, t1=1.0, dt0=0.1, adjoint=diffrax.BacksolveAdjoint())
    with pytest.raises(ValueError, match=r"num_layers must be >= 1, got 0"):
        tp.layers(attn, x0, 0, 0.1)
    with pytest.raises(ValueError, match=r"unit sphere"):
        tp.solve(tp.Sphere(attn), x0, t1=1.0, dt0=0.1)


class _ShowsNaN(tp.models.AbstractRetractedDynamics):
    """R^d drift x' = -x whose saves show the state divided by zero after t = 0.5 (what a save shows
    is the dynamics' retract_at): the integrated state stays finite, a save does not."""

    d: int = 2

    @property
    def dim(self):
        return self.d

    def vector_field(self, x, weights, t):
        return -x

    def retract_step(self, x, t0, t1):
        return x

    def retract_at(self, x, t):
        return jnp.where(t > 0.5, x / 0.0, x)


def test_a_nonfinite_save_of_a_finite_run_is_reported():
    x0 = jnp.ones((3, 2))
    with pytest.raises(tp.NonFiniteStateError, match=r"a saved state holds NaN or inf at t = 1 though the integrated"):
        tp.solve(_ShowsNaN(), x0, t1=1.0, dt0=0.1, saveat=jnp.asarray([0.0, 0.5, 1.0]))
    sol = tp.solve(_ShowsNaN(), x0, t1=1.0, dt0=0.1, saveat=jnp.asarray([0.0, 0.5, 1.0]), throw=False)
    assert bool(jnp.all(jnp.isfinite(sol.xs[:2]))) and not bool(jnp.all(jnp.isfinite(sol.xs[2])))
