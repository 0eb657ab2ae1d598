"""Every attention variant against a plain NumPy reference, and the measure-level invariants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref

import transformer_pde as tp

N, D, KDIM = 7, 3, 2


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D))
    w = rng.uniform(0.2, 1.0, size=N)
    w /= w.sum()
    Q, K = rng.normal(size=(KDIM, D)), rng.normal(size=(KDIM, D))
    V = rng.normal(size=(D, D))
    queries = rng.normal(size=(4, D))
    return x, w, Q, K, V, queries


def _variants(Q, K, V):
    """(attention, NumPy field(queries, x, w)) pairs on random parameters."""
    beta = 0.7
    rng = np.random.default_rng(1)
    H, kh = 2, 2
    Qs, Ks = rng.normal(size=(H, kh, D)), rng.normal(size=(H, kh, D))
    Vs, Ws = rng.normal(size=(H, kh, D)), rng.normal(size=(H, D, kh))
    return {
        "softmax": (tp.SoftmaxAttention(Q, K, V, beta),
                    lambda q, x, w: ref.softmax_field(q, x, w, Q, K, V, beta)),
        "multihead": (tp.MultiHeadAttention(Qs, Ks, Vs, Ws, beta),
                      lambda q, x, w: ref.multihead_field(q, x, w, Qs, Ks, Vs, Ws, beta)),
        "l2": (tp.L2Attention(Q, K, V, beta), lambda q, x, w: ref.l2_field(q, x, w, Q, K, V, beta)),
        "sigmoid": (tp.SigmoidAttention(Q, K, V, beta, bias=-0.3),
                    lambda q, x, w: ref.sigmoid_field(q, x, w, Q, K, V, beta, -0.3)),
        "unnormalized": (tp.UnnormalizedAttention(Q, K, V, beta, shift=0.5),
                         lambda q, x, w: ref.unnormalized_field(q, x, w, Q, K, V, beta, 0.5)),
    }


@pytest.mark.parametrize("kdim", [D, D + 2])
def test_softmax_with_full_rank_scores_matches_numpy(data, kdim):
    """Q, K with k >= d take the folded path (scores ⟨q_i, β QᵀK x_j⟩, V applied after)."""
    x, w, _, _, V, queries = data
    rng = np.random.default_rng(11)
    Q, K = rng.normal(size=(kdim, D)), rng.normal(size=(kdim, D))
    attn = tp.SoftmaxAttention(Q, K, V, 0.7)
    np.testing.assert_allclose(attn.velocity(x, weights=w), ref.softmax_field(x, x, w, Q, K, V, 0.7),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(attn.field(queries, x, w), ref.softmax_field(queries, x, w, Q, K, V, 0.7),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax", "multihead", "l2", "sigmoid", "unnormalized"])
def test_field_matches_numpy(data, name):
    x, w, Q, K, V, queries = data
    attn, reference = _variants(Q, K, V)[name]
    np.testing.assert_allclose(attn.velocity(x, weights=w), reference(x, x, w), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(attn.field(queries, x, w), reference(queries, x, w), rtol=1e-10,
                               atol=1e-12)
    uniform = np.full(N, 1.0 / N)
    np.testing.assert_allclose(attn.velocity(x), reference(x, x, uniform), rtol=1e-10, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_sinkhorn_matches_numpy(data, epsilon):
    x, w, Q, K, V, _ = data
    attn = tp.SinkhornAttention(Q, K, V, 0.7, epsilon=epsilon, threshold=1e-13, max_iterations=20000)
    expected = ref.sinkhorn_field(x, w, Q, K, V, 0.7, epsilon)
    np.testing.assert_allclose(attn.velocity(x, weights=w), expected, rtol=1e-10, atol=1e-12)
    pot = attn.potentials(x, w)
    assert bool(pot.converged) and int(pot.n_iters) > 0


def test_sinkhorn_reports_nonconvergence(data):
    x, w, Q, K, V, _ = data
    attn = tp.SinkhornAttention(Q, K, V, 5.0, epsilon=0.01, threshold=1e-14, max_iterations=3,
                                throw=False)
    assert not bool(attn.potentials(x, w).converged)
    strict = tp.SinkhornAttention(Q, K, V, 5.0, epsilon=0.01, threshold=1e-14, max_iterations=3)
    with pytest.raises(Exception, match="did not converge"):
        strict.velocity(x, w)


def test_causal_attention_has_only_what_it_can_do(data):
    """Capabilities are types: a causal attention is a token velocity, with no field at arbitrary
    points and no Gaussian closure; its position-free counterpart has both where it can."""
    x, w, Q, K, V, _ = data
    frees = [tp.SoftmaxAttention(Q, K, V), tp.L2Attention(Q, K, V), tp.UnnormalizedAttention(Q, K, V),
             tp.SigmoidAttention(Q, K, V), tp.MultiHeadAttention.split(np.eye(D), np.eye(D), np.eye(D), 1)]
    for free in frees:
        causal = tp.Causal(free)
        assert isinstance(free, tp.AbstractFieldAttention) and isinstance(free, tp.AbstractMaskableAttention)
        assert isinstance(causal, tp.AbstractAttention)
        assert not isinstance(causal, (tp.AbstractFieldAttention, tp.AbstractGaussianClosure))
        assert not hasattr(causal, "field") and not hasattr(causal, "affine_field")
        assert isinstance(free, tp.AbstractGaussianClosure) == hasattr(free, "affine_field")
        # the last token sees every token: its causal velocity is the position-free one
        np.testing.assert_allclose(causal.velocity(x, w)[-1], free.velocity(x, w)[-1], rtol=1e-12)
    # Causal asks the backend whether it can mask: Fast refuses when the wrapper is built
    with pytest.raises(ValueError, match="non-causal"):
        tp.Causal(tp.L2Attention(np.eye(D), np.eye(D), np.eye(D), backend=tp.kernels.Fast()))
    # what cannot be causal is named: Sinkhorn (doubly stochastic), a wrapper, a causal one again
    for bad, name in ((tp.SinkhornAttention(Q, K, V, epsilon=1.0), "SinkhornAttention"),
                      (tp.Sphere(tp.SoftmaxAttention(Q, K, V)), "Sphere"),
                      (tp.Causal(tp.SoftmaxAttention(Q, K, V)), "Causal"), (np.eye(D), "ndarray")):
        with pytest.raises(ValueError, match=f"Causal wraps an attention .* got {name}"):
            tp.Causal(bad)
    # ALiBi is a key bias where the row factor cancels: normalized attention only
    with pytest.raises(ValueError, match="alibi.*normalized"):
        tp.Causal(tp.SigmoidAttention(Q, K, V), alibi=1.0)
    with pytest.raises(ValueError, match="alibi"):
        tp.Causal(tp.SoftmaxAttention(Q, K, V), alibi=-1.0)


@pytest.mark.parametrize("name", ["softmax", "l2", "sigmoid", "unnormalized", "multihead"])
def test_causal_matches_numpy(data, name):
    x, w, Q, K, V, _ = data
    beta = 0.9
    if name == "multihead":
        rng = np.random.default_rng(3)
        Qs, Ks, Vs = (rng.normal(size=(2, KDIM, D)) for _ in range(3))
        Ws = rng.normal(size=(2, D, KDIM))
        attn = tp.Causal(tp.MultiHeadAttention(Qs, Ks, Vs, Ws, beta))
        expected = sum(ref.softmax_field(x, x, w, Qs[h], Ks[h], Vs[h], beta, causal=True) @ Ws[h].T
                       for h in range(2))
        np.testing.assert_allclose(attn.velocity(x, weights=w), expected, rtol=1e-10, atol=1e-12)
        return
    cls = {"softmax": tp.SoftmaxAttention, "l2": tp.L2Attention,
           "sigmoid": tp.SigmoidAttention, "unnormalized": tp.UnnormalizedAttention}[name]
    attn = tp.Causal(cls(Q, K, V, beta))
    if name == "softmax":
        expected = ref.softmax_field(x, x, w, Q, K, V, beta, causal=True)
    elif name == "sigmoid":
        expected = ref.sigmoid_field(x, x, w, Q, K, V, beta, 0.0, causal=True)
    elif name == "unnormalized":
        expected = ref.unnormalized_field(x, x, w, Q, K, V, beta, causal=True)
    else:
        expected = np.stack([ref.l2_field(x[i:i + 1], x[: i + 1], w[: i + 1], Q, K, V, beta)[0]
                             for i in range(N)])
    np.testing.assert_allclose(attn.velocity(x, weights=w), expected, rtol=1e-10, atol=1e-12)
    # the first token sees only itself under softmax-type normalization
    if name in ("softmax", "l2"):
        np.testing.assert_allclose(attn.velocity(x, w)[0], V @ x[0], rtol=1e-12)


def _all_attentions(Q, K, V):
    out = {k: a for k, (a, _) in _variants(Q, K, V).items()}
    out["sinkhorn"] = tp.SinkhornAttention(Q, K, V, 0.7, epsilon=1.0, threshold=1e-13,
                                           max_iterations=20000)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax", "multihead", "l2", "sigmoid", "unnormalized", "sinkhorn"])
def test_permutation_equivariance_and_splitting(data, name):
    x, w, Q, K, V, _ = data
    attn = _all_attentions(Q, K, V)[name]
    v = attn.velocity(x, weights=w)
    perm = np.random.default_rng(5).permutation(N)
    np.testing.assert_allclose(attn.velocity(x[perm], weights=w[perm]), v[perm], rtol=1e-9, atol=1e-11)
    # split token 2 into two copies of half the weight: nothing changes (spec README)
    xs = np.concatenate([x, x[2:3]])
    ws = np.concatenate([w, w[2:3] / 2])
    ws[2] /= 2
    vs = attn.velocity(xs, weights=ws)
    np.testing.assert_allclose(vs[:N], v, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(vs[N], v[2], rtol=1e-9, atol=1e-11)


def test_zero_weight_tokens_are_ignored(data):
    x, w, Q, K, V, _ = data
    attn = tp.SoftmaxAttention(Q, K, V, 0.7)
    w0 = np.concatenate([w, [0.0]])
    x0 = np.concatenate([x, 1e3 * np.ones((1, D))])
    np.testing.assert_allclose(attn.velocity(x0, w0)[:N], attn.velocity(x, w), rtol=1e-12)


def _shared_heads(kdim, causal=False, **kwargs):
    """Three heads with their own Q_h, K_h and one V (k_v = 2), one W for all of them."""
    rng = np.random.default_rng(5)
    Qs, Ks = rng.normal(size=(3, kdim, D)), rng.normal(size=(3, kdim, D))
    V, W = rng.normal(size=(2, D)), rng.normal(size=(D, 2))
    heads = tp.MultiHeadAttention(Qs, Ks, V, W, 0.8, **kwargs)
    return (tp.Causal(heads) if causal else heads), (Qs, Ks, V, W)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kdim", [KDIM, D])
@pytest.mark.parametrize("layout", [tp.kernels.Dense(), tp.kernels.Streaming(4, 4)], ids=["dense", "streaming"])
def test_multihead_with_shared_value_maps_matches_numpy(data, causal, kdim, layout):
    """V and W given once (2-D) for every head: Γ = Σ_h W P_h V x, the heads' weights summed before
    the values (dense) or head by head (streaming); full-width heads (k = d) take the folded
    scores ⟨q, (K_hᵀQ_h)ᵀx⟩. Against the reference's loops over heads."""
    x, w, _, _, _, queries = data
    attn, (Qs, Ks, V, W) = _shared_heads(kdim, causal, backend=tp.kernels.Exact(layout=layout))

    def expected(q):
        return sum(ref.softmax_field(q, x, w, Qs[h], Ks[h], V, 0.8, causal=causal) @ W.T for h in range(3))

    np.testing.assert_allclose(attn.velocity(x, weights=w), expected(x), rtol=1e-10, atol=1e-12)
    if not causal:
        np.testing.assert_allclose(attn.field(queries, x, w), expected(queries), rtol=1e-10, atol=1e-12)


