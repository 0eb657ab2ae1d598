"""It never lies (issue 15): checks that survive jit, vmap and sweeps; values checked in the dtype
they are stored in; a checkpoint resumed only by the run that made it; integer arguments that
are integers; half-precision unit tokens."""

import subprocess
import sys

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.runs import Checkpoint, run_fingerprint, solve_checkpointed

X0 = tp.uniform_sphere(jax.random.key(0), 16, 3)
SA = tp.SoftmaxAttention.identity(3, 1.0)
RUNTIME_ERRORS = (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError)


# --- 1. checks that vanish under jit / vmap / sweeps ------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("read", ["xs", "final", "stats"])
def test_nonfinite_state_raises_under_jit_whatever_output_is_kept(read):
    usa = tp.UnnormalizedAttention.identity(3, 40.0)  # blows up in R^3 from these tokens
    saveat = diffrax.SaveAt(ts=jnp.linspace(0, 1, 3), fn=lambda t, x, args: jnp.mean(x))

    def run(x):
        if read == "stats":
            return tp.solve(usa, x, t1=1.0, dt0=0.01, saveat=saveat).stats
        sol = tp.solve(usa, x, t1=1.0, dt0=0.01)
        return sol.xs if read == "xs" else sol.final

    with pytest.raises(RUNTIME_ERRORS, match="became non-finite"):
        jax.block_until_ready(jax.jit(run)(X0 * 3.0))


@pytest.mark.slow
def test_sweep_over_a_bad_value_raises_instead_of_returning_inf():
    with pytest.raises(RUNTIME_ERRORS):
        tp.sweep(lambda beta: tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(3, beta)), X0, t1=1.0,
                                       dt0=0.1).xs[-1, 0, 0], {"beta": [1.0, float("inf")]})


@pytest.mark.parametrize("scale", [2.0, 0.5])
def test_sphere_checks_unit_norm_under_jit(scale):
    with pytest.raises(RUNTIME_ERRORS, match="must lie on the unit sphere"):
        jax.block_until_ready(jax.jit(lambda x: tp.Sphere(SA).velocity(x))(scale * X0))
    # the check costs nothing when it holds
    v = jax.jit(lambda x: tp.Sphere(SA).velocity(x))(X0)
    np.testing.assert_allclose(v, tp.Sphere(SA).velocity(X0), rtol=1e-12)


# --- 2. values checked in the dtype they are stored in ----------------------------------------


def test_finite_tokens_with_overflowing_scores_are_an_error():
    x32 = (X0 * 1e20).astype(jnp.float32)  # finite in float32, β⟨x, y⟩ = 1e40 is not
    eye = jnp.eye(3, dtype=jnp.float32)
    attn = tp.SoftmaxAttention(eye, eye, eye, 1.0)
    with pytest.raises(ValueError, match=r"non-finite velocity \(first at token 0\): the largest "
                                         r"\|x\|² = 1e\+40 is near the range of float32"):
        attn.velocity(x32)
    with pytest.raises(RUNTIME_ERRORS, match="near the range of float32"):
        jax.block_until_ready(jax.jit(lambda x: attn.velocity(x))(x32))
    with pytest.raises(ValueError, match="overflow"):
        tp.UnnormalizedAttention(eye, eye, eye, 1.0).velocity(x32)


