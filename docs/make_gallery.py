"""Regenerate the gallery: run every registered experiment at its ``tiny`` size through the
public command line, copy its figure to ``docs/gallery/NAME.png`` and write ``docs/gallery.md``.

    python docs/make_gallery.py                 # every experiment, then the page
    python docs/make_gallery.py kde-modes ...   # only these experiments, then the page
    python docs/make_gallery.py --page-only     # only rewrite docs/gallery.md

Each run is ``python -m transformer_pde.cli run NAME --out DIR --no-progress --replace`` followed
by the experiment's ``tiny`` options written as command-line flags; the exact command is
printed on the page next to the figure, with the command of the published size
(``transformer-pde run NAME``). Runs go one after another (the figures are small; a run takes
well under a minute on two CPU cores). The text of each entry is :data:`ENTRIES` below: an
experiment registered without an entry stops this script (and fails
``tests/docs/test_gallery.py``), so a new experiment needs a gallery entry.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GALLERY = ROOT / "docs" / "gallery"
PAGE = ROOT / "docs" / "gallery.md"
MAX_BYTES = 200_000

#: name -> (what the figure shows, the paper(s) it reproduces). Two or three sentences each.
ENTRIES: dict[str, tuple[str, str]] = {
    'causal-clustering': (
        "Causal self-attention on the sphere (token k attends to tokens j ≤ k) with Q = K = V = I: every token converges to the first token's starting point x₁(0). At larger β the tokens first gather in metastable clusters around the strong Rényi centers; the figure sets their count against the closed-form expected Rényi-parking number.",
        'Causal attention on the sphere, arXiv 2411.04990.'),
    'clustering': (
        'Tokens uniform on S², Q = K = V = I, under softmax self-attention (SA) and its unnormalized variant (USA): snapshots of the tokens and the number of clusters against time. For d ≥ 3 almost every start collapses to a single cluster, for every β (the run also writes an animation).',
        'Geshkovski–Letrouit–Polyanskiy–Rigollet, arXiv 2312.10794 (and 2305.05465).'),
    'convergence': (
        'Distance of the n-particle system to the mean field (the Transformer PDE) against n and t, with fitted rates and bootstrap bands: the Gaussian closure, a stationary law or a deterministic quadrature rule is the reference. The errors decay at the Monte Carlo rate n^{-1/2}; tracers split them into sampling and coupling errors.',
        'Mean-field limit of Castin–Ablin–Carrillo–Peyré, arXiv 2501.18322 (§3–4).'),
    'convergence-moving': (
        'The same study for a law that moves: 1 + 0.2 cos 2θ on the circle under SA at β = 9, where the uniform law is unstable and clusters form. The reference is the deterministic quadrature rule evolved as weighted tokens (its own error, estimated by refinement, far below the distances), the distance is the exact W₁ on the circle; the report gives the growth of the distance in t and the time each n leaves the mean field.',
        'Mean-field limit (Castin–Ablin–Carrillo–Peyré, arXiv 2501.18322); instability of the uniform law on S¹ (Geshkovski–Letrouit–Polyanskiy–Rigollet, arXiv 2312.10794).'),
    'energy-flow': (
        "With QᵀK = V = ±D the dynamics on the sphere is the gradient ascent or descent of the interaction energy E = (1/2β)∬e^{β⟨x,Dy⟩}dμdμ. The figure shows which measures the flows reach (Diracs, antipodal pairs, uniform-like spreads) depending on the signs of D's eigenvalues, and the four-particle equilibrium against its root.",
        'Burger–Kabri–Korolev–Roith–Weigand, arXiv 2501.03096.'),
    'equiangular': (
        'Orthogonal starts (d ≥ n) stay equiangular: all inner products equal one ρ(t), which solves a scalar ODE. Particles (SA and USA) against the reduced ODE, and the local rates 2 (SA) and 2e^β (USA) near ρ = 1.',
        'Geshkovski–Letrouit–Polyanskiy–Rigollet, arXiv 2312.10794.'),
    'gaussian-anisotropy': (
        "Covariance trajectories of the Gaussian closure in d = 2, drawn in the PSD cone (rank-one matrices on its boundary), for softmax, ℓ², multi-head and Sinkhorn attention. Five regimes of the authors' figure: collapse to 0, to a line, to two lines, and finite-time blow-up.",
        'Castin–Ablin–Carrillo–Peyré, arXiv 2501.18322 (§4–6).'),
    'instability': (
        'Growth rates of the modes cos kθ of a perturbed uniform law on the circle, measured with the spectral Fokker–Planck solver and with weighted deterministic particles, against the Funk–Hecke formula λ_k = k²(K g_k − σ²/2). Unstable low modes and stable high modes match the linearization.',
        'Geshkovski–Letrouit–Polyanskiy–Rigollet, arXiv 2312.10794 (noiseless rates); Shalova–Schlichting, arXiv 2412.14813 (noise).'),
    'interpolation': (
        'A Transformer with perceptron layers on S², its parameters piecewise constant in time, trained with Adam through the solver to carry N input measures (caps) to N target measures; the loss is the Sinkhorn divergence. The figure shows inputs, outputs, targets and the loss curve.',
        'Geshkovski–Rigollet–Ruiz-Balet, measure-to-measure interpolation, arXiv 2411.04551.'),
    'bipodal': (
        'n tokens uniform on S¹ under self-attention with β = 1, Q = V = I, K = diag(a, b): they gather in two antipodal clusters along the dominant axis of K, a saddle left at the rate λ = 2/(e^{2γ*} + 1) from a defect of the size of the sampling noise, so the bipodal phase lasts C ln n + D. Left: phase lengths per seed against ln n, the fitted line with its bootstrap interval for C, the derived slope (e^{2γ*} + 1)/4. Right: one run, the defect |δ| growing as e^{λt} inside the phase.',
        'Menon–Murray, metastability in transformer attention dynamics (vasumenon.pages.dev/projects/metastability-transformer-attention; no arXiv number found); the model: Geshkovski–Letrouit–Polyanskiy–Rigollet, arXiv 2312.10794.'),
    'kde-modes': (
        'Number of modes of a Gaussian kernel density estimate of n samples against the √(β log β) law, and the number of metastable clusters of one-dimensional self-attention (the blurring mean shift) started from the same samples.',
        'Gaussian KDE modes and attention, arXiv 2412.09080.'),
    'krause': (
        'Krause (bounded-confidence) attention on [0, 1] with Q = K = V = I: tokens started evenly spaced, moved until they stop, for a grid of confidence radii r. The final positions against r draw the Hegselmann–Krause bifurcation diagram: clusters about 2r apart (their number close to 1/(2r)) for small r, consensus for large r.',
        'Liu–Yue–Welling–Song, Krause Synchronization Transformers, arXiv 2602.11534.'),
    'multi-head': (
        'Scalar multi-head attention (head h: score β a_h⟨x, y⟩, value w_h) on orthogonal starts: the common inner product ρ(t) of the particles against the multi-head reduced ODE; a selective head against a uniform repulsive one gives one cluster below the closed-form critical β_c and the regular simplex above; two heads of different selectivity reach ρ = 0.9 faster together than the sum of their rates alone (super-additive rates, by quadrature and on the particles).',
        'Pendharkar, Gradient flow structure and quantitative dynamics of multi-head self-attention, arXiv 2605.04279 (reduced ODE, β_c and the rate inequality derived in docs/math/sphere.md).'),
    'large-n': (
        '10⁶ tokens uniform on S² under self-attention (Q = K = V = I), integrated as residual layers with the fast NUFFT kernel: snapshots of a random subsample and the mean overlap |x̄|² and the largest angle to the mean direction against depth. All tokens collapse to one cluster, as the theorem for d ≥ 3 says.',
        'Geshkovski–Letrouit–Polyanskiy–Rigollet, arXiv 2312.10794.'),
    'long-context': (
        'A fixed query against n i.i.d. uniform keys on S^{d−1}, streamed in chunks: the effective number of keys e^H against β in units of n^{2/(d−1)}, of log n and of the gap-counting scale (only the first makes the curves of all n fall on one, the Poisson limit), the entropy-collapse point β_n* against n with the three laws, and its fitted exponent per d with a bootstrap interval against 2/(d−1).',
        'Bruno–Rigollet–Chen–Polyanskiy–Lin, arXiv 2605.08505; Chen–Lin–Polyanskiy–Rigollet, arXiv 2510.05554; Hayase–Karakida, arXiv 2605.12697.'),
    'lost-in-the-middle': (
        'The retrieval profile of causal attention with ALiBi weights on the circle: Monte Carlo over particle simulations against the closed form S_t(σ₀) (Bessel functions) and the mean field. The accuracy is U-shaped in the source position: tokens in the middle are lost.',
        'Duerinckx–Geshkovski–Rossi, Lost in the middle, arXiv 2605.09213.'),
    'metastability': (
        'Tokens in caps on the circle leave them only after times growing like e^{(1−cos θ₀)β}; measured exit times against the prediction. The normalized energy against rescaled time climbs a staircase whose plateaus are Σ(m_k/n)² for clusters of sizes m_k.',
        'Geshkovski–Koubbi–Polyanskiy–Rigollet, dynamic metastability, arXiv 2410.06833.'),
    'noisy-transition': (
        'Noisy USA on the circle: stationary branches computed by Newton continuation of the Fokker–Planck equation, their folds, and the (β, K) phase diagram. The transition from the uniform law is continuous for β < β* ≈ 2.447 and discontinuous beyond, with a bistable window [K_c, K_#].',
        'Mun–Rosenzweig, arXiv 2606.05140 and 2604.16288; Shalova–Schlichting, arXiv 2412.14813; Balasubramanian–Banerjee–Rigollet, arXiv 2510.20094.'),
    'gaussian-control': (
        'Softmax attention with an affine feed-forward keeps Gaussians Gaussian; its controls (Q, K, V, W, b), piecewise constant over L layers, are fitted by L-BFGS through the moment ODEs so that N(0, I) reaches a random Gaussian of the same rank: W₂ against iteration, and the ellipses along the layers. From a rank-one start the fit stalls at the bound (Σ_{i>r} λ_i(Σ*))^{1/2}: the rank is invariant.',
        'Alcalde–Ji–Zuazua, Reachability and asymptotics of Gaussian Transformer dynamics, arXiv 2606.07600.'),
    'normalization': (
        'The same multi-head attention inside post-LN, projected, Pre-LN, Peri-LN, Mix-LN, nGPT and LN-scaling layers: the fraction of clustered pairs and the token speed against depth. Normalization acts as speed regulation: the schemes differ in how fast, not whether, tokens cluster.',
        'Karagodin–Ge–Polyanskiy–Rigollet, Normalization in Attention Dynamics, arXiv 2510.22026.'),
    'normalizing-flow': (
        'Perceptron controls w σ(aᵀx + b) (16 tanh neurons per piece), piecewise constant in time, transport N(0, I) to a two-moon mixture and a Student t in R²; the density is carried along the characteristics and coloured at fresh pushed samples, with the relative entropy KL(ρ(T) ‖ ρ*) on those fresh samples for 0, 1 and 3 switches (each warm-started from the previous fit). Made at the published size: the tiny run leaves the base a blob.',
        "Álvarez-López–Geshkovski–Ruiz-Balet, Constructive approximate transport maps with normalizing flows, arXiv 2412.19366 (Appl. Math. Optim. 92, 2025)."),
    'perceptron': (
        'USA attention plus a ReLU perceptron on the circle, in the gradient case: the descent flow from the uniform measure ends on a few atoms whose positions and masses do not depend on the number of tokens, and the atomic measure solves the stationarity equation.',
        'Perceptron block, arXiv 2601.21366.'),
    'phase-diagram': (
        "Self-attention on the circle, n = 32, a batch of random starts, all β at once (vmapped): the fraction of clustered pairs and the number of clusters over (β, t), next to the numbers of the authors' own runs.",
        'Geshkovski–Koubbi–Polyanskiy–Rigollet, arXiv 2410.06833 (phase diagrams); Geshkovski–Letrouit–Polyanskiy–Rigollet, arXiv 2312.10794.'),
    'random-heads': (
        'Multi-head attention with Gaussian heads drawn afresh in every layer: the mean drift vanishes, the chain converges weakly to an Itô SDE with common noise as depth grows, and the overlap of two tokens follows a logistic law.',
        'Koubbi–Geshkovski–Rigollet, homogenized Transformers, arXiv 2604.01978.'),
    'rank-histograms': (
        'Histograms of the ranks of the limit covariances of the Gaussian closure for d = 3, 4, 5 with K = −Q, for softmax and ℓ² attention: the rank never exceeds ⌈d/2⌉, and equals it for V = I.',
        'Castin–Ablin–Carrillo–Peyré, arXiv 2501.18322 (§5–6).'),
    'rd-spectrum': (
        'The unnormalized model in R^d followed in z = e^{−tV}x: for V = I the tokens converge to vertices of a polytope, for a simple top eigenvalue to hyperplanes, for negative spectra to the origin; in d = 1 the attention matrix becomes Boolean with leaders.',
        'Geshkovski–Letrouit–Polyanskiy–Rigollet, emergence of clusters, arXiv 2305.05465.'),
    'spectral-selection': (
        'Symmetric attention (QᵀK = V = Vᵀ) on the sphere from random starts: the share of each eigenvector of V over time; with a dominant positive eigenvalue all tokens align with its eigenvector, with V negative definite they split by sign along the most negative one. Every end state is a pure mode that the closed-form linear stability criterion calls stable; on the circle, V = diag(λ₊, −1), runs end split along e_2 only while λ₊ < tanh β.',
        'Kuehn–Yoon, Spectral selection in symmetric self-attention dynamics, arXiv 2604.26085 (stability criteria derived in docs/math/sphere.md).'),
    'stability': (
        'The support radius and the W₂ stability ratio of two nearby particle systems against the a-priori bounds R(t) ≤ R₀exp(∫‖V‖) and W_p(μ_t, ν_t) ≤ exp(∫L) W_p(μ₀, ν₀), for softmax, ℓ², Sinkhorn and multi-head attention. The measured values stay below the bounds.',
        'Castin–Ablin–Carrillo–Peyré, arXiv 2501.18322 (§3).'),
    'sweep-phase': (
        'The median time to one cluster over (β, d) for self-attention on S^{d−1}, one vmapped sweep per dimension; runs still split at t1 are blank. The time grows quickly with β (metastability); for d = 2 several clusters can persist.',
        'Geshkovski–Letrouit–Polyanskiy–Rigollet, arXiv 2312.10794; Geshkovski–Koubbi–Polyanskiy–Rigollet, arXiv 2410.06833.'),
}


#: experiments whose gallery figure is made at the published size: at the tiny size their figure
#: shows nothing of the result (normalizing-flow: 15 Adam steps leave the base a blob).
PUBLISHED = frozenset({"normalizing-flow"})


def tiny_flags(exp) -> list[str]:
    """The experiment's ``tiny`` overrides as command-line flags (booleans as --x / --no-x)."""
    from transformer_pde.experiments._options import format_value

    flags = []
    for key, value in exp.tiny.items():
        name = key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        else:
            flags += [f"--{name}", format_value(value)]
    return flags


