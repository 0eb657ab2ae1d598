"""Fast-kernel plans have a memory budget (issue 25, cause 1): a plan is sized before anything is
allocated, refused above ``max_plan_bytes`` by ``Fast`` (a ValueError naming the sizes, β and the
budget) and avoided by ``Auto`` (the exact kernel); an infinite radius and Q = K = 0 are handled.

Each test is a fraction of a second: the refused plans are never built (β = 10⁴ needs 421³ modes
on an 864³ grid, ~15 GiB, which used to hang while the memory grew)."""

import math
import time

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("jax_finufft")

import reference  # noqa: E402

import transformer_pde as tp  # noqa: E402
from transformer_pde.kernels import Auto, Exact, Fast  # noqa: E402
from transformer_pde.kernels.fast import (  # noqa: E402
    PLAN_MEMORY_BUDGET,
    PlanTooLarge,
    plan_gaussian_sum,
    plan_memory_bytes,
)


def _tokens(n, d=3, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d))
    return jnp.asarray(x / np.linalg.norm(x, axis=1, keepdims=True))


def test_fast_refuses_a_huge_plan_when_built_naming_sizes_beta_and_budget():
    t0 = time.perf_counter()
    with pytest.raises(PlanTooLarge) as err:
        tp.SoftmaxAttention.identity(3, 1e4, backend=Fast())
    assert time.perf_counter() - t0 < 2.0  # nothing allocated, no search over 10⁶ modes
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "beta=10000" in msg and "421^3 modes" in msg and "864^3 grid" in msg
    assert "budget of 1 GiB" in msg and "max_plan_bytes" in msg
    # astronomically large: refused from the predicted size, before the mode search
    t0 = time.perf_counter()
    with pytest.raises(PlanTooLarge):
        tp.SoftmaxAttention.identity(3, 1e14, backend=Fast())
    assert time.perf_counter() - t0 < 2.0


def test_budget_is_the_plans_memory_and_can_be_raised():
    plan = plan_gaussian_sum(1.0, 1.0, 3, 1e-8, "float64")
    need = plan_memory_bytes(plan.modes, plan.fine_grid, 3, "float64", value_width=3)
    # the grid alone (fine^k complex128 numbers per channel pair, two pairs for 1 + 3 channels)
    # is a lower bound of the estimate
    assert need >= 2 * 16 * plan.fine_grid**3
    assert plan_gaussian_sum(1.0, 1.0, 3, 1e-8, "float64", max_bytes=need, value_width=3) == plan
    with pytest.raises(PlanTooLarge, match="budget"):
        plan_gaussian_sum(1.0, 1.0, 3, 1e-8, "float64", max_bytes=need - 1, value_width=3)
    # on the backend: a small budget refuses β = 1, a larger one admits β = 10⁴'s ~15 GiB plan
    # as far as planning goes (nothing is run here)
    with pytest.raises(PlanTooLarge, match="beta=1:"):
        tp.SoftmaxAttention.identity(3, 1.0, backend=Fast(max_plan_bytes=1e4))
    big = tp.SoftmaxAttention.identity(3, 1e4, backend=Fast(max_plan_bytes=64 * 2**30))
    assert big.kernel_choice(10, 10, jnp.float64).plan.modes == 421
    assert PLAN_MEMORY_BUDGET == 2**30
    with pytest.raises(ValueError, match="max_plan_bytes"):
        Fast(max_plan_bytes=0)


def test_auto_takes_the_exact_kernel_over_budget():
    x = _tokens(40)
    attn = tp.SoftmaxAttention.identity(3, 1e4, backend=Auto())
    choice = attn.kernel_choice(10**6, 10**6, jnp.float64)
    assert choice.path == "exact" and "over budget" in choice.reason and "beta=10000" in choice.reason
    # and computes, exactly (β = 10⁴ on 40 unit tokens: each token sees essentially itself)
    eye = np.eye(3)
    ref = reference.softmax_field(np.asarray(x), np.asarray(x), np.full(40, 1 / 40), eye, eye, eye, 1e4)
    np.testing.assert_allclose(attn.velocity(x), ref, atol=1e-12)


@pytest.mark.slow
def test_sinkhorn_small_epsilon_is_refused_not_hung():
    # γ = β/ε = 10⁴: the report used to run the plan (memory past 10 GiB)
    x = _tokens(30)
    eye = jnp.eye(3)
    with pytest.raises(PlanTooLarge, match="gamma=10000"):
        tp.SinkhornAttention(eye, eye, eye, 10.0, epsilon=1e-3, backend=Fast()).kernel_report(x)
    auto = tp.SinkhornAttention(eye, eye, eye, 10.0, epsilon=1e-3, backend=Auto())
    report = auto.kernel_report(x)
    assert report.path == "exact" and "over budget" in report.reason


def test_infinite_radius_is_refused_or_avoided():
    for kw in (dict(radius=math.inf), dict(score_radius=math.inf)):
        with pytest.raises(ValueError, match="finite"):
            Fast(**kw)
        with pytest.raises(ValueError, match="finite"):
            Auto(**kw)
    # row norms overflow: R = radius x |Q_r| is infinite
    huge = 1e300 * jnp.eye(3)
    with pytest.raises(ValueError, match="not finite"):
        tp.SoftmaxAttention(huge, huge, jnp.eye(3), 1.0, backend=Fast(radius=1e10))
    auto = tp.SoftmaxAttention(huge, huge, jnp.eye(3), 1.0, backend=Auto(radius=1e10))
    choice = auto.kernel_choice(10**6, 10**6, jnp.float64)
    assert choice.path == "exact" and "not finite" in choice.reason


@pytest.mark.parametrize("backend", [Fast(), Auto(), Exact()])
def test_zero_scores_are_a_plain_average(backend):
    # Q = K = 0: every score is 0, so the field is V times the weighted mean of the tokens
    x = _tokens(64, seed=1)
    w = np.random.default_rng(2).random(64)
    w /= w.sum()
    z = jnp.zeros((3, 3))
    V = jnp.asarray(np.random.default_rng(3).standard_normal((3, 3)))
    attn = tp.SoftmaxAttention(z, z, V, 2.0, backend=backend)
    expected = np.broadcast_to(np.asarray(V) @ (w @ np.asarray(x)), (64, 3))
    np.testing.assert_allclose(attn.velocity(x, jnp.asarray(w)), expected, atol=1e-12)
    if not isinstance(backend, Exact):
        assert "every score is 0" in attn.backend.box.note