def test_beta_that_overflows_float32_is_refused_at_construction():
    # the default precision (no x64): 1e39 is finite as a Python float, inf as float32
    code = ("import transformer_pde as tp\ntry:\n    tp.SoftmaxAttention.identity(3, 1e39)\n"
            "except ValueError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "SoftmaxAttention.beta=1e+39 overflows float32" in out.stdout


# --- 3. a checkpoint is resumed only by the run that made it ----------------------------------


@pytest.fixture()
def checkpointed(tmp_path):
    ts = jnp.linspace(0.0, 1.0, 5)
    ck = Checkpoint(tmp_path, every=2)
    dyn = tp.Sphere(SA)
    first = solve_checkpointed(dyn, X0, t1=1.0, dt0=0.1, saveat=ts, checkpoint=ck)
    return dyn, ts, ck, first


@pytest.mark.parametrize("change", ["beta", "permuted-x0", "weights", "solver", "controller", "dt0",
                                    "value-matrix"])
def test_checkpoint_refuses_any_other_run(checkpointed, change):
    dyn, ts, ck, _ = checkpointed
    kw = dict(t1=1.0, dt0=0.1, saveat=ts, checkpoint=ck)
    x0 = X0
    if change == "beta":
        dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.5))
    elif change == "permuted-x0":
        x0 = X0[::-1]  # same shape, dtype and sum: the old identity could not tell
    elif change == "weights":
        kw["weights"] = jnp.arange(1.0, 17.0) / 136.0  # solve_checkpointed's own argument
    elif change == "solver":
        kw["solver"] = diffrax.Heun()
    elif change == "controller":
        kw["stepsize_controller"] = diffrax.PIDController(rtol=1e-4, atol=1e-6)
    elif change == "dt0":
        kw["dt0"] = 0.05
    else:
        V = jnp.eye(3).at[0, 1].set(0.1)
        dyn = tp.Sphere(tp.SoftmaxAttention(jnp.eye(3), jnp.eye(3), V, 1.0))
    with pytest.raises(ValueError, match=r"belongs to a different run \(mismatch in \[.*'run'"):
        solve_checkpointed(dyn, x0, **kw)


def test_checkpoint_resumes_the_same_run(checkpointed):
    dyn, ts, ck, first = checkpointed
    again = solve_checkpointed(tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0)), X0, t1=1.0, dt0=0.1,
                               saveat=ts, checkpoint=ck)
    np.testing.assert_array_equal(again.xs, first.xs)


def test_fingerprint_sees_bits_and_static_configuration():
    a = run_fingerprint(SA, X0)
    assert a == run_fingerprint(tp.SoftmaxAttention.identity(3, 1.0), jnp.array(X0))
    assert a != run_fingerprint(SA, X0.at[3, 1].set(np.nextafter(X0[3, 1], 2.0)))  # one ulp
    assert a != run_fingerprint(tp.Causal(tp.SoftmaxAttention.identity(3, 1.0)), X0)
    assert a != run_fingerprint(SA, X0.astype(jnp.float32))


# --- 5. integer arguments ---------------------------------------------------------------------


@pytest.mark.package_errors
@pytest.mark.parametrize("thunk, match", [
    (lambda: tp.solve(SA, X0, t1=1.0, dt0=1e-30), r"dt0=1e-30 .* needs 1e\+30 constant steps, more than "
                                                   r"2147483647"),
    (lambda: tp.solve(SA, X0, t1=1.0, dt0=0.1, max_steps=2**40), r"max_steps=1099511627776 exceeds"),
    (lambda: tp.layers(tp.Sphere(SA), X0, 2.5, 0.1), r"num_layers must be an integer, got 2.5"),
    (lambda: tp.layers(tp.Sphere(SA), X0, 4, 0.1, save_every=2.0), r"save_every must be an integer, got 2.0"),
    (lambda: tp.SinkhornAttention.identity(3, max_iterations=2.7),
     r"SinkhornAttention.max_iterations must be an integer, got 2.7"),
    (lambda: tp.solve(SA, X0, t1=1.0, dt0=0.1, max_steps=10.0), r"max_steps must be an integer, got 10.0"),
])
def test_integer_arguments(thunk, match):
    with pytest.raises(ValueError, match=match):
        thunk()


# --- half precision on the sphere ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_unit_tokens_are_accepted(dtype):
    x = tp.normalize(X0).astype(dtype)
    assert np.abs(np.linalg.norm(np.asarray(x, np.float64), axis=-1) - 1).max() > 1e-4  # rounding is real
    assert tp.Sphere(SA).check_state(x).dtype == dtype
    with pytest.raises(ValueError, match="must lie on the unit sphere"):
        tp.Sphere(SA).check_state((1.2 * x).astype(dtype))


