"""The fold K_c(β, d) of the noisy USA on S^{d−1} and the order parameter there (issue 40 item 4).

Zonal continuation (``tp.stationary.critical_coupling``, σ = 1, the K-scaled USA of Mun–Rosenzweig)
for d = 3, 4, 8 and β on a grid above β_*^{(d)}. Each entry is computed at degree L (the smallest of
48, 96, 192, 384 that reaches the fold) and again at 2L; the table states both differences. Writes
a Markdown table (and JSON) to ``--out``; docs/math/fold_table.md holds its output.

    python benchmarks/fold_table.py [--out DIR] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import transformer_pde as tp  # noqa: E402
from transformer_pde.theory.noisy_sphere import NoisyUSA, critical_beta, critical_coupling  # noqa: E402

GRID = {3: (2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0), 4: (2.0, 2.5, 3.0, 4.0, 5.0, 6.0), 8: (1.5, 2.0, 2.5, 3.0)}
TINY = {3: (4.0,)}


def fold(d, beta, degree):
    return tp.stationary.critical_coupling(tp.Sphere(tp.UnnormalizedAttention.identity(d, beta)), 1.0, degree=degree)


def entry(d, beta, degrees=(48, 96, 192, 384)):
    for L in degrees:
        try:
            f = fold(d, beta, L)
        except tp.solvers.UnderResolvedError:
            continue
        f2 = fold(d, beta, 2 * L)
        return dict(d=d, beta=beta, K_sharp=f.K_sharp, K_sharp_closed=float(critical_coupling(beta, d)), K_c=f.K_c,
                    order=f.order, width=f.width, ratio=f.K_c / f.K_sharp, degree=L, dK=abs(f.K_c - f2.K_c),
                    dorder=abs(f.order - f2.order))
    raise tp.solvers.UnderResolvedError(f"d = {d}, beta = {beta}: no degree up to {degrees[-1]} reaches the fold")


def markdown(rows, stars):
    out = ["| d | β | K_# | K_c | K_c/K_# | K_# − K_c | ⟨cos ϑ⟩ at K_c | L | \\|K_c(L) − K_c(2L)\\| | "
           "\\|⟨cos ϑ⟩(L) − ⟨cos ϑ⟩(2L)\\| |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['d']} | {r['beta']:g} | {r['K_sharp']:.8f} | {r['K_c']:.8f} | {r['ratio']:.6f} | "
                   f"{r['width']:.3e} | {r['order']:.6f} | {r['degree']} | {r['dK']:.1e} | {r['dorder']:.1e} |")
    out.append("")
    out.append("β_*^{(d)}: " + ", ".join(f"d = {d}: {b:.6f}" for d, b in stars.items()))
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--tiny", action="store_true", help="d = 3, beta = 4 only")
    a = p.parse_args(argv)
    grid = TINY if a.tiny else GRID
    stars = {d: critical_beta(NoisyUSA, d) for d in grid}
    rows, t0 = [], time.perf_counter()
    for d, betas in grid.items():
        for beta in betas:
            assert beta > stars[d], (d, beta)
            rows.append(entry(d, beta))
            print(rows[-1], f"{time.perf_counter() - t0:.0f} s", flush=True)
    md = markdown(rows, stars)
    print(md)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "fold_table.md").write_text(md + "\n")
        (a.out / "fold_table.json").write_text(json.dumps({"rows": rows, "beta_star": stars}, indent=1))


if __name__ == "__main__":
    main()