def test_multihead_with_shared_value_maps_gradients_match_stacked_maps(data):
    """The shared-map path (one value product) and the per-head path (the same maps stacked H
    times) are two computations of one field: equal values and gradients in every parameter."""
    x, w, *_ = data
    _, (Qs, Ks, V, W) = _shared_heads(D)

    def loss(params, stacked):
        Qs, Ks, V, W = params
        if stacked:
            V, W = jnp.broadcast_to(V, (3, *V.shape)), jnp.broadcast_to(W, (3, *W.shape))
        return jnp.sum(jnp.sin(tp.MultiHeadAttention(Qs, Ks, V, W, 0.8).velocity(x, weights=w)))

    params = tuple(jnp.asarray(p) for p in (Qs, Ks, V, W))
    (l1, g1), (l2, g2) = (jax.value_and_grad(loss)(params, s) for s in (False, True))
    np.testing.assert_allclose(l1, l2, rtol=1e-12)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_multihead_with_shared_value_maps_on_the_fast_kernel(data):
    """Fast (k = 2 scores) sums the heads' Gaussian sums one by one: within its tolerance of the
    reference on unit tokens; the value-norm bound counts every head."""
    x, w, *_ = data
    x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    attn, (Qs, Ks, V, W) = _shared_heads(KDIM, backend=tp.kernels.Fast(tol=1e-10))
    expected = sum(ref.softmax_field(x, x, w, Qs[h], Ks[h], V, 0.8) @ W.T for h in range(3))
    np.testing.assert_allclose(attn.velocity(x, weights=w), expected, rtol=0, atol=1e-8)
    assert float(attn.value_norm()) == pytest.approx(3 * np.linalg.norm(W @ V, 2), rel=1e-12)