# --- 4. diagnostics validate their inputs -------------------------------------------------------


@pytest.mark.parametrize("cov, smallest", [(jnp.diag(jnp.array([1.0, -1.0])), "-1"),
                                           (jnp.array([[1.0, 2.0], [2.0, 1.0]]), "-1"),
                                           (jnp.diag(jnp.array([1.0, jnp.nan])), None)])
def test_bures_wasserstein_refuses_indefinite_or_nonfinite_covariances(cov, smallest):
    why = ("a finite covariance, got non-finite entries" if smallest is None
           else f"positive semi-definite, but its smallest eigenvalue is {smallest}")
    with pytest.raises(ValueError, match=f"cov1 must be {why}"):
        tp.diagnostics.bures_wasserstein(jnp.zeros(2), cov, jnp.zeros(2), jnp.eye(2))
    with pytest.raises(RUNTIME_ERRORS, match="cov2 must be (positive semi-definite|symmetric and finite)"):
        jax.block_until_ready(jax.jit(tp.diagnostics.bures_wasserstein)(jnp.zeros(2), jnp.eye(2),
                                                                        jnp.zeros(2), cov))


def test_every_covariance_input_takes_one_rule():
    """tp.Gaussian, bures_wasserstein, sinkhorn_conditional_cov and the Gaussian theory check a
    covariance alike (``_checks.check_covariance``): a rank-one float32 Σ = vvᵀ, whose smallest
    eigenvalue is rounding (NumPy's float64 eigvalsh of the same entries: |λ_min| <= 1e-6),
    is a valid semi-definite covariance but refused where the inverse is taken; an asymmetry of
    1e-2 is refused everywhere, concrete and under jit."""
    from transformer_pde.theory.gaussian import (identity_value_blowup_time, identity_value_cov,
                                                 sinkhorn_conditional_cov)

    v = np.array([0.3, -1.2, 0.7], np.float32)
    rank_one = np.outer(v, v).astype(np.float32)
    assert abs(np.linalg.eigvalsh(rank_one.astype(np.float64))[0]) <= 1e-6
    mean, A = np.zeros(3, np.float32), 0.1 * np.eye(3, dtype=np.float32)
    # semi-definite: accepted (the distance to itself is 0; the theory's blow-up time is finite)
    assert float(tp.diagnostics.bures_wasserstein(mean, rank_one, mean, rank_one)) < 1e-3
    assert np.isfinite(np.asarray(sinkhorn_conditional_cov(rank_one, A))).all()
    assert np.isfinite(float(identity_value_blowup_time(rank_one, A)))
    # definite: refused, naming the eigenvalue
    with pytest.raises(ValueError, match="Gaussian.cov must be positive definite, but its smallest eigenvalue"):
        tp.Gaussian(mean, rank_one)
    with pytest.raises(ValueError, match="cov0 must be positive definite, but its smallest eigenvalue"):
        identity_value_cov(rank_one, A, 0.5)
    skew = np.eye(3) + np.diag([1e-2, 0.0], k=1)
    for call, name in ((lambda c: tp.Gaussian(np.zeros(3), c), "Gaussian.cov"),
                       (lambda c: tp.diagnostics.bures_wasserstein(np.zeros(3), c, np.zeros(3), np.eye(3)), "cov1"),
                       (lambda c: sinkhorn_conditional_cov(c, np.eye(3)), "cov")):
        with pytest.raises(ValueError, match=rf"{name} must be symmetric, but max\|cov - cov.T\| = 0.01"):
            call(skew)
        with pytest.raises(RUNTIME_ERRORS, match=f"{name} must be symmetric and finite"):
            jax.block_until_ready(jax.tree.leaves(jax.jit(call)(jnp.asarray(skew))))
    with pytest.raises(ValueError, match="cov0 must be symmetric"):
        identity_value_blowup_time(skew, np.eye(3))
    # a batch is checked matrix by matrix: a large covariance beside it loosens nothing
    batch = np.stack([1e4 * np.eye(2), np.diag([1.0, -1e-4])])
    with pytest.raises(ValueError, match="cov1 must be positive semi-definite, but its smallest eigenvalue is -0.0001"):
        tp.diagnostics.bures_wasserstein(np.zeros((2, 2)), batch, np.zeros((2, 2)), batch[::-1])
    with pytest.raises(RUNTIME_ERRORS, match="cov1 must be positive semi-definite"):
        jax.block_until_ready(jax.jit(tp.diagnostics.bures_wasserstein)(np.zeros((2, 2)), batch, np.zeros((2, 2)),
                                                                        np.stack([np.eye(2)] * 2)))


