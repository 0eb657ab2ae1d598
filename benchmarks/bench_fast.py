"""Error versus time: the fast NUFFT kernel against the exact streaming kernel, same run.

    python benchmarks/bench_fast.py --out benchmarks/results/fast          # full grid (long)
    python benchmarks/bench_fast.py --tiny --out /tmp/bench_fast           # smoke, seconds
    python benchmarks/bench_fast.py --n 100000 --k 3 --gamma 9 --tol 1e-8 --out /tmp/one
    python benchmarks/bench_fast.py --big --out benchmarks/results/fast    # adds n = 10^7 (fast)
    python benchmarks/bench_fast.py --headline --out benchmarks/results/fast/headline  # issue 13 target

One reduction ``(avg, lse)`` of ``lse_average`` for all n tokens: tokens uniform on the sphere
S^{k-1} (Q = K = V = I, so a = b = v = x), uniform weights (bias = -log n), logits γ⟨x_i, x_j⟩,
float64. For every (n, k, γ) the exact streaming kernel
(``transformer_pde.kernels.exact.lse_average(γx, x, x, bias)``) is timed once per γ and its
output is the reference (above ``--exact-max-n``: the exact kernel on ``--sample`` random queries,
timed, and its full time estimated as that time x n / sample, exact for this kernel, whose query
blocks are independent: marked "est."); for every tol the fast kernel (``fast_lse_average`` with
``plan_gaussian_sum(γ, 1, k, tol)``) is timed and compared with it: max |avg error|, max |lse
error| and the largest a-posteriori bound it reported. Times are medians of ``--repeats``
calls after compilation (one call where a call takes longer than ``--long`` seconds);
compilation (ahead of time) is recorded separately as ``compile``. Above ``--exact-max-n`` the exact kernel is not
timed; the error is then measured on ``--sample`` random queries against the exact kernel
run on those queries only (``n = 10^7``, ``--big``), and each fast run is made in its own
subprocess so that its peak resident memory (VmHWM after ``/proc/self/clear_refs``) is its own.

For every (n, k, γ, tol) the automatic backend (``tp.kernels.Auto(tol=tol)`` bound to
``SoftmaxAttention.identity(k, γ)``, so R = 1, γ = β) is run too (``--no-auto`` skips it): its
static choice and reason, its time (the fast kernel with the exact fallback of the queries whose
a-posteriori bound misses tol; where it chooses the exact kernel, the exact kernel's time from
the same run), its errors and whether any exceeds tol (``above_tol``).

``--headline`` is the issue-13 target in one process: n = 10^6, k = 3, γ = 1, tol = 1e-8; the
exact streaming kernel in float32 over all n queries (one call, ~280 s on a quiet machine: the
exact kernel's own benchmark precision), the exact kernel in float64 on ``--sample`` queries (the
error reference, and a float64 time estimate), then Fast(1e-8) and Auto(1e-8) in float64
(medians); writes ``headline.json``.

Writes ``results.json``, ``results.md`` (a table) and ``front.png`` (error against time, one
panel per k, one colour per n; the exact kernel at its time, drawn at the error floor) to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

FULL = dict(n=[10**4, 10**5, 10**6], k=[2, 3], gamma=[1.0, 9.0, 100.0], tol=[1e-4, 1e-8, 1e-12])
TINY = dict(n=[2000], k=[2, 3], gamma=[1.0, 9.0], tol=[1e-4, 1e-8])
BIG_N = 10**7
ERROR_FLOOR = 1e-16  # where the exact kernel is drawn on the log-error axis


# ------------------------------------------------------------------------------------------
# helpers


def sphere(n: int, k: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, k))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def timed(fn, *args, repeats: int, long: float):
    """(compile seconds, median seconds of the timed calls, output) for a jitted ``fn``.

    Compiled ahead of time, so the first call is already a timed one; a call longer than
    ``long`` seconds ends the repeats (the long exact cases run once)."""
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    times, out = [], None
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
        if times[-1] > long:
            break
    return compile_s, float(np.median(times)), out


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _reset_peak():
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except Exception:  # pragma: no cover - not glibc
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # pragma: no cover - not Linux
        pass


def threads_for(n: int, nthreads: int) -> int:
    """FINUFFT threads as the backends pick them: one below SMALL_PROBLEM points (queries +
    keys) when ``nthreads`` is 0 (kernels/backends.py)."""
    from transformer_pde.kernels.backends import SMALL_PROBLEM

    return 1 if nthreads == 0 and 2 * n < SMALL_PROBLEM else nthreads


def exact_fn():
    """``(γ, queries, keys, bias) -> lse_average(γ q, x, x, bias)`` under jit."""
    from transformer_pde.kernels.exact import lse_average

    def f(gamma, q, x, bias):
        return lse_average(gamma * q, x, x, bias)

    return jax.jit(f)


def fast_fn(plan):
    from transformer_pde.kernels.fast import fast_lse_average_with_info

    def f(gamma, x, bias):
        return fast_lse_average_with_info(x, x, x, bias, gamma, plan)

    return jax.jit(f)


def auto_fn(gamma, k, tol, n, nthreads):
    """(choice, jitted fn or None): Auto bound to SoftmaxAttention.identity(k, γ)."""
    import transformer_pde as tp
    from transformer_pde.kernels import Auto

    backend = tp.SoftmaxAttention.identity(k, gamma, backend=Auto(tol=tol, nthreads=nthreads)).backend
    choice = backend.choose(m=n, n=n, e=k, dtype=jnp.float64, causal=False)
    if not choice.fast:
        return choice, None

    def f(gamma, x, bias):
        return backend.fast_lse_average(choice.plan, x, x, x, bias, gamma)

    return choice, jax.jit(f)


def run_auto(n, k, gamma, tol, g, x, bias, ref_avg, ref_lse, ref_rows, exact_time, repeats, long,
             nthreads, log):
    from transformer_pde.kernels.fast import fast_lse_average_with_info

    choice, fn = auto_fn(gamma, k, tol, n, nthreads)
    row = dict(method="auto", n=n, k=k, gamma=gamma, tol=tol, path=choice.path,
               reason=choice.reason, predicted_speedup=choice.predicted_speedup,
               predicted_error=choice.predicted_error)
    if fn is None:  # the exact kernel: its time from this run, no error
        row.update(time=exact_time, err_avg=0.0, err_lse=0.0, above_tol=False, fallback_rows=0)
    else:
        comp, t, (avg, lse) = timed(fn, g, x, bias, repeats=repeats, long=long)
        info = jax.jit(lambda g, x, b: fast_lse_average_with_info(x, x, x, b, g, choice.plan)[2])(
            g, x, bias)
        bad = ((np.asarray(info.lse_bound) > tol)
               | (np.asarray(info.avg_bound) > tol * max(1.0, float(info.value_half_range))))
        avg, lse = np.asarray(avg), np.asarray(lse)
        if ref_rows is not None:
            avg, lse = avg[ref_rows], lse[ref_rows]
        e_avg = float(np.abs(avg - np.asarray(ref_avg)).max())
        e_lse = float(np.abs(lse - np.asarray(ref_lse)).max())
        row.update(time=t, compile=comp, modes=choice.plan.modes, eta=choice.plan.eta,
                   err_avg=e_avg, err_lse=e_lse, above_tol=bool(max(e_avg, e_lse) > tol),
                   fallback_rows=int(bad.sum()))
        if ref_rows is not None:
            row["error_on_sample"] = int(len(ref_rows))
    log(f"auto  n={n:.0e} k={k} gamma={gamma:g} tol={tol:g}: {choice.path}, "
        f"{row['time'] if row['time'] is not None else float('nan'):.3f} s, err avg "
        f"{row['err_avg']:.1e} lse {row['err_lse']:.1e}, above tol {row['above_tol']}, "
        f"fallback rows {row['fallback_rows']} ({choice.reason})")
    return row


def errors(avg, lse, ref_avg, ref_lse, info, rows=None):
    avg, lse = np.asarray(avg), np.asarray(lse)
    if rows is not None:
        avg, lse = avg[rows], lse[rows]
        lse_b, avg_b = np.asarray(info.lse_bound)[rows], np.asarray(info.avg_bound)[rows]
    else:
        lse_b, avg_b = np.asarray(info.lse_bound), np.asarray(info.avg_bound)
    e_avg = np.abs(avg - np.asarray(ref_avg)).max(axis=1)
    e_lse = np.abs(lse - np.asarray(ref_lse))
    return dict(
        err_avg=float(e_avg.max()), err_lse=float(e_lse.max()),
        bound_avg=float(avg_b.max()), bound_lse=float(lse_b.max()),
        bound_holds=bool(np.all(e_avg <= avg_b) and np.all(e_lse <= lse_b)),
        frac_certified_1e_6=float(np.mean((lse_b <= 1e-6) & (avg_b <= 1e-6))),
    )


def plan_record(plan, n: int, k: int):
    return dict(modes=plan.modes, total_modes=plan.total_modes, period=plan.period,
                eta=plan.eta, nufft_eps=plan.nufft_eps, spread_width=plan.spread_width,
                predicted_flops=plan.predicted_flops(n, n, k),
                exact_flops=plan.exact_flops(n, n, k),
                predicted_speedup=plan.predicted_speedup(n, n, k))


# ------------------------------------------------------------------------------------------
# one (n, k) block in this process: the exact kernel per γ, the fast kernel per (γ, tol)


def run_block(n, k, gammas, tols, repeats, long, exact_max_n, sample, nthreads, log, auto=True):
    from transformer_pde.kernels.fast import plan_gaussian_sum

    x = jnp.asarray(sphere(n, k))
    bias = jnp.full((n,), -math.log(n))
    exact = exact_fn()
    rows = []
    for gamma in gammas:
        g = jnp.asarray(gamma)
        if n <= exact_max_n:
            comp, t, (ref_avg, ref_lse) = timed(exact, g, x, x, bias, repeats=repeats,
                                                long=long)
            ref_rows = None
            rows.append(dict(method="exact", n=n, k=k, gamma=gamma, tol=None, time=t,
                             compile=comp))
            log(f"exact n={n:.0e} k={k} gamma={gamma:g}: {t:.3f} s")
        else:
            ref_rows = np.random.default_rng(1).choice(n, size=min(sample, n), replace=False)
            comp, ts, (ref_avg, ref_lse) = timed(exact, g, x[ref_rows], x, bias, repeats=1,
                                                 long=long)
            t = ts * n / len(ref_rows)
            rows.append(dict(method="exact", n=n, k=k, gamma=gamma, tol=None, time=t,
                             compile=comp, estimated=True, sample_rows=int(len(ref_rows)),
                             sample_time=ts))
            log(f"exact n={n:.0e} k={k} gamma={gamma:g}: {ts:.3f} s on {len(ref_rows)} queries, "
                f"est. {t:.1f} s for all")
        for tol in tols:
            plan = plan_gaussian_sum(gamma, 1.0, k, tol, nthreads=threads_for(n, nthreads))
            comp, tf, (avg, lse, info) = timed(fast_fn(plan), g, x, bias,
                                                repeats=repeats, long=long)
            row = dict(method="fast", n=n, k=k, gamma=gamma, tol=tol, time=tf, compile=comp,
                       **plan_record(plan, n, k),
                       **errors(avg, lse, ref_avg, ref_lse, info, ref_rows))
            if ref_rows is not None:
                row["error_on_sample"] = int(len(ref_rows))
            rows.append(row)
            log(f"fast  n={n:.0e} k={k} gamma={gamma:g} tol={tol:g}: {row['time']:.3f} s, "
                f"N={plan.modes}, err avg {row['err_avg']:.1e} lse {row['err_lse']:.1e} "
                f"(bound {row['bound_lse']:.1e}, holds {row['bound_holds']})")
            if auto:
                rows.append(run_auto(n, k, gamma, tol, g, x, bias, ref_avg, ref_lse, ref_rows,
                                     t, repeats, long, nthreads, log))
    return rows


def worker(spec: str) -> None:
    """Subprocess entry: one fast run (peak memory of its own), JSON on stdout's last line."""
    from transformer_pde.kernels.fast import plan_gaussian_sum

    s = json.loads(spec)
    n, k, gamma, tol = s["n"], s["k"], s["gamma"], s["tol"]
    x = jnp.asarray(sphere(n, k))
    bias = jnp.full((n,), -math.log(n))
    plan = plan_gaussian_sum(gamma, 1.0, k, tol, nthreads=s["nthreads"])
    g = jnp.asarray(gamma)
    t0 = time.perf_counter()
    compiled = fast_fn(plan).lower(g, x, bias).compile()
    compile_s = time.perf_counter() - t0
    out = jax.block_until_ready(compiled(g, x, bias))  # warm-up call, untimed
    del out
    _reset_peak()  # the timed calls' own peak: from a clean high-water mark
    rss0 = _kib("VmRSS")
    times = []
    for _ in range(max(s["repeats"], 1)):
        t0 = time.perf_counter()
        avg, lse, info = jax.block_until_ready(compiled(g, x, bias))
        times.append(time.perf_counter() - t0)
    peak = _kib("VmHWM")
    t = float(np.median(times))
    rows = np.random.default_rng(1).choice(n, size=min(s["sample"], n), replace=False)
    ref_avg, ref_lse = exact_fn()(g, x[rows], x, bias)
    rec = dict(method="fast", n=n, k=k, gamma=gamma, tol=tol, time=t, compile=compile_s,
               peak_extra_mib=(peak - rss0) / 1024, peak_rss_mib=peak / 1024,
               error_on_sample=int(len(rows)), **plan_record(plan, n, k),
               **errors(avg, lse, ref_avg, ref_lse, info, rows))
    print(json.dumps(rec))


