"""What the compile cache holds and clearing it (runs/cache_contents.py, ``transformer-pde cache``):
a cache filled by a real process is counted kind by kind, and clearing removes what JAX and this
package wrote there and nothing else (a user's files, a link, a file named like ours but not ours,
a write still in progress)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_pde.cli import main
from transformer_pde.runs import programs
from transformer_pde.runs.cache_contents import KINDS, STALE_WRITE_S, cache_contents, clear_compile_cache

_FILL = """
import sys
import jax.numpy as jnp
import diffrax
import transformer_pde as tp
from transformer_pde.runs import compile_cache, programs

compile_cache.enable_compile_cache(compile_cache.resolve_compile_cache(sys.argv[1]))
with programs.kept_programs():  # a solve's program, as every experiment keeps them
    tp.solve(tp.SoftmaxAttention.identity(2, 1.3), jnp.array([[1.0, 0.0], [0.0, 1.0]]), t1=0.5, dt0=0.1,
             solver=diffrax.Euler())

def double(x):
    return 2.0 * x

programs.compile_program(double, (), (jnp.ones(3),))  # a whole program, as phase-diagram keeps its own
"""

KEY = "0123456789abcdef" * 4


def _filled(tmp_path) -> Path:
    cache = tmp_path / "cache"
    res = subprocess.run([sys.executable, "-c", _FILL, str(cache)], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    return cache


def _by_pattern(cache: Path) -> dict[str, list[Path]]:
    """The files of each kind, listed plainly by name (the count cache_contents must agree with)."""
    programs = sorted((cache / "programs").iterdir())
    return {
        KINDS[0]: [p for p in cache.iterdir() if p.name.endswith(("-cache", "-atime"))],
        KINDS[1]: [p for p in programs if p.suffix in (".jaxexport", ".jaxcall", ".refused")],
        KINDS[2]: [p for p in programs if p.name.startswith("xla-") and p.suffix == ".jaxexe"],
        KINDS[3]: [p for p in programs if p.suffix == ".jaxlink"],
    }


def test_a_filled_cache_is_counted_and_cleared_leaving_everything_else(tmp_path):
    cache = _filled(tmp_path)
    listed = _by_pattern(cache)
    assert all(listed[k] for k in KINDS[:4]), {k: len(v) for k, v in listed.items()}  # every kind was written
    held = cache_contents(cache)
    for kind, files in listed.items():
        assert held.counts[kind] == (len(files), sum(p.stat().st_size for p in files)), kind
    assert held.counts[KINDS[4]] == held.counts[KINDS[5]] == (0, 0) and held.other == 0

    # what clearing must leave: none of these was written by JAX or this package
    progs = cache / "programs"
    outside = tmp_path / "precious.txt"
    outside.write_text("a user's file")
    left = [cache / "notes.txt", progs / f"mine-{KEY}.jaxcall", cache / f"jit_f-{KEY}-cache",
            cache / "sub" / f"jit_g-{KEY}-cache", progs / f".double-{KEY}.jaxexport.a1b2c3d4",
            progs / f"named-{KEY}.jaxexport"]
    (cache / "notes.txt").write_text("kept beside the cache")
    (progs / f"mine-{KEY}.jaxcall").write_bytes(b"named like a kept program, not one")
    (cache / f"jit_f-{KEY}-cache").symlink_to(outside)  # a link is never followed nor removed
    (cache / "sub").mkdir()
    (cache / "sub" / f"jit_g-{KEY}-cache").write_bytes(b"in a folder of the user's")
    (progs / f".double-{KEY}.jaxexport.a1b2c3d4").write_bytes(b"a write in progress")
    os.mkfifo(progs / f"named-{KEY}.jaxexport")  # must not block the count
    stale = progs / f".double-{KEY}.jaxcall.e5f6a7b8"
    stale.write_bytes(b"left by a killed writer")
    os.utime(stale, (0, os.stat(stale).st_mtime - 2 * STALE_WRITE_S))
    stale_size = stale.stat().st_size
    old_layout = progs / f"double-{KEY}.jaxexe"  # an executable as kept before the links
    old_layout.write_bytes(listed[KINDS[2]][0].read_bytes())

    before = cache_contents(cache)
    assert before.counts[KINDS[4]] == (1, old_layout.stat().st_size)
    assert before.counts[KINDS[5]][0] == 2  # in progress and stale: both are ours
    assert before.other == 5  # notes, the look-alike, the link, the folder, the FIFO

    removed = clear_compile_cache(cache)
    for kind in KINDS[:4]:
        assert removed.counts[kind] == held.counts[kind], kind
    assert removed.counts[KINDS[4]] == before.counts[KINDS[4]]
    assert removed.counts[KINDS[5]] == (1, stale_size)
    assert not stale.exists() and not old_layout.exists()
    assert all(p.exists() or p.is_symlink() for p in left)
    assert outside.read_text() == "a user's file"
    after = cache_contents(cache)
    assert after.files == 1 and after.counts[KINDS[5]][0] == 1  # the write in progress
    assert after.other == before.other


def test_a_link_in_the_place_of_the_programs_folder_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    kept = elsewhere / f"double-{KEY}.jaxexport"
    kept.write_bytes(programs.MAGIC + b"looks kept")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "programs").symlink_to(elsewhere)
    (tmp_path / "link").symlink_to(cache)  # the cache itself may be reached through a link
    assert cache_contents(tmp_path / "link").other == 1
    assert clear_compile_cache(tmp_path / "link").files == 0 and kept.exists()


def test_the_cli_shows_and_clears_the_cache(tmp_path, capsys):
    cache = _filled(tmp_path)
    n = sum(len(v) for v in _by_pattern(cache).values())
    assert main(["cache", "--compile-cache", str(cache)]) == 0
    shown = capsys.readouterr().out
    assert re.search(rf"in all\s+{n} files", shown), shown
    assert main(["cache", "--compile-cache", str(cache), "--clear"]) == 0
    cleared = capsys.readouterr().out
    assert f"removed {n} files" in cleared and re.search(r"in all\s+0 files", cleared), cleared
    assert not any((cache / "programs").iterdir())


def test_the_cli_names_a_cache_that_is_not_a_directory_or_not_there(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as e:
        main(["cache", "--compile-cache", str(tmp_path / "file")])
    assert e.value.code == 2
    assert f"compile cache '{tmp_path / 'file'}' is not a directory" in capsys.readouterr().err
    assert main(["cache", "--compile-cache", str(tmp_path / "none")]) == 0
    assert "not made yet" in capsys.readouterr().out
    assert not (tmp_path / "none").exists()  # looking makes nothing
    assert main(["cache", "--compile-cache", "off"]) == 0
    assert "the compile cache is off" in capsys.readouterr().out
