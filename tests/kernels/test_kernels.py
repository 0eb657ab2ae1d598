"""Streaming (blocked) kernels against plain NumPy references and the dense path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.kernels import Dense, DenseOrStreaming, Exact, Streaming
from transformer_pde.kernels import exact as kernels


def numpy_lse_average(q, k, v, bias, causal=False):
    """Reference written plainly, row by row, in float64."""
    q, k, v, bias = (np.asarray(a, np.float64) for a in (q, k, v, bias))
    m, n = q.shape[0], k.shape[0]
    out, lse = np.zeros((m, v.shape[1])), np.full(m, -np.inf)
    for i in range(m):
        visible = np.isfinite(bias) & ((np.arange(n) <= i) if causal else True)
        if not visible.any():
            continue
        s = q[i] @ k[visible].T + bias[visible]
        mx = s.max()
        p = np.exp(s - mx)
        out[i] = p @ v[visible] / p.sum()
        lse[i] = mx + np.log(p.sum())
    return out, lse


def numpy_sigmoid_sum(q, k, v, w, causal=False):
    s = 1 / (1 + np.exp(-(np.asarray(q) @ np.asarray(k).T)))
    if causal:
        s = np.tril(s)
    return s @ (np.asarray(w)[:, None] * np.asarray(v))


def problem(rng, m, n, p=3, e=2, dtype=np.float64, zero_every=5):
    q = rng.normal(size=(m, p))
    k = rng.normal(size=(n, p))
    v = rng.normal(size=(n, e))
    w = rng.random(n)
    w[::zero_every] = 0.0  # zero weights: bias -inf, including key 0 (row 0 sees nothing)
    w /= w.sum()
    bias = np.where(w > 0, np.log(np.where(w > 0, w, 1.0)), -np.inf)
    return tuple(jnp.asarray(a, dtype) for a in (q, k, v, bias, w))


# query and key blocks chosen so that neither m nor n is a multiple of either
BLOCKS = Streaming(key_block=24, query_block=16)


@pytest.mark.parametrize("causal", [False, True])
def test_streaming_matches_numpy_float64(causal):
    rng = np.random.default_rng(0)
    m = n = 101
    q, k, v, bias, _ = problem(rng, m, n)
    ref_out, ref_lse = numpy_lse_average(q, k, v, bias, causal)
    for bs in (BLOCKS, Dense()):
        out, lse = jax.jit(lambda *a, bs=bs: kernels.lse_average(*a, causal=causal, layout=bs))(
            q, k, v, bias)
        np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)
    if causal:  # key 0 has zero weight: query 0 sees no key
        assert out[0].tolist() == [0.0, 0.0] and lse[0] == -np.inf


def test_streaming_rectangular_queries_and_float32():
    rng = np.random.default_rng(1)
    q, k, v, bias, _ = problem(rng, 37, 90, p=4, e=3, dtype=np.float32)
    ref_out, ref_lse = numpy_lse_average(q, k, v, bias)
    out, lse = kernels.lse_average(q, k, v, bias, layout=Streaming(key_block=32, query_block=8))
    assert out.dtype == jnp.float32 and lse.dtype == jnp.float32
    np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_streaming_wide_values(causal):
    """Values wider than ``NARROW`` take the matrix-product tile form; loose bounds included."""
    rng = np.random.default_rng(9)
    q, k, v, bias, _ = problem(rng, 41, 53, p=10, e=kernels.NARROW + 1)
    for scale in (1.0, 200.0):  # 200: the Cauchy–Schwarz shift underflows, exact redo
        ref_out, ref_lse = numpy_lse_average(scale * q, k, v, bias, causal)
        out, lse = kernels.lse_average(scale * q, k, v, bias, causal=causal, layout=BLOCKS)
        np.testing.assert_allclose(out, ref_out, rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)


@pytest.mark.slow
def test_causal_query_offset_is_a_slice_of_the_full_problem():
    """Queries that are tokens 20..44 (one shard) see keys j <= 20 + i: the same rows as the
    full causal problem, on both paths, and the same gradients (custom VJPs included)."""
    rng = np.random.default_rng(10)
    q, k, v, bias, w = problem(rng, 60, 60)
    full_out, full_lse = numpy_lse_average(q, k, v, bias, causal=True)
    rows = slice(20, 45)
    for bs in (Dense(), BLOCKS):
        out, lse = kernels.lse_average(q[rows], k, v, bias, causal=True, query_offset=20, layout=bs)
        np.testing.assert_allclose(out, full_out[rows], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse, full_lse[rows], rtol=1e-12)
        sig = kernels.sigmoid_kernel_sum(q[rows], k, v, w, causal=True, query_offset=jnp.int32(20),
                                         layout=bs)
        np.testing.assert_allclose(sig, numpy_sigmoid_sum(q, k, v, w, True)[rows], rtol=1e-12)

    def loss(bs):
        def f(q, k, v):
            return (jnp.sum(jnp.sin(kernels.softmax_average(q, k, v, bias, causal=True, query_offset=20,
                                                            layout=bs)))
                    + jnp.sum(jnp.cos(kernels.sigmoid_kernel_sum(q, k, v, w, causal=True, query_offset=20,
                                                                 layout=bs))))
        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))

    for a, b in zip(loss(Dense())(q[rows], k, v), loss(BLOCKS)(q[rows], k, v)):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_loose_bound_falls_back_to_exact_shift():
    """Large logits of both signs: |q||k| over-estimates the row maximum by ~1e3, so the
    single-pass shift underflows and the block must be recomputed with exact maxima."""
    rng = np.random.default_rng(2)
    q, k, v, bias, _ = problem(rng, 40, 50)
    q = 300.0 * q
    ref_out, ref_lse = numpy_lse_average(q, k, v, bias)
    out, lse = kernels.lse_average(q, k, v, bias, layout=Streaming(16, 16))
    np.testing.assert_allclose(out, ref_out, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-13)
    # under vmap (as for the heads of multi-head attention) one member needs the second
    # pass and the other does not: each must still be exact
    qs = jnp.stack([q, q / 300.0])
    outs, lses = jax.vmap(lambda q: kernels.lse_average(q, k, v, bias, layout=Streaming(16, 16)))(qs)
    ref_small = numpy_lse_average(q / 300.0, k, v, bias)
    for got, want in zip((outs[0], outs[1], lses[0], lses[1]), (ref_out, ref_small[0], ref_lse,
                                                                ref_small[1])):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_streaming_gradients_match_dense(causal):
    """Custom VJP (recomputation) against autodiff of the dense path, every input."""
    rng = np.random.default_rng(3)
    q, k, v, bias, _ = problem(rng, 45, 45, zero_every=7)

    def loss(layout):
        def f(q, k, v, bias):
            out, lse = kernels.lse_average(q, k, v, bias, causal=causal, layout=layout)
            # both outputs carry a cotangent; -inf lse rows (causal row 0) are dropped
            return jnp.sum(jnp.sin(out)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0) ** 2)
        return f

    bias = bias.at[0].set(0.3)  # every row sees a key, so the dense autodiff is finite too
    g_dense = jax.jit(jax.grad(loss(Dense()), argnums=(0, 1, 2, 3)))(q, k, v, bias)
    g_stream = jax.jit(jax.grad(loss(BLOCKS), argnums=(0, 1, 2, 3)))(q, k, v, bias)
    for a, b in zip(g_dense, g_stream):
        a = jnp.where(jnp.isfinite(a), a, 0.0)
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_streaming_gradient_finite_difference():
    """An independent check of the VJP: directional derivative by central differences."""
    rng = np.random.default_rng(4)
    q, k, v, bias, _ = problem(rng, 30, 30, zero_every=1000)
    f = jax.jit(lambda q: jnp.sum(jnp.cos(kernels.exp_kernel_sum(q, k, v, bias,
                                                                   layout=Streaming(8, 8)))))
    direction = jnp.asarray(rng.normal(size=q.shape))
    h = 1e-6
    fd = (f(q + h * direction) - f(q - h * direction)) / (2 * h)
    np.testing.assert_allclose(jnp.vdot(jax.grad(f)(q), direction), fd, rtol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_sigmoid_streaming(causal):
    rng = np.random.default_rng(5)
    q, k, v, _, w = problem(rng, 50, 50)
    ref = numpy_sigmoid_sum(q, k, v, w, causal)
    out = kernels.sigmoid_kernel_sum(q, k, v, w, causal=causal, layout=BLOCKS)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-14)
    f = lambda bs: lambda q, k, v: jnp.sum(jnp.sin(
        kernels.sigmoid_kernel_sum(q, k, v, w, causal=causal, layout=bs)))
    for a, b in zip(jax.jit(jax.grad(f(Dense()), argnums=(0, 1, 2)))(q, k, v),
                    jax.jit(jax.grad(f(BLOCKS), argnums=(0, 1, 2)))(q, k, v)):
        np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-14)


def _attention_family(d, rng, layout):
    Q, K, V = (rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))
    kw = {"backend": Exact(layout)}
    return {
        "softmax": tp.SoftmaxAttention(Q, K, V, 2.0, **kw),
        "causal": tp.Causal(tp.SoftmaxAttention(Q, K, V, 2.0, **kw)),
        "multihead": tp.MultiHeadAttention.split(Q, K, V, 2, 1.5, **kw),
        "l2": tp.L2Attention(Q, K, V, 0.7, **kw),
        "unnormalized": tp.UnnormalizedAttention(Q, K, V, 1.2, shift=0.5, **kw),
        "sigmoid": tp.SigmoidAttention(Q, K, V, 1.0, bias=-0.5, layout=layout),
        "sinkhorn": tp.SinkhornAttention(Q, K, V, 1.0, epsilon=1.0, threshold=1e-10, **kw),
    }


@pytest.mark.slow
def test_every_variant_streams_like_dense(monkeypatch):
    # the default layout (dense at this n) against streaming with a key block; a small tile
    # makes the query block 16 rows, so both axes have several, ragged, blocks
    monkeypatch.setattr(kernels, "DEFAULT_TILE", 16 * 24)
    rng = np.random.default_rng(6)
    d, n = 4, 70
    x = rng.normal(size=(n, d))
    w = rng.random(n)
    w[3] = 0.0
    w /= w.sum()
    dense = _attention_family(d, np.random.default_rng(7), DenseOrStreaming())
    stream = _attention_family(d, np.random.default_rng(7), Streaming(24))
    vel = jax.jit(lambda a, x, w: a.vector_field(x, w, jnp.zeros(())))
    for name in dense:
        np.testing.assert_allclose(vel(stream[name], x, w), vel(dense[name], x, w),
                                   rtol=1e-10, atol=1e-12, err_msg=name)
    # the mean-field object at other points, and float32
    queries = rng.normal(size=(9, d))
    np.testing.assert_allclose(stream["l2"].field(queries, x, w), dense["l2"].field(queries, x, w),
                               rtol=1e-10, atol=1e-12)
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    s32 = tp.SoftmaxAttention(f32(dense["softmax"].Q), f32(dense["softmax"].K),
                              f32(dense["softmax"].V), 2.0, backend=Exact(Streaming(24)))
    v32 = vel(s32, f32(x), f32(w))
    assert v32.dtype == jnp.float32
    np.testing.assert_allclose(v32, vel(dense["softmax"], x, w), rtol=1e-4, atol=1e-5)


def test_sinkhorn_streaming_potentials_match_dense(monkeypatch):
    monkeypatch.setattr(kernels, "DEFAULT_TILE", 16 * 16)
    rng = np.random.default_rng(8)
    d, n = 3, 60
    Q, K, V = (rng.normal(size=(d, d)) / 2 for _ in range(3))
    x = rng.normal(size=(n, d))
    a = tp.SinkhornAttention(Q, K, V, 1.5, epsilon=0.8, threshold=1e-10)
    b = tp.SinkhornAttention(Q, K, V, 1.5, epsilon=0.8, threshold=1e-10,
                             backend=Exact(Streaming(16)))
    pot = jax.jit(lambda attn, x: attn._potentials(x, jnp.full(n, 1.0 / n), jnp.zeros(())))
    pa, pb = pot(a, x), pot(b, x)
    assert bool(pb.converged) and int(pa.n_iters) == int(pb.n_iters)
    # potentials are defined up to a constant; ott fixes it the same way on both paths
    np.testing.assert_allclose(pb.g, pa.g, rtol=1e-9, atol=1e-9)


@pytest.mark.package_errors
def test_layouts_and_bad_blocks():
    auto = DenseOrStreaming()
    assert auto.blocks(100, 100) is None
    qb, kb = auto.blocks(4096, 4096)
    assert kb == kernels.DEFAULT_BLOCK and qb * kb <= kernels.DEFAULT_TILE
    qb, kb = auto.blocks(4096, 4096, width=kernels.NARROW)  # wide values: the smaller tile
    assert qb * kb <= kernels.WIDE_TILE
    assert Streaming(64).blocks(10, 1000) == (10, 64)  # blocks clipped to the problem
    assert Streaming(64, query_block=8).blocks(100, 1000) == (8, 64)
    assert Dense().blocks(10**6, 10**6) is None
    assert DenseOrStreaming(max_dense_pairs=0).blocks(2, 2) == (2, 2)
    with pytest.raises(ValueError, match="Streaming.key_block must be >= 1, got 0"):
        Streaming(0)
    with pytest.raises(ValueError, match="Streaming.query_block must be >= 1, got -1"):
        Streaming(4, query_block=-1)
    with pytest.raises(ValueError, match="layout must be an exact-kernel layout"):
        kernels.lse_average(*problem(np.random.default_rng(0), 4, 4)[:4], layout=64)
    with pytest.raises(ValueError, match="Exact.layout must be"):
        Exact((16, 24))


def _temp_bytes(fn, *args):
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_memory_is_linear_forward_and_backward():
    """XLA's buffer assignment (compile only, nothing runs): the streaming forward at
    n = 65536 needs < 64 MiB of temporaries, and forward+backward temporaries grow like n."""
    d = 3
    x = jax.ShapeDtypeStruct((65536, d), jnp.float32)
    b = jax.ShapeDtypeStruct((65536,), jnp.float32)
    fwd = lambda x, b: kernels.softmax_average(x, x, x, b)
    assert _temp_bytes(fwd, x, b) < 64 * 2**20

    def grad_bytes(n):
        xs = jax.ShapeDtypeStruct((n, d), jnp.float32)
        bs = jax.ShapeDtypeStruct((n,), jnp.float32)
        g = jax.grad(lambda x, b: jnp.sum(kernels.softmax_average(x, x, x, b,
                                                                  layout=Streaming(256, 256)) ** 2))
        return _temp_bytes(g, xs, bs)

    small, large = grad_bytes(8192), grad_bytes(32768)
    assert large < 4 * 2**20 + 8 * small  # 4x the tokens: at most ~4x the memory, not 16x
    assert large < 0.05 * 32768**2 * 4  # far below one materialized n x n matrix


def test_default_blocks_follow_the_platform(monkeypatch):
    """No block given: the CPU tile on CPU; the tile measured fastest on an H100 on a GPU
    (benchmarks/results/gpu/results.md); an explicit block is kept on every platform."""
    from transformer_pde.kernels import exact

    cpu = DenseOrStreaming().blocks(20000, 20000)
    assert cpu[1] == kernels.DEFAULT_BLOCK
    monkeypatch.setattr(exact, "current_platform", lambda: "gpu")
    assert DenseOrStreaming().blocks(20000, 20000) == exact.GPU_BLOCKS
    assert Streaming(query_block=100).blocks(20000, 20000) == (100, exact.GPU_BLOCKS[1])
    assert Streaming(1024).blocks(20000, 20000) == (kernels.DEFAULT_TILE // 1024, 1024)
    assert DenseOrStreaming().blocks(1000, 1000) == (1000, 1000)  # clipped to the problem
