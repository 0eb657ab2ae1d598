"""benchmarks/training_rate.py: its network is the Euler discretization of the ODE ``tp.solve``
integrates, and the two parts of the Gibson–Reisinger rate appear where they can be isolated."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import diffrax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import transformer_pde as tp

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "training_rate.py"


def _script():
    spec = importlib.util.spec_from_file_location("training_rate_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _numpy_network(Q, K, V, x):
    """x ← x + (1/L)(1/H) Σ_h softmax(⟨Q_h x_i, K_h x_j⟩) V_h x_j, written plainly."""
    L, H = Q.shape[:2]
    for r in range(L):
        out = np.zeros_like(x)
        for h in range(H):
            s = (x @ Q[r, h].T) @ (x @ K[r, h].T).T
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out += (p / p.sum(axis=1, keepdims=True)) @ (x @ V[r, h].T)
        x = x + out / (L * H)
    return x


def test_network_is_euler_of_the_ode():
    """The benchmark's network (tp.layers) and tp.solve's explicit Euler with one step per layer
    of the same depth-indexed MultiHeadAttention both equal the residual network in NumPy."""
    tr = _script()
    L, H = 5, 3
    attn = tr.init_heads(jr.key(0), L, H)
    x = np.asarray(jr.normal(jr.key(1), (7, tr.D)))
    want = _numpy_network(*(np.asarray(P.values) for P in (attn.Q, attn.K, attn.V)), x)
    net = tr.layers(attn, jnp.asarray(x)[None])[0]
    euler = tp.solve(attn, jnp.asarray(x), t1=1.0, dt0=1.0 / L, solver=diffrax.Euler()).xs[-1]
    assert np.max(np.abs(want - x)) > 0.05  # the layers move the tokens
    np.testing.assert_allclose(net, want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(euler, want, rtol=0, atol=1e-13)


def test_depth_part_is_first_order():
    """Fixed heads (a 2-layer, 64-head network, refined to L layers: the same function of depth):
    the L-layer network against tp.solve's ODE of those weights falls as L^-1 (fitted slope within
    0.1 of −1), and ``refined`` leaves the ODE unchanged."""
    tr = _script()
    coarse = tr.init_seeds(jr.key(3), 2, 64, 1)
    X = jr.normal(jr.key(4), (4, 8, tr.D))
    exact = np.asarray(tr.ode_seeds(coarse, X))
    Ls = np.array([8, 16, 32])
    errs = [tr.rms(tr.layers_seeds(tr.refined(coarse, int(L), 64), X), exact)[0] for L in Ls]
    np.testing.assert_allclose(tr.ode_seeds(tr.refined(coarse, 8, 80), X), exact, rtol=0, atol=1e-12)
    slope = np.polyfit(np.log(Ls), np.log(errs), 1)[0]
    assert abs(slope + 1) < 0.1, (slope, errs)


@pytest.mark.slow
def test_heads_part_at_init_against_the_exact_mean_field():
    """Untrained heads have mean field exactly zero (V symmetric, independent of Q, K), so the
    mean-field ODE leaves the tokens where they are; the network's distance to them is the heads'
    Monte Carlo error alone and falls as (LH)^{-1/2}: fitted slopes in H and in L within 0.15 of
    −1/2 (8 seeds; Gibson–Reisinger's bound gives L^{-1/3}H^{-1/2})."""
    tr = _script()
    X = jr.normal(jr.key(5), (8, 8, tr.D))

    def err(L, H):
        nets = tr.init_seeds(jr.fold_in(jr.key(6), 100 * L + H), L, H, 8)
        return np.exp(np.mean(np.log(tr.rms(tr.layers_seeds(nets, X), X))))  # geometric mean over seeds

    Hs, Ls = np.array([2, 8, 32, 128]), np.array([2, 8, 32])
    slope_H = np.polyfit(np.log(Hs), np.log([err(4, int(H)) for H in Hs]), 1)[0]
    slope_L = np.polyfit(np.log(Ls), np.log([err(int(L), 8) for L in Ls]), 1)[0]
    assert abs(slope_H + 0.5) < 0.15 and abs(slope_L + 0.5) < 0.15, (slope_H, slope_L)


@pytest.mark.slow
def test_training_rate_script_tiny(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "training_rate.json").read_text())
    errs = {k: np.array(v) for k, v in result["errors"].items()}
    assert all(e.shape == (2, 2, 2) and np.all(np.isfinite(e)) and np.all(e > 0) for e in errs.values())
    # the triangle inequality between the three distances of each trained network
    assert np.all(errs["total"] <= errs["disc"] + errs["heads"] + 1e-12)
    assert (tmp_path / "training_rate.png").stat().st_size > 1000
    assert "Gibson–Reisinger" in (tmp_path / "training_rate.md").read_text()