def headline(out: Path, repeats, sample, nthreads, log, n=10**6, k=3, gamma=1.0, tol=1e-8):
    """The issue-13 target, every number from this process (module docstring)."""
    from transformer_pde.kernels.fast import plan_gaussian_sum

    x = jnp.asarray(sphere(n, k))
    bias = jnp.full((n,), -math.log(n))
    g = jnp.asarray(gamma)
    exact = exact_fn()
    rec = dict(n=n, k=k, gamma=gamma, tol=tol, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               load_start=os.getloadavg()[0])
    # the exact kernel in float32, all queries, one call
    x32, b32, g32 = x.astype(jnp.float32), bias.astype(jnp.float32), g.astype(jnp.float32)
    comp, t32, _ = timed(exact, g32, x32, x32, b32, repeats=1, long=0.0)
    rec.update(exact_f32_time=t32, exact_f32_compile=comp)
    log(f"exact float32 n={n:.0e}: {t32:.1f} s")
    # float64 reference on a sample of queries
    rows = np.random.default_rng(1).choice(n, size=min(sample, n), replace=False)
    comp, ts, (ref_avg, ref_lse) = timed(exact, g, x[rows], x, bias, repeats=1, long=0.0)
    rec.update(exact_f64_sample_rows=int(len(rows)), exact_f64_sample_time=ts,
               exact_f64_time_est=ts * n / len(rows))
    log(f"exact float64 on {len(rows)} queries: {ts:.1f} s (est. {ts * n / len(rows):.0f} s)")
    plan = plan_gaussian_sum(gamma, 1.0, k, tol, nthreads=threads_for(n, nthreads))
    comp, tf, (avg, lse, info) = timed(fast_fn(plan), g, x, bias, repeats=repeats, long=1e9)
    err = errors(avg, lse, ref_avg, ref_lse, info, rows)
    rec["fast"] = dict(time=tf, compile=comp, **plan_record(plan, n, k), **err,
                       speedup_vs_exact_f32=t32 / tf, speedup_vs_exact_f64_est=ts * n / len(rows) / tf)
    log(f"Fast(1e-8): {tf:.2f} s, {t32 / tf:.0f}x exact float32, err avg {err['err_avg']:.1e} "
        f"lse {err['err_lse']:.1e}")
    row = run_auto(n, k, gamma, tol, g, x, bias, ref_avg, ref_lse, rows, None, repeats, 1e9,
                   nthreads, log)
    row.update(speedup_vs_exact_f32=t32 / row["time"],
               speedup_vs_exact_f64_est=ts * n / len(rows) / row["time"])
    rec["auto"] = row
    rec["load_end"] = os.getloadavg()[0]
    out.mkdir(parents=True, exist_ok=True)
    (out / "headline.json").write_text(json.dumps(rec, indent=1))
    log(f"wrote {out}/headline.json")


