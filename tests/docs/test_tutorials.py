"""The tutorials of docs/tutorials/ run top to bottom at TP_TUTORIAL_SIZE=tiny, and their numbers
agree with references computed here, outside the notebook: closed forms (the Gaussian closure's
moment ODEs integrated in NumPy, the blow-up time, E|x̄ − α|² = tr Σ/n, the Monte Carlo rate
n^{-1/2}), the truth a fit should recover, an unvmapped solve, an exact-kernel solve.

Each test appends one cell to the notebook that prints the values it needs from the kernel's
namespace as JSON (some computed there, with the notebook's own objects), and reads them back.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"
MARK = "@@tutorial-values@@"


def execute(name: str, extract: str, tmp_path, monkeypatch, timeout: int = 1200) -> dict:
    """Run ``docs/tutorials/NAME.ipynb`` at the tiny size in ``tmp_path`` (its working directory)
    and return the JSON value of the expression ``extract`` evaluated after its last cell."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("TP_TUTORIAL_SIZE", "tiny")
    # the kernel must import this checkout, not whatever transformer_pde is installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        "import json as _json, numpy as _np\n"
        f"_v = {extract}\n"
        f"print({MARK!r} + _json.dumps(_v, default=lambda a: _np.asarray(a).tolist()))"))
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert MARK in text, text
    values = json.loads(text.split(MARK, 1)[1])
    values["_notebook"] = nb
    return values