def command(exp, out: str) -> list[str]:
    """The run that makes the gallery figure: the tiny size, or the published one (PUBLISHED)."""
    return ["python", "-m", "transformer_pde.cli", "run", exp.name, "--out", out,
            "--no-progress", "--replace", *([] if exp.name in PUBLISHED else tiny_flags(exp))]


def shell(cmd: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(c) for c in cmd)


def _shrink(png: Path, dest: Path) -> None:
    """Copy ``png`` to ``dest``, halving its resolution until it is under MAX_BYTES."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shutil.copyfile(png, dest)
    img = plt.imread(str(png))
    while dest.stat().st_size > MAX_BYTES:
        h, w = (img.shape[0] // 2) * 2, (img.shape[1] // 2) * 2
        img = img[:h, :w].reshape(h // 2, 2, w // 2, 2, -1).mean(axis=(1, 3))
        plt.imsave(str(dest), img.squeeze() if img.shape[-1] == 1 else img)


def run(names: list[str]) -> None:
    import transformer_pde.experiments as ex

    GALLERY.mkdir(parents=True, exist_ok=True)
    timings = _load_timings()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            exp = ex.get(name)
            out = Path(tmp) / name
            cmd = command(exp, str(out))
            cmd[0] = sys.executable
            print(f"[gallery] {shell(cmd)}", flush=True)
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, cwd=ROOT)
            timings[name] = round(time.perf_counter() - t0, 1)
            figures = json.loads((out / "metadata.json").read_text())["figures"]
            pngs = [out / Path(f).name for f in figures if str(f).endswith(".png")]
            if not pngs:
                raise SystemExit(f"{name}: the run wrote no PNG figure ({figures})")
            _shrink(pngs[0], GALLERY / f"{name}.png")
            print(f"[gallery] {name}: {timings[name]} s, {(GALLERY / f'{name}.png').stat().st_size} bytes",
                  flush=True)
            (GALLERY / "timings.json").write_text(json.dumps(timings, indent=1, sort_keys=True) + "\n")


def _load_timings() -> dict:
    path = GALLERY / "timings.json"
    return json.loads(path.read_text()) if path.exists() else {}


def page() -> str:
    import transformer_pde.experiments as ex

    missing = sorted(set(ex.REGISTRY) - set(ENTRIES))
    if missing:
        raise SystemExit(f"no gallery entry for {missing}: add one to ENTRIES in {__file__}")
    timings = _load_timings()
    lines = [
        "# Gallery",
        "",
        "Every experiment of `transformer-pde list`, with the figure it draws, what the figure",
        "shows and the paper it reproduces. The figures here were made at each experiment's",
        "`tiny` size (the size the test suite runs; a few, where the tiny figure shows nothing, at the",
        "published size), by the command printed under each figure",
        "(the times quoted were measured on a 2-core machine shared with other jobs); the",
        "published size is the plain `transformer-pde run NAME`",
        "(its options and their defaults: `transformer-pde run NAME --help`). Tiny runs are",
        "small and short, so their figures are rougher than the published ones.",
        "",
        "Regenerate every figure and this page with `python docs/make_gallery.py` (one run after",
        "another; `python docs/make_gallery.py NAME ...` for a few).",
        "",
    ]
    for name in sorted(ex.REGISTRY):
        exp = ex.REGISTRY[name]
        shows, paper = ENTRIES[name]
        took = f", {timings[name]:.0f} s on 2 shared CPU cores" if name in timings else ""
        size = "published size" if name in PUBLISHED else "tiny size"
        lines += [
            f"## {name}",
            "",
            f"*{exp.summary}*",
            "",
            f"![{name}](gallery/{name}.png)",
            "",
            shows,
            "",
            f"**Paper:** {paper}",
            "",
            f"The figure above ({size}{took}):",
            "",
            "```sh",
            shell(command(exp, f"runs/{name}-{size.split()[0]}")).replace("python -m transformer_pde.cli",
                                                                          "transformer-pde"),
            "```",
            "",
            "Published size:",
            "",
            "```sh",
            f"transformer-pde run {name}",
            "```",
            "",
        ]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="experiments to run (default: all)")
    p.add_argument("--page-only", action="store_true", help="only rewrite docs/gallery.md")
    p.add_argument("--no-page", action="store_true", help="only run and copy figures")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import transformer_pde.experiments as ex

    if not args.page_only:
        run(args.names or sorted(ex.REGISTRY))
    if not args.no_page:
        PAGE.write_text(page())
        print(f"[gallery] wrote {PAGE}")


if __name__ == "__main__":
    main()