def run_big(n, k, gammas, tols, repeats, long, sample, nthreads, log):
    rows = []
    for gamma in gammas:
        for tol in tols:
            spec = json.dumps(dict(n=n, k=k, gamma=gamma, tol=tol, repeats=repeats,
                                   long=long, sample=sample, nthreads=nthreads))
            proc = subprocess.run([sys.executable, __file__, "--worker", spec],
                                  capture_output=True, text=True)
            if proc.returncode:
                rows.append(dict(method="fast", n=n, k=k, gamma=gamma, tol=tol,
                                 skipped=proc.stderr[-500:]))
                log(f"fast n={n:.0e} k={k} gamma={gamma:g} tol={tol:g}: FAILED")
                continue
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(row)
            log(f"fast  n={n:.0e} k={k} gamma={gamma:g} tol={tol:g}: {row['time']:.2f} s, "
                f"peak +{row['peak_extra_mib']:.0f} MiB, err lse {row['err_lse']:.1e}")
    return rows


# ------------------------------------------------------------------------------------------
# reporting


def markdown(rows, meta) -> str:
    lines = [f"# Fast (NUFFT) vs exact streaming kernel — {meta['date']}", "",
             f"{meta['machine']}; float64; tokens uniform on S^(k-1), a = b = v = x, uniform "
             "weights. Times: median seconds of one (avg, lse) evaluation after compilation. "
             "err: max abs error against the exact kernel (n = 1e7: on a sample of queries); "
             "bound: largest a-posteriori lse bound reported by the fast kernel.", ""]
    exact = {(r["n"], r["k"], r["gamma"]): r["time"] for r in rows if r["method"] == "exact"}
    est = {(r["n"], r["k"], r["gamma"]) for r in rows if r.get("estimated")}
    lines[2] += (" exact s marked * is estimated from the exact kernel on a sample of queries (time x "
                 "n / sample; the query blocks are independent).")
    lines += ["| n | k | γ | tol | modes/dim | exact s | fast s | speedup (pred. flops) | "
              "err avg | err lse | lse bound | bound holds | peak MiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["method"] != "fast" or "skipped" in r:
            continue
        te = exact.get((r["n"], r["k"], r["gamma"]))
        pred = f"{r['predicted_speedup']:.0f}x"
        speed = f"{te / r['time']:.1f}x ({pred})" if te else f"– ({pred})"
        peak = f"{r['peak_extra_mib']:.0f}" if "peak_extra_mib" in r else ""
        star = "*" if (r["n"], r["k"], r["gamma"]) in est else ""
        cells = [f"{r['n']:.0e}", str(r["k"]), f"{r['gamma']:g}", f"{r['tol']:g}", str(r["modes"]),
                 f"{te:.3g}{star}" if te else "–", f"{r['time']:.3g}", speed, f"{r['err_avg']:.1e}",
                 f"{r['err_lse']:.1e}", f"{r['bound_lse']:.1e}", str(r["bound_holds"]), peak]
        lines.append("| " + " | ".join(cells) + " |")
    autos = [r for r in rows if r["method"] == "auto"]
    if autos:
        lines += ["", "Auto (`tp.kernels.Auto(tol)`): path chosen, time (exact path: the exact "
                  "kernel's time in this run), max errors, whether any exceeds tol, queries "
                  "recomputed exactly.", "",
                  "| n | k | γ | tol | path | s | speedup vs exact | err avg | err lse | above tol "
                  "| fallback rows | reason |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in autos:
            te = exact.get((r["n"], r["k"], r["gamma"]))
            t = r["time"]
            star = "*" if (r["n"], r["k"], r["gamma"]) in est else ""
            speed = f"{te / t:.1f}x{star}" if te and t and r["path"] == "fast" else "–"
            t_star = star if r["path"] == "exact" else ""
            cells = [f"{r['n']:.0e}", str(r["k"]), f"{r['gamma']:g}", f"{r['tol']:g}", r["path"],
                     f"{t:.3g}{t_star}" if t else "–", speed, f"{r['err_avg']:.1e}", f"{r['err_lse']:.1e}",
                     str(r["above_tol"]), str(r["fallback_rows"]), r["reason"]]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ks = sorted({r["k"] for r in rows})
    ns = sorted({r["n"] for r in rows})
    colors = dict(zip(ns, plt.cm.viridis(np.linspace(0, 0.9, max(len(ns), 1)))))
    markers = {1.0: "o", 9.0: "s", 100.0: "^"}
    fig, axes = plt.subplots(1, len(ks), figsize=(5.5 * len(ks), 4.2), squeeze=False)
    for ax, k in zip(axes[0], ks):
        for r in rows:
            if r["k"] != k or "skipped" in r or r["method"] == "auto":
                continue
            c, m = colors[r["n"]], markers.get(r["gamma"], "D")
            if r["method"] == "exact":
                ax.scatter(r["time"], ERROR_FLOOR, color=c, marker=m, facecolors="none", s=60)
            else:
                err = max(r["err_avg"], r["err_lse"], ERROR_FLOOR)
                ax.scatter(r["time"], err, color=c, marker=m, s=40)
                ax.annotate(f"{r['tol']:.0e}", (r["time"], err), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")
        ax.axhline(ERROR_FLOOR, color="0.8", lw=0.8)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set(xscale="log", yscale="log", xlabel="seconds per evaluation",
               ylabel="max error (avg, lse)", title=f"k = {k} (hollow: exact, at the floor)")
        for n in ns:
            ax.scatter([], [], color=colors[n], label=f"n = {n:.0e}")
        for g, m in markers.items():
            ax.scatter([], [], color="k", marker=m, label=f"γ = {g:g}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=False)
    p.add_argument("--tiny", action="store_true", help="n = 2000, seconds")
    p.add_argument("--big", action="store_true", help="also n = --big-n (fast kernel only)")
    p.add_argument("--big-n", type=int, default=BIG_N, help="the --big size (default 1e7)")
    p.add_argument("--n", type=int, nargs="+")
    p.add_argument("--k", type=int, nargs="+")
    p.add_argument("--gamma", type=float, nargs="+")
    p.add_argument("--tol", type=float, nargs="+")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--long", type=float, default=20.0,
                   help="one timed call only when a call takes longer (seconds)")
    p.add_argument("--exact-max-n", type=int, default=10**6)
    p.add_argument("--sample", type=int, default=1000,
                   help="queries checked against the exact kernel when n > --exact-max-n")
    p.add_argument("--nthreads", type=int, default=0, help="FINUFFT threads (0: all cores)")
    p.add_argument("--no-auto", action="store_true", help="skip the Auto backend rows")
    p.add_argument("--headline", action="store_true", help="the issue-13 target alone")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.out is None:
        p.error("--out is required")
    grid = dict(TINY if args.tiny else FULL)
    for key in ("n", "k", "gamma", "tol"):
        if getattr(args, key):
            grid[key] = getattr(args, key)
    repeats = 2 if args.tiny and args.repeats == 5 else args.repeats
    args.out.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    if args.headline:
        return headline(args.out, 3 if args.repeats == 5 else args.repeats, args.sample,
                        args.nthreads, log)

    rows = []
    for k in grid["k"]:
        for n in grid["n"]:
            rows += run_block(n, k, grid["gamma"], grid["tol"], repeats, args.long,
                              args.exact_max_n, args.sample, args.nthreads, log,
                              auto=not args.no_auto)
        if args.big:
            rows += run_big(args.big_n, k, grid["gamma"], grid["tol"], 1, args.long, args.sample,
                            args.nthreads, log)
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                machine=f"{platform.machine()}, {os.cpu_count()} CPUs, "
                        f"load average {os.getloadavg()[0]:.1f} at the end",
                jax=jax.__version__, grid=grid, repeats=repeats, nthreads=args.nthreads,
                argv=sys.argv[1:])
    try:
        import jax_finufft

        meta["jax_finufft"] = jax_finufft.__version__
    except ImportError:  # pragma: no cover
        pass
    (args.out / "results.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    (args.out / "results.md").write_text(markdown(rows, meta))
    plot(rows, args.out / "front.png")
    log(f"wrote {args.out}/results.json, results.md, front.png")


if __name__ == "__main__":
    main()
