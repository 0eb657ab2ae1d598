"""Sweeps: labelled (xarray) grids, chunked vmapped grids, sharding, and the (β, d) phase experiment."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from _runs import tiny_run

import transformer_pde as tp
from transformer_pde.sweeps import first_time


def test_sweep_returns_labelled_xarray():
    out = tp.sweep(lambda beta, seed, d: {"x": beta * seed * jnp.ones(2) + d},
                   {"beta": np.array([0.5, 1.0, 2.0]), "seed": np.arange(4)}, static={"d": [2, 3]})
    x = out["x"]
    assert isinstance(x, xr.DataArray) and x.name == "x"
    assert x.dims == ("d", "beta", "seed", "dim_0") and x.shape == (2, 3, 4, 2)
    np.testing.assert_array_equal(x["d"].values, [2, 3])
    np.testing.assert_array_equal(x["beta"].values, [0.5, 1.0, 2.0])
    assert "dim_0" not in x.coords  # the output's own dims are not swept: no coordinates
    v = 0.5 * np.arange(4)[:, None] * np.ones(2) + 3  # beta = 0.5, d = 3
    np.testing.assert_array_equal(x.sel(beta=0.5, d=3).values, v)
    np.testing.assert_array_equal(x.sel(beta=0.9, d=3, method="nearest").values, x.sel(beta=1.0, d=3).values)
    np.testing.assert_array_equal(x.mean("seed").values, x.values.mean(axis=2))
    np.testing.assert_array_equal(x.reduce(np.max, "d").values, x.values.max(0))
    # module and function names do not shadow each other
    assert tp.sweeps.first_time is first_time and callable(tp.sweep)


def test_sweep_matches_numpy_with_padding_and_static_axes():
    traces = []

    def fn(a, b, k):
        traces.append(1)
        return {"s": a * b + jnp.sin(a) * k, "v": jnp.stack([a, b, a - b])}

    a, b = np.linspace(0, 1, 4), np.array([1.0, -2.0, 3.0])
    out = tp.sweep(fn, {"a": a, "b": b}, static={"k": [1, 2]}, chunk_size=5)  # 12 points, 3 chunks
    assert len(traces) == 2  # one trace per static value, every grid point vmapped
    traces.clear()
    assert out["s"].dims == ("k", "a", "b") and out["v"].dims == ("k", "a", "b", "dim_0")
    np.testing.assert_array_equal(out["s"]["a"].values, a)
    A, B = np.meshgrid(a, b, indexing="ij")
    for i, k in enumerate([1, 2]):
        np.testing.assert_allclose(out["s"].values[i], A * B + np.sin(A) * k, rtol=1e-14)
        np.testing.assert_allclose(out["v"].values[i], np.stack([A, B, A - B], -1), rtol=1e-14)
    single = tp.sweep(lambda a: a**2, {"a": a})
    assert single.name == "value" and single.dims == ("a",)
    np.testing.assert_allclose(single.values, a**2)
    # a memory budget picks the chunk from XLA's memory analysis; the values do not change
    budget = tp.sweep(fn, {"a": a, "b": b}, static={"k": [2]}, max_memory=1)
    np.testing.assert_allclose(budget["s"].values, out["s"].values[1:], rtol=1e-14)
    with pytest.raises(ValueError, match="both static and vmapped"):
        tp.sweep(fn, {"a": a, "k": b}, static={"k": [1]})
    with pytest.raises(ValueError, match="1-D"):
        tp.sweep(fn, {"a": np.ones((2, 2))})


def _order(t, x):
    """|mean token|²: 1 exactly when all tokens coincide."""
    return jnp.mean(x @ x.T)


@pytest.mark.slow
def test_sweep_of_64_dynamics_points_in_one_vmapped_call():
    """β × spectrum of V × horizon on the sphere: 64 points, one trace, each point equal to
    solving it alone. A traced horizon t1 needs an explicit max_steps (constant steps)."""
    n, d = 8, 3
    x0 = tp.uniform_sphere(jax.random.key(0), n, d)
    traces = []

    def model(beta, lam):
        V = jnp.diag(jnp.array([1.0, lam, lam]))
        return tp.Sphere(tp.SoftmaxAttention(jnp.eye(d), jnp.eye(d), V, beta))

    def fn(beta, lam, t1):
        traces.append(1)
        return _order(0.0, tp.solve(model(beta, lam), x0, t1=t1, dt0=0.1, max_steps=20).final)

    betas, lams, horizons = np.linspace(0.0, 4.0, 8), np.linspace(-1.0, 1.0, 4), np.array([0.5, 1.5])
    out = tp.sweep(fn, {"beta": betas, "lam": lams, "t1": horizons})
    assert len(traces) == 1 and out.shape == (8, 4, 2) and out.dims == ("beta", "lam", "t1")
    for i, j, k in [(0, 0, 0), (3, 3, 1), (7, 2, 1)]:
        sol = tp.solve(model(betas[i], lams[j]), x0, t1=horizons[k], dt0=0.1, max_steps=20)
        np.testing.assert_allclose(out.values[i, j, k], _order(0.0, sol.final), rtol=1e-12)


def test_first_time():
    ts = jnp.array([0.0, 1.0, 2.0, 3.0])
    hit = jnp.array([[False, False, True, True], [False, False, False, False]])
    np.testing.assert_array_equal(first_time(ts, hit), [2.0, np.inf])


def test_heatmap():
    import matplotlib.pyplot as plt

    la = xr.DataArray(np.array([[1.0, np.nan], [3.0, 4.0]]), coords={"beta": [1.0, 2.0]}, dims=("d", "beta"),
                      name="z")
    fig, ax = plt.subplots()
    mesh = tp.heatmap(la, "beta", "d", ax=ax, log_color=True, annotate=True)
    assert mesh.get_array().shape == (2, 2) and np.ma.is_masked(mesh.get_array())
    # rows are d (no coordinates: 0, 1), columns beta; cells centred on the coordinates
    np.testing.assert_allclose(mesh.get_coordinates()[0, :, 0], [0.5, 1.5, 2.5])
    np.testing.assert_allclose(mesh.get_coordinates()[:, 0, 1], [-0.5, 0.5, 1.5])
    assert np.ma.getdata(mesh.get_array())[1, 0] == 3.0
    assert fig.axes[-1].get_ylabel() == "z"  # the colorbar names the values
    with pytest.raises(ValueError, match="2-D array"):
        tp.heatmap(la, "beta", "seed", ax=ax)
    plt.close(fig)


@pytest.mark.slow
def test_sweep_shards_over_two_devices():
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        import transformer_pde as tp
        assert len(jax.devices()) == 2
        out = tp.sweep(lambda a, b: jnp.tanh(a) * b, {"a": np.linspace(0, 1, 5), "b": np.arange(3.0)},
                       chunk_size=3)
        A, B = np.meshgrid(np.linspace(0, 1, 5), np.arange(3.0), indexing="ij")
        np.testing.assert_allclose(out.values, np.tanh(A) * B, rtol=1e-6)
        print("ok")
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


@pytest.mark.slow
def test_sweep_phase_experiment_tiny(tmp_path_factory):
    res, cfg, run_dir = tiny_run("sweep-phase", tmp_path_factory)
    assert (run_dir / "sweep-phase.png").exists()
    D, B, S = len(res["dims"]), cfg.num_betas, cfg.seeds
    assert B * S >= 64 and res["t_one"].shape == (D, B, S)
    t_one, clusters = res["t_one"], res["clusters"]
    # the time to one cluster is where the saved count first reaches one, and one cluster stays one
    for idx in np.ndindex(t_one.shape):
        c = clusters[idx]
        if np.isfinite(t_one[idx]):
            k = int(np.argmin(np.abs(res["ts"] - t_one[idx])))
            assert c[k] == 1 and np.all(c[:k] > 1) and np.all(c[k:] == 1)
        else:
            assert np.all(c > 1)
    # small β clusters quickly (d = 3: every seed); large β is metastable (sphere.md §2)
    frac = res["fraction_one"]
    d3 = list(res["dims"]).index(3)
    assert frac[d3, 0] == 1.0
    assert frac[:, : B // 4].mean() > frac[:, -B // 4 :].mean()


@pytest.mark.parametrize("static, message", [
    ({"d": 3}, r"static axis 'd' must be a list of values .*static=\{'d': \[3\]\}"),
    ({"d": "abc"}, r"static axis 'd' must be a list of values"),
    ("d", r"static"),  # a TypeError from the type checks on in tests, else this ValueError
])
def test_sweep_static_must_list_values(static, message):
    """A bare static value (d=3) is named with the fix (it ended in "object of type 'int' has
    no len()"); a range is a list of values."""
    with pytest.raises((ValueError, TypeError), match=message):
        tp.sweep(lambda beta, d: beta * d, {"beta": [0.5, 1.0]}, static=static)
    out = tp.sweep(lambda beta, d: beta * d, {"beta": [0.5, 1.0]}, static={"d": range(2, 4)})
    np.testing.assert_allclose(out.values, [[1.0, 2.0], [1.5, 3.0]])