def test_multihead_shared_maps_refuse_mismatched_shapes():
    rng = np.random.default_rng(0)
    Qs = rng.normal(size=(2, KDIM, D))
    with pytest.raises(ValueError, match=r"V must have shape \(H, k_v, d\) = \(2, k_v, 3\), or \(k_v, 3\)"):
        tp.MultiHeadAttention(Qs, Qs, np.ones((2, D + 1)), np.ones((D, 2)))
    with pytest.raises(ValueError, match=r"W must have shape .* or \(3, 2\) for one map shared by the heads, got \(3, 4\)"):
        tp.MultiHeadAttention(Qs, Qs, np.ones((2, D)), np.ones((D, 4)))
    with pytest.raises(ValueError, match="V must have shape"):
        tp.MultiHeadAttention(Qs, Qs, np.ones((5, 2, D)), np.ones((D, 2)))


def test_multihead_split_reduces_to_softmax_with_one_head(data):
    x, w, *_ = data
    rng = np.random.default_rng(3)
    Q, K, V = (rng.normal(size=(D, D)) for _ in range(3))
    one = tp.MultiHeadAttention.split(Q, K, V, 1, beta=0.5)
    np.testing.assert_allclose(one.velocity(x, w), tp.SoftmaxAttention(Q, K, V, 0.5).velocity(x, w),
                               rtol=1e-12)
    Q4, K4, V4 = (rng.normal(size=(4, 4)) for _ in range(3))
    x4 = rng.normal(size=(5, 4))
    two = tp.MultiHeadAttention.split(Q4, K4, V4, 2, beta=0.5)
    expected = np.concatenate([ref.softmax_field(x4, x4, np.full(5, 0.2), Q4[2 * h:2 * h + 2],
                                                 K4[2 * h:2 * h + 2], V4[2 * h:2 * h + 2], 0.5)
                               for h in range(2)], axis=1)
    np.testing.assert_allclose(two.velocity(x4), expected, rtol=1e-10)


