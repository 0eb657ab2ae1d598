"""Pair-interaction throughput and peak extra memory of one attention velocity evaluation.

    python benchmarks/bench_kernels.py --out benchmarks/results          # the full table
    python benchmarks/bench_kernels.py --tiny --out /tmp/bench            # smoke (seconds)
    python benchmarks/bench_kernels.py --million --out benchmarks/results # n = 10^6, d = 3

One velocity evaluation is Γ_μ(x_i) = Σ_j softmax_j(β⟨x_i, x_j⟩) x_j for all n tokens
(``SoftmaxAttention.identity(d, β)``, float32, tokens on the unit sphere), i.e. n² pair
interactions; the throughput is n² / (median wall time of one evaluation). In the same run:

* ``transformer_pde``: ``attn.vector_field`` under ``jax.jit`` (automatic dense/streaming path);
* ``naive_jax``: ``softmax(β x xᵀ) @ x`` materialized, under ``jax.jit``;
* ``jax_nn``: ``jax.nn.dot_product_attention(q, k, v, scale=1)`` (XLA implementation);
* ``torch_sdpa``: ``torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1)`` (CPU);
* ``keops``: pykeops ``LazyTensor`` ``(q_i | k_j).sumsoftmaxweight(v_j)``;
* the machine's limits: ``exp`` evaluations/s and float32 matmul GFLOP/s (JAX, same run).

Peak extra memory: each library runs in its own subprocess; before each timed evaluation
the process returns freed heap to the OS (``malloc_trim``) and resets its resident-set
high-water mark (``/proc/self/clear_refs``); extra = peak RSS during the evaluation − RSS
before it. For JAX programs XLA's own buffer assignment (temporaries + output) is reported
too. Cases whose predicted time exceeds ``--budget`` seconds (from the previous n, scaled
by n²) or whose materialized n x n matrix would not fit ``--mem-limit`` are skipped with
the reason recorded. Peers that are not installed are recorded as skipped.

Also: ``--solve`` (default on) times ``tp.solve`` (Euler, n = 16384, d = 3, 100 steps on
the sphere) against 100 bare kernel evaluations: the solver's overhead.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LIBS = ("transformer_pde", "naive_jax", "jax_nn", "torch_sdpa", "keops")
BETA = {3: 4.0, 64: 1.0}


# ------------------------------------------------------------------------------------------
# memory: peak resident set during one call


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _trim():
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # pragma: no cover - not glibc
        pass


def measure_peak(call):
    """(seconds, peak extra bytes or None) of one ``call()``."""
    _trim()
    base = _status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        can_reset = True
    except OSError:
        can_reset = False
    t = time.perf_counter()
    call()
    dt = time.perf_counter() - t
    peak = _status("VmHWM") - base if can_reset else None
    return dt, peak


def timed(call, first: float, target_s: float = 4.0, max_reps: int = 7):
    """Median of repeated timings (the first already measured) within ~``target_s``."""
    times = [first]
    while len(times) < max_reps and sum(times) + first < target_s:
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return float(np.median(times)), len(times)


def sphere_points(n: int, d: int, seed: int = 0):
    x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# ------------------------------------------------------------------------------------------
# one library: build(n, d) -> (call, xla_bytes or None)


def _jax_builder(kind: str):
    import jax
    import jax.numpy as jnp

    import transformer_pde as tp

    def build(n, d):
        beta = BETA[d]
        x = jnp.asarray(sphere_points(n, d))
        if kind == "transformer_pde":
            attn = tp.SoftmaxAttention.identity(d, beta)
            attn = jax.tree.map(lambda a: a.astype(jnp.float32) if hasattr(a, "astype") else a, attn)
            w = jnp.full((n,), 1.0 / n, jnp.float32)
            fn = jax.jit(lambda a, x, w: a.vector_field(x, w, jnp.zeros((), jnp.float32)))
            args = (attn, x, w)
        elif kind == "naive_jax":
            fn = jax.jit(lambda x: jax.nn.softmax(beta * (x @ x.T), axis=-1) @ x)
            args = (x,)
        elif kind == "jax_nn":
            fn = jax.jit(lambda x: jax.nn.dot_product_attention(
                beta * x[None, :, None, :], x[None, :, None, :], x[None, :, None, :],
                scale=1.0)[0, :, 0, :])
            args = (x,)
        compiled = fn.lower(*args).compile()
        mem = compiled.memory_analysis()
        xla = None if mem is None else int(mem.temp_size_in_bytes + mem.output_size_in_bytes)
        return (lambda: jax.block_until_ready(compiled(*args))), xla

    return build


def _torch_builder():
    import torch

    def build(n, d):
        x = torch.from_numpy(sphere_points(n, d))[None, None]
        q = BETA[d] * x
        f = torch.nn.functional.scaled_dot_product_attention

        def call():
            with torch.no_grad():
                return f(q, x, x, scale=1.0)

        return call, None

    return build


def _keops_builder():
    import torch
    from pykeops.torch import LazyTensor

    def build(n, d):
        x = torch.from_numpy(sphere_points(n, d))
        q = LazyTensor((BETA[d] * x)[:, None, :])
        k = LazyTensor(x[None, :, :])

        def call():
            return (q | k).sumsoftmaxweight(k, axis=1)

        return call, None

    return build


def get_builder(lib: str):
    """The builder, or a string saying why the library cannot run here."""
    try:
        if lib in ("transformer_pde", "naive_jax", "jax_nn"):
            return _jax_builder(lib)
        if lib == "torch_sdpa":
            return _torch_builder()
        if lib == "keops":
            b = _keops_builder()
            b(64, 3)[0]()  # compiles (C++) once per formula; failures surface here
            return b
    except Exception as e:  # noqa: BLE001 - any import/compile failure is a recorded skip
        return f"not available: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    raise ValueError(f"unknown library {lib!r}")


def run_library(lib, dims, ns, budget, mem_limit, emit):
    materializes = lib in ("naive_jax", "jax_nn")
    for d in dims:
        builder = get_builder(lib)
        prev = None
        for n in ns:
            row = {"lib": lib, "n": n, "d": d}
            if isinstance(builder, str):
                emit({**row, "skipped": builder})
                continue
            if materializes and 3 * 4 * n * n > mem_limit:
                emit({**row, "skipped": f"materializes n x n: ~{3 * 4 * n * n / 2**30:.0f} GiB "
                                        f"> --mem-limit {mem_limit / 2**30:.0f} GiB"})
                continue
            if prev is not None and prev[1] * (n / prev[0]) ** 2 > budget:
                emit({**row, "skipped": f"predicted {prev[1] * (n / prev[0]) ** 2:.0f} s > "
                                        f"--budget {budget:.0f} s"})
                continue
            call, xla = builder(n, d)
            first, peak = measure_peak(call)
            sec, reps = timed(call, first)
            prev = (n, sec)
            emit({**row, "seconds": sec, "reps": reps, "pairs_per_s": n * n / sec,
                  "peak_extra_bytes": peak, "xla_bytes": xla})
            del call
            _trim()


# ------------------------------------------------------------------------------------------
# machine limits and the solve overhead


def machine_limits():
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(np.random.default_rng(0).random(1 << 16).astype(np.float32))

    @jax.jit
    def exps(x):  # 256 passes over an L2-resident vector: exp throughput, not memory
        return jax.lax.fori_loop(0, 256, lambda i, s: s + jnp.exp(x - i * 1e-3), jnp.zeros_like(x))

    a = jnp.asarray(np.random.default_rng(1).random((2048, 2048)).astype(np.float32))
    mm = jax.jit(lambda a: a @ a)
    out = {}
    for name, fn, arg, work in (("exp_per_s", exps, x, x.size * 256),
                                ("matmul_flop_per_s", mm, a, 2 * 2048**3)):
        jax.block_until_ready(fn(arg))
        ts = []
        for _ in range(7):
            t = time.perf_counter()
            jax.block_until_ready(fn(arg))
            ts.append(time.perf_counter() - t)
        out[name] = work / float(np.median(ts))
    return out


def solve_overhead(n: int, d: int, steps: int, rounds: int = 3):
    import diffrax
    import jax
    import jax.numpy as jnp

    import transformer_pde as tp

    x0 = jnp.asarray(sphere_points(n, d))
    attn = tp.SoftmaxAttention.identity(d, BETA[d])
    attn = jax.tree.map(lambda a: a.astype(jnp.float32) if hasattr(a, "astype") else a, attn)
    dyn = tp.Sphere(attn)
    w = jnp.full((n,), 1.0 / n, jnp.float32)
    kernel = jax.jit(lambda x: attn.vector_field(x, w, jnp.zeros((), jnp.float32)))
    dt = 0.01

    def run():
        sol = tp.solve(dyn, x0, t1=steps * dt, dt0=dt, solver=diffrax.Euler())
        return jax.block_until_ready(sol.final)

    # the same 100 kernel evaluations inside one jitted loop (Euler + retraction by hand):
    # separates diffrax's bookkeeping from XLA's cost of running the kernel inside a loop
    loop = jax.jit(lambda x: jax.lax.fori_loop(
        0, steps, lambda i, x: tp.normalize(x + dt * dyn.vector_field(x, w, dt * i)), x))

    run()  # compile
    jax.block_until_ready(kernel(x0))
    jax.block_until_ready(loop(x0))
    t_solve, t_kernel, t_loop = [], [], []
    for _ in range(rounds):  # interleaved: the machine is shared and its load drifts
        t = time.perf_counter()
        run()
        t_solve.append(time.perf_counter() - t)
        t = time.perf_counter()
        jax.block_until_ready(loop(x0))
        t_loop.append(time.perf_counter() - t)
        for _ in range(5):
            t = time.perf_counter()
            jax.block_until_ready(kernel(x0))
            t_kernel.append(time.perf_counter() - t)
    ts, tk, tl = (float(np.median(a)) for a in (t_solve, t_kernel, t_loop))
    return {"n": n, "d": d, "steps": steps, "solve_seconds": ts, "kernel_seconds": tk,
            "loop_seconds": tl, "overhead": ts / (steps * tk) - 1.0,
            "overhead_vs_loop": ts / tl - 1.0}


def million(n: int = 10**6, d: int = 3):
    import jax
    import jax.numpy as jnp

    import transformer_pde as tp

    x = jnp.asarray(sphere_points(n, d))
    attn = tp.SoftmaxAttention.identity(d, BETA[d])
    attn = jax.tree.map(lambda a: a.astype(jnp.float32) if hasattr(a, "astype") else a, attn)
    w = jnp.full((n,), 1.0 / n, jnp.float32)
    compiled = jax.jit(lambda x: attn.vector_field(x, w, jnp.zeros((), jnp.float32))).lower(x).compile()
    mem = compiled.memory_analysis()
    sec, peak = measure_peak(lambda: jax.block_until_ready(compiled(x)))
    return {"n": n, "d": d, "seconds": sec, "pairs_per_s": n * n / sec, "peak_extra_bytes": peak,
            "xla_bytes": int(mem.temp_size_in_bytes + mem.output_size_in_bytes)}


# ------------------------------------------------------------------------------------------
# orchestration


def _worker_cmd(args, lib):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", lib,
           "--budget", str(args.budget), "--mem-limit-gib", str(args.mem_limit_gib),
           "--n", *map(str, args.n), "--d", *map(str, args.d)]
    return cmd


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def collect(args):
    rows = []
    for lib in args.libs:
        print(f"[bench] {lib}", file=sys.stderr, flush=True)
        if args.inprocess:
            run_library(lib, args.d, args.n, args.budget, args.mem_limit_gib * 2**30, rows.append)
            continue
        proc = subprocess.run(_worker_cmd(args, lib), capture_output=True, text=True, env=_env(),
                              check=False)
        got = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        rows += got
        if proc.returncode != 0:
            reason = f"worker failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"
            rows += [{"lib": lib, "n": n, "d": d, "skipped": reason} for d in args.d for n in args.n
                     if not any(r["n"] == n and r["d"] == d for r in got)]
    return rows


def machine_info():
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        info["loadavg_start"] = os.getloadavg()
    except OSError:
        pass
    import jax

    info["jax"] = jax.__version__
    for mod in ("torch", "pykeops"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            info[mod] = None
    return info


def table(rows, limits):
    """Markdown: pairs/s (and ratio ours / peer) and peak extra memory, per (d, n)."""
    out = []
    libs = [lib for lib in LIBS if any(r["lib"] == lib for r in rows)]
    for d in sorted({r["d"] for r in rows}):
        out.append(f"\n**d = {d}** (pair-interactions/s; peak extra memory in MiB, RSS | XLA)\n")
        out.append("| n | " + " | ".join(libs) + " | ours / torch |")
        out.append("|---|" + "---|" * (len(libs) + 1))
        for n in sorted({r["n"] for r in rows if r["d"] == d}):
            cells, by = [], {r["lib"]: r for r in rows if r["d"] == d and r["n"] == n}
            for lib in libs:
                r = by.get(lib)
                if r is None or "skipped" in r:
                    cells.append("skip")
                    continue
                mem = "?" if r.get("peak_extra_bytes") is None else f"{r['peak_extra_bytes'] / 2**20:.0f}"
                if r.get("xla_bytes") is not None:
                    mem += f" \\| {r['xla_bytes'] / 2**20:.1f}"
                cells.append(f"{r['pairs_per_s']:.3g} ({mem})")
            ours, torch = by.get("transformer_pde"), by.get("torch_sdpa")
            ratio = (f"{ours['pairs_per_s'] / torch['pairs_per_s']:.2f}x"
                     if ours and torch and "skipped" not in ours and "skipped" not in torch else "–")
            out.append(f"| {n} | " + " | ".join(cells) + f" | {ratio} |")
    skips = sorted({(r["lib"], r["skipped"]) for r in rows if "skipped" in r})
    if skips:
        out.append("\nSkipped: " + "; ".join(f"{lib}: {why}" for lib, why in skips))
    if limits:
        out.append(f"\nMachine limits (same run): exp {limits['exp_per_s']:.3g} evaluations/s, "
                   f"float32 matmul {limits['matmul_flop_per_s'] / 1e9:.0f} GFLOP/s.")
    return "\n".join(out)


def plot(rows, limits, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = sorted({r["d"] for r in rows})
    fig, axes = plt.subplots(2, len(dims), figsize=(5.5 * len(dims), 8), squeeze=False)
    for c, d in enumerate(dims):
        for lib in LIBS:
            # memory: the larger of the RSS high-water mark and XLA's buffer assignment (RSS
            # misses buffers the allocator recycles from earlier calls)
            pts = sorted((r["n"], r["pairs_per_s"],
                          None if r.get("peak_extra_bytes") is None
                          else max(r["peak_extra_bytes"], r.get("xla_bytes") or 0))
                         for r in rows if r["lib"] == lib and r["d"] == d and "skipped" not in r)
            if not pts:
                continue
            ns, pps, mem = zip(*pts)
            axes[0, c].loglog(ns, pps, "o-", label=lib)
            if all(m is not None for m in mem):
                axes[1, c].loglog(ns, [max(m, 1) / 2**20 for m in mem], "o-", label=lib)
        if limits and d == 3:
            axes[0, c].axhline(limits["exp_per_s"], color="k", ls="--", lw=0.8,
                               label="exp evals/s (machine)")
        axes[0, c].set(title=f"d = {d}, float32", xlabel="n tokens", ylabel="pair-interactions / s")
        axes[1, c].set(xlabel="n tokens", ylabel="peak extra memory (MiB)")
        axes[0, c].legend(fontsize=7)
        axes[1, c].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384, 65536, 262144])
    p.add_argument("--d", type=int, nargs="+", default=[3, 64])
    p.add_argument("--libs", nargs="+", default=list(LIBS), choices=LIBS)
    p.add_argument("--budget", type=float, default=300.0,
                   help="skip a case predicted to take longer than this (seconds)")
    p.add_argument("--mem-limit-gib", type=float, default=6.0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--tiny", action="store_true", help="smoke run: tiny n, in-process, seconds")
    p.add_argument("--inprocess", action="store_true", help="no subprocess per library")
    p.add_argument("--no-solve", dest="solve", action="store_false")
    p.add_argument("--solve-n", type=int, default=16384)
    p.add_argument("--solve-steps", type=int, default=100)
    p.add_argument("--solve-only", action="store_true", help="only the solve-overhead benchmark")
    p.add_argument("--million", action="store_true", help="only the n = 10^6, d = 3 evaluation")
    p.add_argument("--worker", choices=LIBS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for d in args.d:
        BETA.setdefault(d, 1.0)

    if args.worker:
        run_library(args.worker, args.d, args.n, args.budget, args.mem_limit_gib * 2**30,
                    lambda row: print(json.dumps(row), flush=True))
        return 0
    if args.tiny:
        args.n, args.inprocess = [256, 512], True
        args.d = [d for d in args.d if d <= 8] or [3]
        args.solve_n, args.solve_steps = 256, 5
        args.libs = [lib for lib in args.libs if lib != "keops"]  # its C++ compile takes ~15 s
    args.out.mkdir(parents=True, exist_ok=True)

    if args.million:
        res = million()
        print(json.dumps(res, indent=1))
        (args.out / "million.json").write_text(json.dumps(res, indent=1))
        return 0

    if args.solve_only:
        res = solve_overhead(args.solve_n, 3, args.solve_steps)
        print(json.dumps(res, indent=1))
        (args.out / "solve.json").write_text(json.dumps(res, indent=1))
        return 0

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    info = machine_info()
    limits = machine_limits()
    rows = collect(args)
    solve = solve_overhead(args.solve_n, 3, args.solve_steps) if args.solve else None
    info["loadavg_end"] = os.getloadavg()
    result = {"started": started, "command": " ".join(sys.argv), "machine": info,
              "limits": limits, "rows": rows, "solve": solve}
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    md = table(rows, limits)
    if solve:
        md += (f"\n\nSolve (Euler, n = {solve['n']}, d = 3, {solve['steps']} steps, sphere): "
               f"{solve['solve_seconds']:.2f} s vs {solve['steps']} x kernel "
               f"{solve['kernel_seconds'] * 1e3:.1f} ms: overhead {100 * solve['overhead']:+.1f} %; "
               f"vs the same steps in one jitted loop ({solve['loop_seconds']:.2f} s): "
               f"{100 * solve['overhead_vs_loop']:+.1f} %.")
    (args.out / "results.md").write_text(md + "\n")
    plot(rows, limits, args.out / "throughput.png")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