def test_unconverged_sinkhorn_is_reported_not_returned():
    y = tp.uniform_sphere(jax.random.key(1), 16, 3)
    with pytest.raises(RUNTIME_ERRORS, match="did not converge within max_iterations=5"):
        jax.block_until_ready(tp.diagnostics.sinkhorn_wasserstein(X0, y, epsilon=1e-4, max_iterations=5))
    approx = tp.diagnostics.sinkhorn_wasserstein(X0, y, epsilon=1e-4, max_iterations=5, throw=False)
    assert np.isfinite(float(approx))  # asked for, it is returned


@pytest.mark.parametrize("a, match", [(-jnp.ones(16) / 16, "a must be non-negative"),
                                      (jnp.ones(16) / 8, "a must sum to 1"),
                                      (jnp.full(16, jnp.nan), "a must be finite")])
def test_sinkhorn_weights_are_validated(a, match):
    with pytest.raises(ValueError, match=match):
        tp.diagnostics.sinkhorn_wasserstein(X0, X0, a, epsilon=0.1)


# --- 9. a float32 Gaussian closure near its blow-up reports the blow-up -------------------------


@pytest.mark.slow
@pytest.mark.parametrize("throw", [True, False])
def test_float32_gaussian_blowup_is_reported_with_adaptive_steps(throw):
    attn = tp.SoftmaxAttention.identity(2, 1.0)  # V = I: t* = 1/λmax(A + Aᵀ) = 1/2 from Σ0 = I
    g = tp.Gaussian(jnp.zeros(2, jnp.float32), jnp.eye(2, dtype=jnp.float32))
    sol = tp.solve(attn, g, t1=1.0, dt0=0.01, throw=throw,
                   stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8))
    assert bool(sol.blew_up)
    # Σ(t) = Σ0/(1 − 2t): tr Σ crosses 8.4e3·tr Σ0 at t = t*(1 − 1.2e-4)
    assert abs(float(sol.blowup_time) - 0.5) < 1e-4


@pytest.mark.parametrize("call, match", [
    (lambda x: tp.diagnostics.cluster_count(x), r"x must be finite, but x\[7, 1\] = nan"),
    (lambda x: tp.diagnostics.cluster_labels(x), r"x must be finite"),
    (lambda x: tp.diagnostics.clustered_pair_fraction(x), r"x must be finite"),
    (lambda x: tp.diagnostics.cluster_count(jnp.nan_to_num(x), float("nan")), r"threshold must be finite"),
    (lambda x: tp.diagnostics.cluster_masses(jnp.nan_to_num(x), weights=-jnp.ones(8) / 8),
     r"weights must be non-negative"),
    (lambda x: tp.diagnostics.cluster_masses(jnp.nan_to_num(x), weights=jnp.ones(8) / 4),
     r"weights must sum to 1"),
])
def test_cluster_diagnostics_refuse_nan_tokens_and_bad_weights(call, match):
    # 8 equal tokens with one NaN coordinate: once counted as 2 clusters
    x = jnp.tile(jnp.array([[0.0, 1.0, 0.0]]), (8, 1)).at[7, 1].set(jnp.nan)
    with pytest.raises(ValueError, match=match):
        call(x)
    with pytest.raises(RUNTIME_ERRORS, match="x must be finite"):
        jax.block_until_ready(jax.jit(lambda y: tp.diagnostics.cluster_count(y))(x))
