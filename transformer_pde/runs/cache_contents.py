"""What the compile cache holds, and clearing it (``transformer-pde cache [--clear]``).

The cache directory (:func:`.compile_cache.resolve_compile_cache`) holds JAX's persistent
compilation cache (``<name>-<key>-cache``, and ``-atime`` beside each when JAX bounds its size)
and this package's kept programs in ``programs/`` (:mod:`.programs`: traced programs, their
executables, the links between them). Every program key holds the package's source and the
library versions, so each edit or upgrade starts a new set beside the old ones, which no run reads
again: the cache grows until it is cleared.

Clearing removes only what JAX or this package wrote there: JAX's entries recognized by name, the
kept files by name *and* their first line (:data:`.programs.MAGIC`), never a link, a directory or
anything else; a half-written file (a writer's temporary) only once it is an hour old, since a
live run may be writing it. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import time
from pathlib import Path

from .programs import CALL, EXECUTABLE, EXPORTED, LINK, MAGIC, REFUSED

__all__ = ["CacheContents", "cache_contents", "clear_compile_cache"]

KINDS = ("JAX's compiled programs", "kept traced programs", "kept executables",
         "links from programs to executables", "left by an earlier layout", "unfinished writes")
"""The kinds of file :func:`cache_contents` counts, in the order it reports them."""

_KEY = "[0-9a-f]{64}"
_JAX_ENTRY = re.compile(rf".+-{_KEY}-(cache|atime)")


def _any(*suffixes: str) -> str:
    return "(" + "|".join(map(re.escape, suffixes)) + ")"


_KEPT = {re.compile(rf".+-{_KEY}{_any(EXPORTED, CALL, REFUSED)}"): KINDS[1],
         re.compile(rf"xla-{_KEY}{re.escape(EXECUTABLE)}"): KINDS[2],
         re.compile(rf".+-{_KEY}{re.escape(LINK)}"): KINDS[3],
         # before the executables were keyed by their lowered module (no link reads these)
         re.compile(rf"(?!xla-).+-{_KEY}{re.escape(EXECUTABLE)}"): KINDS[4]}
_UNFINISHED = re.compile(rf"\..+-{_KEY}{_any(EXPORTED, CALL, REFUSED, EXECUTABLE, LINK)}\..+")
STALE_WRITE_S = 3600.0
"""Age after which a kept file's temporary (its writer was killed mid-write) may be removed."""


@dataclasses.dataclass(frozen=True)
class CacheContents:
    """Files and bytes of each kind (:data:`KINDS`) in ``directory``, and how many other files
    (not written by JAX or this package: left alone) it holds."""

    directory: Path
    counts: dict[str, tuple[int, int]]
    other: int

    @property
    def files(self) -> int:
        """How many files of the kinds counted."""
        return sum(n for n, _ in self.counts.values())

    @property
    def bytes(self) -> int:
        """Their size in bytes."""
        return sum(b for _, b in self.counts.values())

    def total(self) -> str:
        """``"N files, SIZE"``."""
        return f"{self.files} file{'s' if self.files != 1 else ''}, {_size(self.bytes)}"

    def table(self) -> str:
        """One line per kind, then the totals, as ``transformer-pde cache`` prints them."""
        width = max(map(len, KINDS))
        lines = [f"  {kind:<{width}}  {n:>6} file{'s' if n != 1 else ' '}  {_size(b):>9}"
                 for kind, (n, b) in self.counts.items()]
        lines.append(f"  {'in all':<{width}}  {self.files:>6} file{'s' if self.files != 1 else ' '}  "
                     f"{_size(self.bytes):>9}")
        if self.other:
            lines.append(f"  and {self.other} other file{'s' if self.other != 1 else ''}, not written "
                         f"by JAX or transformer-pde (left alone)")
        return "\n".join(lines)


def cache_contents(directory) -> CacheContents:
    """What the compile cache at ``directory`` holds (nothing, for a directory not there yet)."""
    return _walk(_cache_dir(directory, "cache_contents"), remove=False)


def clear_compile_cache(directory) -> CacheContents:
    """Remove what JAX and this package wrote in the compile cache at ``directory`` (see the module
    docstring); returns what was removed. A file that cannot be removed is left and not counted."""
    return _walk(_cache_dir(directory, "clear_compile_cache"), remove=True)


def _cache_dir(directory, caller: str) -> Path:
    if isinstance(directory, bool) or not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise ValueError(f"{caller}: directory must be a non-empty path, got {directory!r}")
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ValueError(f"compile cache {str(path)!r} is not a directory")
    return path


def _walk(directory: Path, remove: bool) -> CacheContents:
    counts = {kind: [0, 0] for kind in KINDS}
    other = 0
    for folder, kind_of in ((directory, _jax_kind), (directory / "programs", _kept_kind)):
        try:
            if folder != directory and not stat.S_ISDIR(os.lstat(folder).st_mode):
                continue  # a link in the place of programs/ is not followed (the cache itself may be one)
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if folder == directory and entry.name == "programs" and stat.S_ISDIR(info.st_mode):
                continue  # walked next
            kind = kind_of(Path(entry.path)) if stat.S_ISREG(info.st_mode) else None
            if kind is None:
                other += 1
                continue
            if remove:
                if kind == KINDS[5] and time.time() - info.st_mtime < STALE_WRITE_S:
                    continue  # a live run may be writing it
                try:
                    os.unlink(entry.path)
                except OSError:
                    continue
            counts[kind][0] += 1
            counts[kind][1] += info.st_size
    return CacheContents(directory, {k: (n, b) for k, (n, b) in counts.items()}, other)


def _jax_kind(path: Path) -> str | None:
    return KINDS[0] if _JAX_ENTRY.fullmatch(path.name) else None


def _kept_kind(path: Path) -> str | None:
    if _UNFINISHED.fullmatch(path.name):
        return KINDS[5]
    kind = next((k for pattern, k in _KEPT.items() if pattern.fullmatch(path.name)), None)
    if kind is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # not a FIFO's open that blocks
    except OSError:
        return None
    try:
        first = os.read(fd, len(MAGIC))
    except OSError:
        return None
    finally:
        os.close(fd)
    return kind if first == MAGIC else None


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover
