"""Krause attention at large n: one velocity evaluation on several layouts.

    python benchmarks/krause.py --n 16384 32768 65536 --radius 0.02 --top-k 0 --layouts streaming spatial \
        --out benchmarks/results/krause-spatial

``tp.KrauseAttention.identity(d, sigma, radius, top_k)`` on n tokens uniform in [0, 1]^d
(float32), its velocity under ``jax.jit`` on each of ``--layouts``:

- ``dense``: ``tp.kernels.Dense()``, the n x n scores;
- ``streaming``: ``tp.kernels.Streaming(key_block=512, query_block=256)``, every tile pair (the
  default ``KRAUSE_LAYOUT`` before spatial tiles);
- ``spatial``: the default ``KRAUSE_LAYOUT``, ``SpatialTiles`` of 128 x 128: Morton-sorted tiles,
  key tiles farther than the radius from a query tile skipped.

Reported per case: the median wall time of ``--repeats`` evaluations after compilation, XLA's
buffer assignment (temporaries + output, ``compiled.memory_analysis()``), the tile pairs computed
against all of them (``KrauseAttention.tile_visits``), and the max difference from the first
layout. A dense case whose n x n float32 scores exceed ``--dense-max-bytes`` is skipped.
``--top-k 0``: no top-k (radius only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import transformer_pde as tp
from transformer_pde.models.attention.krause import KRAUSE_LAYOUT

LAYOUTS = {"dense": tp.kernels.Dense(), "streaming": tp.kernels.Streaming(key_block=512, query_block=256),
           "spatial": KRAUSE_LAYOUT}


def case(n, d, layout, radius, top_k, repeats):
    attn = tp.KrauseAttention.identity(d, sigma=0.1, radius=radius, top_k=top_k, layout=layout)
    x = jax.random.uniform(jax.random.key(0), (n, d), dtype=jnp.float32)
    compiled = jax.jit(lambda a, y: a.velocity(y)).lower(attn, x).compile()
    mem = compiled.memory_analysis()
    out = jax.block_until_ready(compiled(attn, x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(attn, x))
        times.append(time.perf_counter() - t0)
    visits, pairs = jax.jit(lambda a, y: a.tile_visits(y, y))(attn, x)
    return out, {"seconds": statistics.median(times), "all_seconds": times,
                 "xla_bytes": None if mem is None else int(mem.temp_size_in_bytes + mem.output_size_in_bytes),
                 "tile_pairs_computed": int(visits), "tile_pairs": int(pairs)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--d", type=int, default=2)
    p.add_argument("--radius", type=float, default=0.1)
    p.add_argument("--top-k", type=int, default=32)
    p.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=["dense", "streaming", "spatial"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dense-max-bytes", type=float, default=8e9)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    top_k = a.top_k or None
    rows = []
    for n in a.n:
        row, first = {"n": n, "d": a.d, "radius": a.radius, "top_k": top_k}, None
        for name in a.layouts:
            if name == "dense" and 4.0 * n * n * a.d > a.dense_max_bytes:
                row[name] = {"skipped": f"n x n x d float32 > {a.dense_max_bytes:g} bytes"}
                continue
            out, row[name] = case(n, a.d, LAYOUTS[name], a.radius, top_k, a.repeats)
            if first is None:
                first = out
            else:
                row[name]["max_abs_difference_from_first"] = float(jnp.max(jnp.abs(out - first)))
            print(json.dumps({"n": n, name: row[name]}), flush=True)
        rows.append(row)
    a.out.mkdir(parents=True, exist_ok=True)
    load = open("/proc/loadavg").read().split()[:3]
    (a.out / "results.json").write_text(json.dumps({"rows": rows, "loadavg": load, "jax": jax.__version__,
                                                    "argv": argv}, indent=1))


if __name__ == "__main__":
    main()
