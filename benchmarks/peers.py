"""Whole-process timings against the peers' own scripts, at their settings (issue 24, item 4).

Peers (their code is not part of this repository; pass the paths of your checkouts):

* ``--simuformer DIR``: nikitus20/simuformer (``runner.py``, torch), the normalization study of
  Karagodin–Ge–Polyanskiy–Rigollet (arXiv 2510.22026): post-LN and nGPT, d = 16, n = 64, 8 heads,
  64 draws, β = 1, 5, 9, t = 20, random KᵀQ, V = I; one process per scheme (and per mask), as
  their ``run_experiments.sh`` runs it. Against ``transformer-pde run normalization``.
* ``--rotf DIR``: borjanG/2023-transformers-rotf (``phase-diagrams.py``, torch, float64), the
  phase diagram of GKPR: d = 2, n = 32, 256 starts, β = 1, 11/3, 19/3, 9, t = 30, softmax, step
  0.1. Against ``transformer-pde run phase-diagram --num-betas 4``. Their script puts every
  tensor on ``'cuda'`` and draws with ``text.usetex``: it runs here through a small launcher that
  maps ``'cuda'`` to the CPU and leaves usetex off (no LaTeX needed), nothing else changed.

Each repeat runs, interleaved: the peer (all its processes, one after another), ours with an
empty compile cache ("1st"), ours again with that cache ("2nd"). Our package is byte-compiled
first (``compileall``, as ``pip install`` does), as the peers' libraries are. Wall time of the whole
process(es), from start to exit; peak memory = the largest max-RSS of the processes
(``os.wait4``). Medians over the repeats. The outcome numbers (P(clustered pair) at the final
time, per β) are read back from both sides' result files and compared: z = difference /
(√2 · our standard error), the two sides having the same number of draws.

    python benchmarks/peers.py --simuformer ~/src/simuformer --rotf ~/src/2023-transformers-rotf \\
        --peer-python ~/venv-torch/bin/python --repeats 3 --out benchmarks/results/peers

``--peer-python`` is a Python with torch, numpy, matplotlib and tqdm (the peers' requirements);
ours runs with this interpreter as the ``transformer-pde`` console script runs it (``main()`` of
``transformer_pde.cli``, the package on the path).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

# The launcher for phase-diagrams.py: 'cuda' -> CPU, usetex off; then their script as __main__.
CPU_LAUNCHER = r'''
import runpy, sys
import matplotlib
import torch

def _cpu(a):
    if isinstance(a, str) and a.startswith("cuda"):
        return "cpu"
    if isinstance(a, torch.device) and a.type == "cuda":
        return torch.device("cpu")
    return a

_to = torch.Tensor.to
def _tensor_to(self, *args, **kwargs):
    if "device" in kwargs:
        kwargs["device"] = _cpu(kwargs["device"])
    return _to(self, *(_cpu(a) for a in args), **kwargs)
torch.Tensor.to = _tensor_to

def _on_cpu(factory):
    def made(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return factory(*args, **kwargs)
    return made
for _name in ("eye",):  # the only factory their script calls with device="cuda"
    setattr(torch, _name, _on_cpu(getattr(torch, _name)))

_set = matplotlib.RcParams.__setitem__
def _no_usetex(self, key, value):
    _set(self, key, False if key == "text.usetex" else value)
matplotlib.RcParams.__setitem__ = _no_usetex

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
'''

# Read a peer's pickle (torch tensors inside: needs the peer's Python) -> JSON on stdout.
READ_PICKLE = r'''
import glob, json, pickle, sys
out = {}
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        d = pickle.load(f)
    out[path] = {"betas": [float(b) for b in d["betas_list"]], "time": float(d["times_list"][-1]),
                 "fraction": [float(v) for v in d["density_tensor"][:, -1]]}
print(json.dumps(out))
'''


@dataclasses.dataclass
class Process:
    wall_s: float
    max_rss_mib: float
    returncode: int


def run_process(cmd, cwd, env=None, log=None) -> Process:
    """One whole process: wall time from spawn to exit, its max RSS (os.wait4)."""
    t0 = time.perf_counter()
    with open(log or os.devnull, "ab") as out:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        tail = Path(log).read_text(errors="replace")[-3000:] if log else ""
        raise RuntimeError(f"{cmd} exited with {p.returncode}\n{tail}")
    return Process(wall, usage.ru_maxrss / 1024, p.returncode)  # Linux: ru_maxrss in KiB


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    setting: str
    peer_name: str
    peer_cmds: tuple  # (argv after the peer python, ...), run in one fresh directory
    ours: tuple  # argv after `python -m transformer_pde.cli`
    ours_keys: tuple  # per peer command: index into our fraction array (scheme, mask) or ()
    betas: tuple


def cases(args) -> list[Case]:
    out = []
    if args.rotf:
        script = str(Path(args.rotf).resolve() / "phase-diagrams.py")
        batch, t1 = (16, 3.0) if args.tiny else (256, 30.0)
        out.append(Case(
            "phase-diagram", f"d = 2, n = 32, {batch} starts, 4 β, t = {t1:g} (float64 peer on CPU)",
            "phase-diagrams.py",
            (("{launcher}", script, "--dmodel", "2", "--ntokens", "32", "--batch", str(batch),
              "--betas", "4", "--betamin", "1", "--betamax", "9", "--use_softmax",
              "--maxtime", f"{t1:g}", "--step", "0.1", "--disable_tqdm"),),
            ("run", "phase-diagram", "--num-betas", "4", "--batch", str(batch), "--t1", f"{t1:g}",
             "--num-saves", "61" if not args.tiny else "7"),
            ((),), (1.0, 11 / 3, 19 / 3, 9.0)))
    if args.simuformer:
        runner = str(Path(args.simuformer).resolve() / "runner.py")
        seeds, t1 = (4, 2.0) if args.tiny else (64, 20.0)
        for masks in (("none",), ("none", "causal")):
            cmds, keys = [], []
            for c, mask in enumerate(masks):
                for s, (norm, _) in enumerate((("postln", "post-ln"), ("ngpt", "ngpt"))):
                    cmds.append((runner, "--norm", norm, "--randomKQ", "1", "--randomV", "0",
                                 "--dmodel", "16", "--ntokens", "64", "--n_heads", "8",
                                 "--batch", str(seeds), "--betamin", "1", "--betamax", "9", "--betas", "3",
                                 "--maxtime", f"{t1:g}", "--step", "0.1", "--disable_tqdm", "--outdir", "results")
                                + (("--sequential",) if mask == "causal" else ()))
                    keys.append((s, c))
            out.append(Case(
                "normalization" + ("" if len(masks) == 1 else " + causal"),
                f"post-LN + nGPT, d = 16, n = 64, 8 heads, {seeds} draws, β 1/5/9, t = {t1:g}"
                + ("" if len(masks) == 1 else ", with and without the causal mask"),
                "simuformer", tuple(cmds),
                ("run", "normalization", "--schemes", "post-ln,ngpt", "--masks", ",".join(masks),
                 "--seeds", str(seeds), "--t1", f"{t1:g}", "--betas", "1,5,9"),
                tuple(keys), (1.0, 5.0, 9.0)))
    return out


def peer_outcome(case: Case, workdir: Path, peer_python: str) -> list[list[float]]:
    """P(clustered pair) at the final time per β, one list per peer command (run order)."""
    pickles = sorted(workdir.glob("ds_*.pkl")) + sorted((workdir / "results").glob("*.pkl"))
    if len(pickles) != len(case.peer_cmds):
        raise RuntimeError(f"{case.name}: expected {len(case.peer_cmds)} result pickles, found {pickles}")
    if case.peer_name == "simuformer":  # one file per command: order by the command's --norm / --sequential
        def key(p):
            name = p.name
            return (("seqTrue" in name), 0 if "normpostln" in name else 1)
        pickles = sorted(pickles, key=key)
    data = json.loads(subprocess.run([peer_python, "-c", READ_PICKLE, *map(str, pickles)], check=True,
                                     capture_output=True, text=True).stdout)
    rows = []
    for p in pickles:
        d = data[str(p)]
        if not np.allclose(d["betas"], case.betas):
            raise RuntimeError(f"{p}: betas {d['betas']} are not {case.betas}")
        rows.append(d["fraction"])
    return rows


def our_outcome(case: Case, out: Path):
    """(fraction, standard error) at the final time per β, one row per peer command."""
    d = np.load(out / "data.npz")
    rows, sems = [], []
    for key in case.ours_keys:
        if case.name == "phase-diagram":
            rows.append(d["fraction"][:, -1]), sems.append(d["fraction_sem"][:, -1])
        else:
            s, c = key
            rows.append(d["fraction"][s, :, c, -1]), sems.append(d["fraction_sem"][s, :, c, -1])
    return np.array(rows), np.array(sems)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--simuformer", type=Path, help="checkout of nikitus20/simuformer")
    ap.add_argument("--rotf", type=Path, help="checkout of borjanG/2023-transformers-rotf")
    ap.add_argument("--peer-python", default=sys.executable, help="a Python with torch (default: this one)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", nargs="*", default=None,
                    help="names to run (phase-diagram, normalization, 'normalization + causal'); default all")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "peers")
    ap.add_argument("--tiny", action="store_true", help="smoke test: a few draws, short times")
    ap.add_argument("--keep", action="store_true", help="keep the working directories")
    args = ap.parse_args(argv)
    if not (args.simuformer or args.rotf):
        ap.error("give --simuformer DIR and/or --rotf DIR")
    todo = [c for c in cases(args) if args.cases is None or c.name in args.cases]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="peers_"))
    launcher = work / "cpu_launcher.py"
    launcher.write_text(CPU_LAUNCHER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.pop("TRANSFORMER_PDE_COMPILE_CACHE", None)
    # our package byte-compiled, as pip installs it (an editable install writes the same files on
    # its first import; the peers' libraries are compiled): where PYTHONDONTWRITEBYTECODE is set,
    # every timed process would otherwise compile our ~110 modules from source (0.2 s here)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "transformer_pde")], check=True)
    # what the `transformer-pde` console script runs (`python -m transformer_pde.cli` measured
    # 0.37 s slower, in JAX's frame filter under runpy: benchmarks/README.md)
    ours_python = [sys.executable, "-c", "import sys; from transformer_pde.cli import main; sys.exit(main())"]
    results = {c.name: {"peer": [], "first": [], "second": [], "load": []} for c in todo}
    outcomes = {}
    for r in range(args.repeats):
        for case in todo:
            rec = results[case.name]
            rec["load"].append(os.getloadavg()[0])
            # the peer: all its processes in one fresh directory
            pdir = work / f"{case.name.replace(' ', '')}_peer_{r}"
            pdir.mkdir()
            procs = [run_process([args.peer_python, *(str(launcher) if a == "{launcher}" else a for a in cmd)],
                                 pdir, log=pdir / "log.txt") for cmd in case.peer_cmds]
            rec["peer"].append(dict(wall_s=sum(p.wall_s for p in procs), max_rss_mib=max(p.max_rss_mib for p in procs),
                                    processes=[p.wall_s for p in procs]))
            # ours: an empty compile cache, then the same cache again
            cache = work / f"{case.name.replace(' ', '')}_cache_{r}"
            for which in ("first", "second"):
                odir = work / f"{case.name.replace(' ', '')}_{which}_{r}"
                p = run_process([*ours_python, *case.ours, "--out", str(odir), "--no-progress",
                                 "--compile-cache", str(cache)], work, env=env, log=work / f"{odir.name}.log")
                wall_in = json.loads((odir / "metadata.json").read_text()).get("wall_time_s")
                rec[which].append(dict(wall_s=p.wall_s, max_rss_mib=p.max_rss_mib, compute_s=wall_in))
            if r == 0:
                peer = peer_outcome(case, pdir, args.peer_python)
                ours, sem = our_outcome(case, work / f"{case.name.replace(' ', '')}_first_0")
                outcomes[case.name] = dict(peer=peer, ours=ours.tolist(), sem=sem.tolist())
            print(f"[{r + 1}/{args.repeats}] {case.name}: peer {rec['peer'][-1]['wall_s']:.1f} s, "
                  f"ours {rec['first'][-1]['wall_s']:.1f} / {rec['second'][-1]['wall_s']:.1f} s "
                  f"(load {rec['load'][-1]:.1f})", flush=True)
        # after every repeat: the table so far (a long run stopped early keeps what it measured)
        table = markdown(todo, results, outcomes, args)
        (args.out / "peers.md").write_text(table)
        (args.out / "peers.json").write_text(json.dumps(dict(results=results, outcomes=outcomes,
                                                             machine=machine(args)), indent=1))
    print(table)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def machine(args) -> dict:
    import jax

    out = subprocess.run([args.peer_python, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return dict(platform=platform.platform(), cpus=os.cpu_count(), python=platform.python_version(),
                jax=jax.__version__, torch=out.stdout.strip(), processor=_cpu_name())


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def markdown(todo, results, outcomes, args) -> str:
    done = min(len(results[c.name]["second"]) for c in todo)
    lines = [f"Whole process, median of {done} interleaved repeats (peer, ours with an empty "
             f"compile cache, ours with it warm); peak memory = max RSS.", "",
             "| experiment | peer | ours 1st | ours 2nd | peer / ours 1st | peer / ours 2nd "
             "| peak MiB peer / 1st / 2nd | memory ours / peer |",
             "|---|---|---|---|---|---|---|---|"]
    for case in todo:
        rec = results[case.name]
        peer = median([x["wall_s"] for x in rec["peer"]])
        first = median([x["wall_s"] for x in rec["first"]])
        second = median([x["wall_s"] for x in rec["second"]])
        mp = median([x["max_rss_mib"] for x in rec["peer"]])
        m1 = median([x["max_rss_mib"] for x in rec["first"]])
        m2 = median([x["max_rss_mib"] for x in rec["second"]])
        lines.append(f"| {case.name}: {case.setting} | {case.peer_name} {peer:.1f} s | {first:.1f} s | "
                     f"{second:.1f} s | {peer / first:.2f} | {peer / second:.2f} | "
                     f"{mp:.0f} / {m1:.0f} / {m2:.0f} | {max(m1, m2) / mp:.2f} |")
    lines += ["", "Outcomes: P(clustered pair) at the final time, per β (peer / ours ± standard error, "
              "z = difference / (√2 · standard error))", "",
              "| experiment | run | β | peer | ours | z |", "|---|---|---|---|---|---|"]
    for case in todo:
        o = outcomes[case.name]
        for k, key in enumerate(case.ours_keys):
            label = "" if not key else (("post-LN", "nGPT")[key[0]] + (", causal" if key[1] else ""))
            for b, beta in enumerate(case.betas):
                p, q, s = o["peer"][k][b], o["ours"][k][b], o["sem"][k][b]
                # with every one of our runs alike (standard error 0) z is undefined unless the
                # peer's value is the same
                z = (f"{(p - q) / (np.sqrt(2) * s):+.1f}" if s > 0 else
                     "+0.0" if p == q else "undefined (ours all alike)")
                lines.append(f"| {case.name} | {label} | {beta:.3g} | {p:.3f} | {q:.3f} ± {s:.3f} | {z} |")
    loads = [x for c in todo for x in results[c.name]["load"]]
    lines += ["", f"Load average (1 min) at the start of each case: {min(loads):.1f} – {max(loads):.1f} "
              f"({os.cpu_count()} CPUs)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
