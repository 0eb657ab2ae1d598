"""Where one tiny run's time goes (issue 36, item 5): an experiment's tiny size through
``run_experiment`` in one process with JAX's persistent cache at CACHE, as the CLI runs it.

    python benchmarks/profile_run.py clustering /tmp/cache /tmp/out1   # first run
    python benchmarks/profile_run.py clustering /tmp/cache /tmp/out2   # second run

Prints seconds in import, compute and figures, JAX's own durations (tracing, lowering to MLIR, XLA
compiling, cache retrieval), how many programs it traced, compiled, found in or missed from the
persistent cache, and which programs the cache refused (host callbacks)."""
import sys, time, collections, os, logging
t_start = time.perf_counter()
name, cache, out = sys.argv[1], sys.argv[2], sys.argv[3]
import jax
from jax import monitoring
durs = collections.Counter(); counts = collections.Counter()
monitoring.register_event_duration_secs_listener(lambda e, d, **k: (durs.update({e: d}), counts.update({e: 1})))
monitoring.register_event_listener(lambda e, **k: counts.update({e: 1}))
refused = []
class H(logging.Handler):
    def emit(self, r):
        m = r.getMessage()
        if "host callbacks" in m: refused.append(m[:200])
logging.getLogger("jax._src.compiler").addHandler(H()); logging.getLogger("jax._src.compilation_cache").addHandler(H())
jax.config.update("jax_explain_cache_misses", True)
import transformer_pde
from transformer_pde.runs.compile_cache import enable_compile_cache
from transformer_pde.experiments import get
from transformer_pde.runs import run_experiment
import dataclasses
enable_compile_cache(__import__("pathlib").Path(cache))
t_import = time.perf_counter() - t_start
exp = get(name)
cfg = exp.make_config(**exp.tiny)
phase = {}
def timed(f, key):
    def g(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: phase[key] = time.perf_counter() - t
    return g
object.__setattr__(exp, "compute", timed(exp.compute, "compute"))
object.__setattr__(exp, "figures", timed(exp.figures, "figures"))
t = time.perf_counter()
run_experiment(exp, cfg, __import__("pathlib").Path(out), progress=False)
total = time.perf_counter() - t_start
short = {k.split("/")[-1]: round(v, 2) for k, v in durs.items()}
print(f"{name}: total {total:.1f} import {t_import:.1f} compute {phase.get('compute',0):.1f} figures {phase.get('figures',0):.1f} | "
      f"{short} | counts trace={counts['/jax/core/compile/jaxpr_trace_duration']} compile={counts['/jax/core/compile/backend_compile_duration']} "
      f"hits={counts['/jax/compilation_cache/cache_hits']} misses={counts['/jax/compilation_cache/cache_misses']} refused={len(refused)}", flush=True)
for r in refused[:10]: print("  REFUSED", r)
