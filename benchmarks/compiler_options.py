"""XLA's LLVM optimization level for small-system programs (issue 24): compiling and running
phase-diagram's grid program and normalization's state program at the default level and at
``--levels`` (``xla_backend_optimization_level``), each in this process, outputs compared bitwise.

    python benchmarks/compiler_options.py                       # the peers' settings (minutes)
    python benchmarks/compiler_options.py --pd-n 128 --pd-batch 64 --skip-normalization
    python benchmarks/compiler_options.py --tiny                # seconds (the test)

phase-diagram compiles its grid at level 1 on a CPU (``phase_diagram.CPU_COMPILER_OPTIONS``); the
normalization programs keep the default. Prints one JSON object: per program and level, the
seconds to compile, the median of ``--repeats`` runs, and whether every output equals the
default level's bit for bit. The compile time is XLA's alone (tracing and lowering do not depend
on the level).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from transformer_pde.experiments import get, normalization, phase_diagram


def _time(jitted, args, repeats, static):
    lowered = jitted.trace(*args).lower()  # untimed: tracing does not depend on the level
    start = time.perf_counter()
    compiled = lowered.compile()
    args = args[static:]  # the compiled program takes the dynamic arguments only
    compile_s = time.perf_counter() - start
    out = jax.block_until_ready(compiled(*args))
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        runs.append(time.perf_counter() - start)
    leaves = [np.asarray(a) for a in jax.tree.leaves(out)]
    return {"compile_s": compile_s, "run_s": statistics.median(runs)}, leaves


def _compare(name, make, args, levels, repeats, static=0):
    rows, reference = {}, None
    for level in (None, *levels):
        options = {} if level is None else {"xla_backend_optimization_level": level}
        row, leaves = _time(make(options), args, repeats, static)
        if reference is None:
            reference = leaves
        row["bitwise_same_as_default"] = all(np.array_equal(a, b, equal_nan=True)
                                             for a, b in zip(leaves, reference, strict=True))
        rows["default" if level is None else f"level {level}"] = row
    return {name: rows}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pd-n", type=int, default=32)
    p.add_argument("--pd-batch", type=int, default=256)
    p.add_argument("--skip-normalization", action="store_true")
    p.add_argument("--tiny", action="store_true", help="small sizes (seconds)")
    args = p.parse_args(argv)
    report = {"backend": jax.default_backend(), "dtype": str(jnp.asarray(1.0).dtype)}

    pd_cfg = get("phase-diagram").make_config(
        n=args.pd_n, batch=8 if args.tiny else args.pd_batch, num_betas=4, t1=3.0 if args.tiny else 30.0,
        num_saves=7 if args.tiny else 61)
    rows = tuple(phase_diagram.histogram_betas(np.linspace(pd_cfg.beta_min, pd_cfg.beta_max, pd_cfg.num_betas)))
    report.update(_compare(f"phase-diagram (n = {pd_cfg.n}, {pd_cfg.batch} starts, 4 β, t = {pd_cfg.t1:g})",
                           lambda o: jax.jit(phase_diagram._summaries, static_argnums=(0, 1), compiler_options=o),
                           (pd_cfg, rows), args.levels, args.repeats, static=2))

    if not args.skip_normalization:
        cfg = get("normalization").make_config(schemes=("post-ln",), masks=("none",), betas=(5.0,),
                                               seeds=4 if args.tiny else 64, t1=1.0 if args.tiny else 20.0)
        (scheme,) = normalization.make_schemes(cfg)
        x0, Q, K = (jnp.asarray(a) for a in normalization.draws(cfg))

        def make(options):
            def one(beta, x, q, k):
                return scheme.run(normalization.attention(q, k, beta, False), x, cfg.num_layers, cfg.step).xs
            return jax.jit(jax.vmap(one, in_axes=(None, 0, 0, 0)), compiler_options=options)

        report.update(_compare(f"normalization post-LN states (d = {cfg.d}, n = {cfg.n}, {cfg.heads} heads, "
                               f"{cfg.seeds} draws, t = {cfg.t1:g})", make,
                               (jnp.asarray(5.0, x0.dtype), x0, Q, K), args.levels, args.repeats))
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