def test_time_dependent_parameters(data):
    x, w, Q, K, V, _ = data
    stack = np.stack([V, 2 * V, -V])
    layered = tp.SoftmaxAttention(Q, K, tp.PiecewiseConstant(stack, t0=0.0, dt=0.5), 0.7)
    for t, layer in [(0.0, 0), (0.49, 0), (0.5, 1), (1.0 + 1e-12, 2), (0.3 * 5, 2), (7.0, 2)]:
        fixed = tp.SoftmaxAttention(Q, K, stack[layer], 0.7)
        np.testing.assert_allclose(layered.velocity(x, w, t=t), fixed.velocity(x, w), rtol=1e-12)
    # 0.1 * 7 / 0.1 rounds to 6.999...: still layer 7, not 6
    many = tp.PiecewiseConstant(jnp.arange(10.0), dt=0.1)
    assert float(many(0.1 * 7)) == 7.0
    rotating = tp.SoftmaxAttention(Q, K, lambda t: jnp.cos(t) * jnp.asarray(V), 0.7)
    np.testing.assert_allclose(rotating.velocity(x, w, t=0.8),
                               np.cos(0.8) * tp.SoftmaxAttention(Q, K, V, 0.7).velocity(x, w), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax", "multihead", "l2", "sigmoid", "sinkhorn"])
def test_float32_large_beta_and_norms_stay_finite(name):
    rng = np.random.default_rng(7)
    x = (100.0 * rng.normal(size=(16, 4))).astype(np.float32)
    Q, K, V = (rng.normal(size=(4, 4)).astype(np.float32) for _ in range(3))
    if name == "multihead":
        attn = tp.MultiHeadAttention.split(Q, K, V, 2, beta=1e3)
    elif name == "sinkhorn":
        attn = tp.SinkhornAttention(Q, K, V, 1e3, epsilon=1.0, max_iterations=50, throw=False)
    else:
        attn = {"softmax": tp.SoftmaxAttention, "l2": tp.L2Attention,
                "sigmoid": tp.SigmoidAttention}[name](Q, K, V, 1e3)
    v = attn.velocity(x)
    assert v.dtype == jnp.float32
    assert np.isfinite(np.asarray(v)).all()
    if name in ("softmax", "l2", "sinkhorn"):
        # a convex combination of V x_j: bounded by max |V x_j|
        assert np.max(np.abs(v)) <= np.max(np.abs(x @ V.T)) * (1 + 1e-5)


def test_unnormalized_gkpr_shift_is_finite_on_sphere_for_large_beta():
    x = np.asarray(tp.uniform_sphere(jax.random.key(0), 12, 3, dtype=jnp.float32))
    usa = tp.UnnormalizedAttention.identity(3, beta=1e3, shift=1.0, dtype=jnp.float32)
    v = usa.velocity(x.astype(np.float32))
    assert np.isfinite(np.asarray(v)).all()
    # each token sees itself with weight e^{β(1-1)}/n = 1/n, others are negligible
    np.testing.assert_allclose(v, x / 12, atol=1e-4)


@pytest.mark.package_errors
def test_bad_inputs_name_the_value(data):
    x, w, Q, K, V, _ = data
    with pytest.raises(ValueError, match=r"V must be square"):
        tp.SoftmaxAttention(Q, K, np.ones((3, 2)), 1.0)
    with pytest.raises(ValueError, match=r"Q and K must both have shape"):
        tp.SoftmaxAttention(Q, K[:, :2], V, 1.0)
    attn = tp.SoftmaxAttention(Q, K, V, 1.0)
    with pytest.raises(ValueError, match=r"dimension d=2 but the dynamics act on d=3"):
        attn.velocity(x[:, :2])
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match=r"x\[3, 1\] = nan"):
        attn.velocity(bad)
    with pytest.raises(ValueError, match=r"non-negative, but weights\[1\] = -0.5"):
        attn.velocity(x, np.array([1.5, -0.5, 0, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"sum to 1.*sum to 2"):
        attn.velocity(x, 2 * w)
    with pytest.raises(ValueError, match=r"shape \(7,\)"):
        attn.velocity(x, w[:5])
    with pytest.raises(ValueError, match=r"beta must be finite, got inf"):
        tp.SoftmaxAttention(Q, K, V, np.inf)
    with pytest.raises(ValueError, match=r"epsilon must be > 0, got -1"):
        tp.SinkhornAttention(Q, K, V, 1.0, epsilon=-1.0)
    with pytest.raises(ValueError, match=r"num_heads=2 must divide d=3"):
        tp.MultiHeadAttention.split(V, V, V, 2)
    with pytest.raises(ValueError, match=r"unit sphere.*\|x\[0\]\|"):
        tp.Sphere(attn).velocity(2 * tp.normalize(jnp.asarray(x)))


def test_split_with_one_coordinate_per_head():
    """MultiHeadAttention.split with num_heads = d: head h scores β(Q_h x)(K_h y) (rank one) and
    moves only coordinate h by its softmax average of (V y)_h (plain NumPy rows)."""
    rng = np.random.default_rng(3)
    d, n, beta = 4, 7, 0.7
    Q, K, V = (rng.normal(size=(d, d)) for _ in range(3))
    x = rng.normal(size=(n, d))
    got = np.asarray(tp.MultiHeadAttention.split(Q, K, V, num_heads=d, beta=beta).velocity(jnp.asarray(x)))
    ref = np.zeros((n, d))
    for h in range(d):
        s = beta * np.outer(x @ Q[h], x @ K[h])
        p = np.exp(s - s.max(axis=1, keepdims=True))
        ref[:, h] = (p / p.sum(axis=1, keepdims=True)) @ (x @ V[h])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
