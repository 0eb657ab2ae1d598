"""Check the built documentation site in a real browser (headless Chromium).

    mkdocs build --strict && python docs/check_site.py            # checks site/
    python docs/check_site.py SITE_DIR [--chromium PATH]

Serves SITE_DIR on 127.0.0.1 (a free port), starts headless Chromium (Debian's package:
``apt-get install chromium``) and drives it over the Chrome DevTools protocol (a websocket; the
tiny client below, no Selenium or Playwright):

1. a page with math (the home page and an API page with docstring formulas): KaTeX has typeset
   every formula (``.arithmatex`` elements hold ``.katex`` output) and no raw TeX delimiter
   (``\\(``, ``\\[``, ``$$``) is left in the page's text outside code;
2. the tutorial notebooks: no TeX left untypeset in their Markdown cells;
3. the search: types ``SoftmaxAttention`` into the search box, as a user does, and waits for the
   search worker's results; one of them must link to the class's reference.

Screenshots go to the site directory: ``browser-check-math.png``, ``browser-check-search.png``.
Exit status 0 when both checks pass, 1 when one fails, 2 when no Chromium is found.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
MATH_PAGES = ("", "api/models/")  # the home page's formulas, and the docstrings' formulas
SEARCH_TERM = "SoftmaxAttention"


def find_chromium(explicit: str | None = None) -> str | None:
    """The Chromium binary: ``explicit``, ``$CHROMIUM``, or the first of CHROMIUM_NAMES on PATH."""
    for name in (explicit, os.environ.get("CHROMIUM"), *CHROMIUM_NAMES):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


# ------------------------------------------------------------------------------ a tiny CDP client


class DevTools:
    """One websocket to a page target (RFC 6455 client frames: text, masked; no extensions)."""

    def __init__(self, ws_url: str, timeout: float = 30.0):
        assert ws_url.startswith("ws://")
        hostport, _, path = ws_url[len("ws://"):].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the websocket handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"DevTools refused the websocket: {head[:200]!r}")
        self._buf = head.split(b"\r\n\r\n", 1)[1]
        self._id = 0
        self.events: list[dict] = []

    def _recv_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("DevTools closed the websocket")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _recv_message(self) -> dict:
        data = b""
        while True:
            b0, b1 = self._recv_exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._recv_exact(8))[0]
            payload = self._recv_exact(n)
            if b0 & 0x0F == 0x8:
                raise ConnectionError("DevTools closed the websocket")
            data += payload
            if b0 & 0x80:  # FIN
                return json.loads(data)

    def send(self, method: str, **params):
        """Call a CDP method and return its result (events that arrive meanwhile are kept)."""
        self._id += 1
        payload = json.dumps({"id": self._id, "method": method, "params": params}).encode()
        header = bytes([0x81])
        n = len(payload)
        header += (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n) if n < 1 << 16
                   else bytes([0x80 | 127]) + struct.pack(">Q", n))
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
        while True:
            msg = self._recv_message()
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def evaluate(self, expression: str):
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0, interval: float = 0.2):
        """Poll ``expression`` until it is truthy; its last value (falsy on timeout)."""
        end = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > end:
                return value
            time.sleep(interval)

    def navigate(self, url: str, ready: str = "document.readyState === 'complete'", timeout: float = 30.0):
        self.send("Page.navigate", url=url)
        time.sleep(0.2)
        if not self.wait_for(ready, timeout):
            raise TimeoutError(f"{url} did not load in {timeout} s")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self):
        self.sock.close()


# ------------------------------------------------------------------------------ the checks

# Every .arithmatex element holds KaTeX output, and no TeX delimiter is left in the page's text
# once formulas, code and the notebooks' source cells are taken out.
MATH_JS = r"""
(() => {
  const math = [...document.querySelectorAll('.arithmatex')];
  const untypeset = math.filter(el => !el.querySelector('.katex')).map(el => el.textContent.slice(0, 80));
  const body = document.querySelector('article') || document.body;
  const clone = body.cloneNode(true);
  clone.querySelectorAll('.katex, pre, code, script, style').forEach(el => el.remove());
  const text = clone.textContent;
  const raw = ['\\(', '\\[', '$$'].filter(d => text.includes(d));
  return {arithmatex: math.length, katex: document.querySelectorAll('.katex').length,
          untypeset: untypeset, raw_delimiters: raw};
})()
"""

# The notebooks' Markdown cells: no TeX left untypeset ($$, \(, \[, or a $...$ holding a TeX command).
NOTEBOOK_MATH_JS = r"""
(() => {
  const cells = [...document.querySelectorAll('.jupyter-wrapper .jp-RenderedMarkdown')];
  const raw = [];
  for (const cell of cells) {
    const clone = cell.cloneNode(true);
    clone.querySelectorAll('.katex, pre, code').forEach(el => el.remove());
    const text = clone.textContent;
    if (text.includes('$$') || text.includes('\\(') || text.includes('\\[') || /\$[^$\n]*\\[a-zA-Z]+[^$\n]*\$/.test(text))
      raw.push(text.trim().slice(0, 80));
  }
  return {cells: cells.length, katex: document.querySelectorAll('.jupyter-wrapper .katex').length, raw: raw};
})()
"""

SEARCH_RESULTS_JS = r"""
(() => {
  const links = [...document.querySelectorAll('.md-search-result__item a.md-search-result__link')];
  return links.map(a => ({text: a.textContent.trim().replace(/\s+/g, ' ').slice(0, 120), href: a.href}));
})()
"""


def check_math(page: DevTools, base: str, out_dir: Path) -> list[str]:
    problems = []
    for i, path in enumerate(MATH_PAGES):
        page.navigate(base + path)
        # KaTeX typesets on document$ (Material) or DOMContentLoaded: wait for its output
        page.wait_for("document.querySelectorAll('.arithmatex').length === 0 || "
                      "[...document.querySelectorAll('.arithmatex')].every(e => e.querySelector('.katex'))")
        r = page.evaluate(MATH_JS)
        name = path or "index"
        print(f"math  {name}: {r['arithmatex']} formulas, {r['katex']} typeset by KaTeX, "
              f"raw delimiters left: {r['raw_delimiters'] or 'none'}")
        if r["arithmatex"] == 0 or r["katex"] == 0:
            problems.append(f"{name}: no formula typeset ({r['arithmatex']} math elements, {r['katex']} KaTeX)")
        if r["untypeset"]:
            problems.append(f"{name}: formulas left as TeX: {r['untypeset'][:3]}")
        if r["raw_delimiters"]:
            problems.append(f"{name}: raw TeX delimiters in the text: {r['raw_delimiters']}")
        if i == 0:
            print(f"      screenshot {page.screenshot(out_dir / 'browser-check-math.png')}")
    return problems


def check_notebooks(page: DevTools, base: str, site: Path) -> list[str]:
    """Every tutorial notebook's formulas are typeset (the notebooks keep Jupyter's $ and $$)."""
    problems = []
    for index in sorted(site.glob("tutorials/*/index.html")):
        path = index.parent.relative_to(site).as_posix() + "/"
        page.navigate(base + path)
        page.wait_for("typeof renderMathInElement !== 'undefined'", timeout=10)
        r = page.wait_for(f"(() => {{ const r = {NOTEBOOK_MATH_JS}; return r.raw.length ? null : r; }})()", timeout=5)
        if not r:
            r = page.evaluate(NOTEBOOK_MATH_JS)
            problems.append(f"{path}: formulas left as TeX: {r['raw'][:3]}")
        print(f"notebook {path}: {r['cells']} Markdown cells, {r['katex']} formulas typeset, raw TeX left: "
              f"{r['raw'] or 'none'}")
    return problems


def check_search(page: DevTools, base: str, out_dir: Path, term: str = SEARCH_TERM) -> list[str]:
    page.navigate(base)
    page.evaluate("document.querySelector('.md-search__input').focus()")
    page.send("Input.insertText", text=term)  # typed, as a user types: the input events fire
    results = page.wait_for(f"(() => {{ const r = {SEARCH_RESULTS_JS}; "
                            f"return r.some(x => x.text.includes({json.dumps(term)})) ? r : null; }})()")
    print(f"      screenshot {page.screenshot(out_dir / 'browser-check-search.png')}")
    if not results:
        got = page.evaluate(SEARCH_RESULTS_JS)
        return [f"search for {term!r}: no result names it (results: {[r['text'][:40] for r in got][:5]})"]
    hits = [r for r in results if term in r["text"]]
    print(f"search {term!r}: {len(results)} results, first: {hits[0]['text'][:60]!r} -> {hits[0]['href']}")
    if not any("/api/" in r["href"] for r in hits):
        return [f"search for {term!r}: no result links to its reference ({[r['href'] for r in hits][:3]})"]
    return []


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class BrowserUnavailable(RuntimeError):
    """The browser is installed but does not run here (a sandbox without the kernel features it
    needs): the check cannot be made, which is not a failure of the site."""


def check_site(site_dir, chromium: str | None = None, timeout: float = 60.0) -> list[str]:
    """Run the browser checks on a built site; the list of problems (empty: passed).

    Raises FileNotFoundError when ``site_dir`` has no built site or no Chromium is found.
    """
    site = Path(site_dir).resolve()
    if not (site / "index.html").exists():
        raise FileNotFoundError(f"{site} has no index.html: build the site first (mkdocs build --strict)")
    binary = find_chromium(chromium)
    if binary is None:
        raise FileNotFoundError(f"no Chromium found (tried {', '.join(CHROMIUM_NAMES)}; set $CHROMIUM); "
                                "on Debian: apt-get install chromium")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    profile = tempfile.mkdtemp(prefix="tp-check-site-")
    proc = subprocess.Popen(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--window-size=1280,900",
         f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    page = None
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        end = time.monotonic() + timeout
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > end:
                raise BrowserUnavailable(f"{binary} did not start its DevTools endpoint within {timeout} s "
                                         f"(exit status {proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout))
        ws = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
        page = DevTools(ws, timeout=timeout)
        page.send("Page.enable")
        page.send("Runtime.enable")
        return check_math(page, base, site) + check_notebooks(page, base, site) + check_search(page, base, site)
    finally:
        if page is not None:
            page.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("site", nargs="?", default="site", help="the built site (default: site/)")
    p.add_argument("--chromium", help="the browser binary (default: $CHROMIUM, else chromium on PATH)")
    args = p.parse_args(argv)
    if find_chromium(args.chromium) is None:
        print("check_site: no Chromium found; on Debian: apt-get install chromium", file=sys.stderr)
        return 2
    try:
        problems = check_site(args.site, args.chromium)
    except BrowserUnavailable as e:
        print(f"check_site: {e}; the check is skipped", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    print("browser check: " + ("passed" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