def _figures(nb) -> int:
    return sum(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_every_tutorial_has_the_size_knob_and_stored_outputs():
    """One size knob, read once in the first code cell; outputs stored (the site does not
    execute notebooks); no private module imported."""
    nbformat = pytest.importorskip("nbformat")
    names = sorted(p.stem for p in TUTORIALS.glob("*.ipynb"))
    assert names == ["clustering_tour", "convergence", "fitting", "gaussian_closure", "large_n",
                     "phase_diagram"]
    for name in names:
        nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert 'SIZE = os.environ.get("TP_TUTORIAL_SIZE", "default")' in code[0].source, name
        assert sum("TP_TUTORIAL_SIZE" in c.source for c in code) == 1, name
        assert not any("._" in line and "import" in line for c in code for line in c.source.splitlines()), name
        assert all(c.get("execution_count") for c in code), f"{name}: a code cell was not executed"
        assert not any(o.get("output_type") == "error" for c in code for o in c.outputs), name
        assert _figures(nb) >= 1, name
    total = sum(p.stat().st_size for p in TUTORIALS.glob("*.ipynb"))
    assert total < 3_000_000, total


def _closure_rk4(Q, K, V, mean, cov, t1, steps=2000):
    """Softmax attention on N(α, Σ) (euclidean.md §4): Γ(x) = V(α + ΣAx), A = K^T Q (β = 1), so
    α' = VΣAα + Vα, Σ' = JΣ + ΣJ^T with J = VΣA; classical RK4 in NumPy."""
    A = K.T @ Q

    def f(a, S):
        J = V @ S @ A
        return J @ a + V @ a, J @ S + S @ J.T

    a, S, h = np.array(mean, float), np.array(cov, float), t1 / steps
    for _ in range(steps):
        k1 = f(a, S)
        k2 = f(a + h / 2 * k1[0], S + h / 2 * k1[1])
        k3 = f(a + h / 2 * k2[0], S + h / 2 * k2[1])
        k4 = f(a + h * k3[0], S + h * k3[1])
        a = a + h / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
        S = S + h / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
    return a, S


@pytest.mark.slow
def test_gaussian_closure_tutorial(tmp_path, monkeypatch):
    v = execute("gaussian_closure", "dict(Q=Q, K=K, V=V, mean0=g0.mean, cov0=g0.cov, mean1=closure['softmax'][0][-1], "
                "cov1=closure['softmax'][1][-1], gh_error=errors['softmax'], slope=slope, A=A, "
                "blowup=float(sol.blowup_time), nan=bool(np.isnan(np.asarray(sol.covs)).any()))",
                tmp_path, monkeypatch)
    Q, K, V = (np.array(v[k]) for k in "QKV")
    mean1, cov1 = _closure_rk4(Q, K, V, v["mean0"], v["cov0"], 1.0)
    np.testing.assert_allclose(v["mean1"], mean1, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(v["cov1"], cov1, rtol=1e-6, atol=1e-9)
    assert v["gh_error"] < 1e-8  # 12² Gauss–Hermite particles carry the closure
    assert abs(v["slope"] + 0.5) < 0.3  # Monte Carlo rate, 2 sizes and 4 seeds
    # V = I: Σ(t) = (Σ0^{-1} − t(A + A^T))^{-1} blows up at 1/λ_max(Σ0^{1/2}(A + A^T)Σ0^{1/2})
    A, S0 = np.array(v["A"]), np.array(v["cov0"])
    w, U = np.linalg.eigh(S0)
    root = U @ np.diag(np.sqrt(w)) @ U.T
    tstar = 1.0 / np.linalg.eigvalsh(root @ (A + A.T) @ root).max()
    assert abs(v["blowup"] - tstar) < 1e-5 * tstar
    assert not v["nan"]
    assert _figures(v["_notebook"]) == 3


@pytest.mark.slow
def test_convergence_tutorial(tmp_path, monkeypatch):
    v = execute("convergence", "dict(ns=res.ns, mean0=res.errors['mean'][:, :, 0], tr=float(jnp.trace(law.cov)), "
                "bw0=res.rates('bw', 0).slope, bw1=res.rates('bw', -1).slope, coupling=res.rates('coupling', -1).slope, "
                "circle_mean=res_c.rates('mean', -1).slope, circle_ref=float(np.max(res_c.reference_error['mean'])), "
                "circle_err=float(np.min(res_c.errors['mean'][:, :, -1])))",
                tmp_path, monkeypatch)
    # t = 0 is pure sampling: E|x̄ − α|² = tr Σ / n for n i.i.d. samples
    ns, e0 = np.array(v["ns"]), np.array(v["mean0"])
    assert abs(np.mean(ns[:, None] * e0**2) / v["tr"] - 1) < 0.5
    for key in ("bw0", "bw1", "coupling"):  # the Monte Carlo rate n^{-1/2}
        assert abs(v[key] + 0.5) < 0.2, (key, v[key])
    assert abs(v["circle_mean"] + 0.5) < 0.3, v["circle_mean"]
    assert v["circle_ref"] < 1e-3 * v["circle_err"]  # the quadrature reference is far finer
    assert _figures(v["_notebook"]) == 2


@pytest.mark.slow
def test_fitting_tutorial(tmp_path, monkeypatch):
    v = execute("fitting", "dict(V_fit=V_fit, V_true=V_true, losses=losses, final=final, beta_fit=beta_fit, "
                "beta_losses=fit_beta.losses, beta_final=fit_beta.final_loss)", tmp_path, monkeypatch)
    # 60 Adam steps (tiny) cut the loss 100-fold but do not yet recover V (at the stored 400 steps
    # max |V_fit - V_true| = 4e-3); the scalar beta is recovered at the tiny size (3.20 after 30 steps)
    assert v["final"] < 1e-2 * v["losses"][0]
    assert v["beta_final"] < 1e-2 * v["beta_losses"][0]
    assert abs(v["beta_fit"] - 3.0) < 0.3
    assert _figures(v["_notebook"]) == 2


@pytest.mark.slow
def test_phase_diagram_tutorial(tmp_path, monkeypatch):
    # one grid point recomputed without the sweep's vmap; gradients against a finer difference
    v = execute("phase_diagram", "dict(swept=float(pairs.sel(beta=P['betas'][1], seed=1, H=2).isel(dim_0=-1)), "
                "direct=float(run(float(P['betas'][1]), 1, 2)['pairs'][-1]), shape=list(pairs.shape), "
                "grad=dorder.values, fd=[float((order_at_t(b + 1e-4) - order_at_t(b - 1e-4)) / 2e-4) for b in grid])",
                tmp_path, monkeypatch)
    assert v["shape"] == [2, 4, 2, 7]
    assert abs(v["swept"] - v["direct"]) < 1e-9
    np.testing.assert_allclose(v["grad"], v["fd"], rtol=1e-4, atol=1e-7)
    assert _figures(v["_notebook"]) == 1


@pytest.mark.slow
def test_large_n_tutorial(tmp_path, monkeypatch):
    # the automatic kernel's answer against the exact kernel on the same tokens
    v = execute("large_n", "dict(n=P['n'], overlap=overlap, exact=np.asarray(tp.solve(tp.Sphere("
                "tp.SoftmaxAttention.identity(3, beta, backend=tp.kernels.Exact())), x0, t1=P['t1'], dt0=P['dt'], "
                "solver=diffrax.Euler(), saveat=diffrax.SaveAt(ts=ts, fn=stats)).stats['overlap']))",
                tmp_path, monkeypatch)
    np.testing.assert_allclose(v["overlap"], v["exact"], rtol=1e-6)
    assert np.all(np.diff(v["overlap"]) > 0)  # the tokens gather
    assert v["overlap"][0] < 10.0 / v["n"]  # E|x̄|² = 1/n for uniform tokens
    assert _figures(v["_notebook"]) == 1


@pytest.mark.slow
def test_clustering_tour_tutorial(tmp_path, monkeypatch):
    v = execute("clustering_tour", "dict()", tmp_path, monkeypatch)
    nb = v["_notebook"]
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "clustering: SA 1 cluster(s), USA 1 cluster(s)" in text  # GLPR: d = 3 ends in one cluster
    assert _figures(nb) >= 6
    assert (tmp_path / "runs" / "tour" / "clustering-tiny" / "metadata.json").exists()
