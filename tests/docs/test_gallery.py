"""docs/gallery.md lists every registered experiment with its figure, what it shows, the paper
and the commands (tiny and published size): a new experiment without a gallery entry fails here.
Regenerate with ``python docs/make_gallery.py NAME``."""

import re
import struct
from pathlib import Path

from transformer_pde import experiments

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _sections() -> dict[str, str]:
    text = (DOCS / "gallery.md").read_text()
    parts = re.split(r"^## (\S+)\s*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_experiment_has_a_gallery_entry_with_its_figure():
    sections = _sections()
    assert sorted(sections) == sorted(experiments.REGISTRY), "run: python docs/make_gallery.py NAME"
    for name, body in sections.items():
        assert f"![{name}](gallery/{name}.png)" in body, name
        png = DOCS / "gallery" / f"{name}.png"
        assert png.is_file(), png
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 200_000, (name, len(data))
        width, height = struct.unpack(">II", data[16:24])
        assert width >= 300 and height >= 150, (name, width, height)
        assert re.search(r"\*\*Paper:\*\*.*arXiv \d{4}\.\d{4,5}", body), name
        assert f"transformer-pde run {name} --out" in body and f"\ntransformer-pde run {name}\n" in body, name


def test_gallery_commands_are_the_tiny_sizes():
    """The command printed under each figure passes exactly the experiment's tiny options (none
    for the few figures made at the published size, make_gallery.PUBLISHED)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_gallery", DOCS / "make_gallery.py")
    gallery = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gallery)
    sections = _sections()
    for name, exp in experiments.REGISTRY.items():
        line = next(ln for ln in sections[name].splitlines() if ln.startswith(f"transformer-pde run {name} --out"))
        flags = {tok[2:].replace("-", "_") for tok in line.split() if tok.startswith("--")}
        flags = {f[3:] if f.startswith("no_") and f[3:] in exp.option_names else f for f in flags}
        expected = set() if name in gallery.PUBLISHED else set(exp.tiny)
        assert flags - {"out", "no_progress", "replace"} == expected, name
