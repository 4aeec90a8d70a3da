"""The report page as a person sees it: Debian's headless Chromium lays out ``index.html`` at a given window width and
reports the page's height, its horizontal overflow and each table's box; it also takes screenshots.

    python tests/reports/browser.py results/default/report/index.html benchmarks/results/report_page.png

(prints the measurements and writes a screenshot of the page's top, 1400 px wide).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WIDTH = 1400
MEASURE = """<script>
(function () {
  const doc = document.documentElement;
  const tables = [...document.querySelectorAll('table')].map((t, i) => {
    const box = t.getBoundingClientRect();
    return {index: i, width: box.width, right: box.right, scroll_width: t.scrollWidth, client_width: t.clientWidth,
            rows: t.rows.length, head: (t.rows[0] ? t.rows[0].innerText : '').slice(0, 80)};
  });
  const out = document.createElement('pre');
  out.id = 'dm-measure';
  out.textContent = JSON.stringify({viewport_width: doc.clientWidth, page_width: doc.scrollWidth,
                                    page_height: doc.scrollHeight, tables: tables,
                                    images: [...document.images].map(im => ({w: im.naturalWidth, ok: im.complete}))});
  document.body.appendChild(out);
})();
</script>"""


def chromium() -> str | None:
    """The Chromium binary on PATH (Debian: ``chromium``), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(args: list[str], timeout: int = 120) -> str:
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium not found on PATH (tests/reports/chromium.sh install)")
    # --no-sandbox: CI runs as root, where Chromium refuses its sandbox.
    base = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--disable-dev-shm-usage",
            "--no-first-run", "--disable-extensions"]
    done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def measure(page: Path, width: int = WIDTH) -> dict:
    """Lay ``page`` out at ``width`` px and return the page's size and every table's box (CSS px)."""
    text = Path(page).read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "page.html"
        probe.write_text(text.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
        dom = _run([f"--window-size={width},1000", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()])
    found = re.search(r'<pre id="dm-measure">(.*?)</pre>', dom, re.DOTALL)
    if found is None:
        raise RuntimeError("the measuring script left no result in the page (did the page load?)")
    return json.loads(html.unescape(found.group(1)))


def screenshot(page: Path, out: Path, width: int = WIDTH, height: int = 2400) -> Path:
    """A PNG of the page's first ``height`` px at ``width`` px."""
    out = Path(out).resolve()
    _run([f"--window-size={width},{height}", f"--screenshot={out}", Path(page).resolve().as_uri()])
    if not out.is_file():
        raise RuntimeError(f"chromium wrote no screenshot to {out}")
    return out


if __name__ == "__main__":
    page, shot = Path(sys.argv[1]), Path(sys.argv[2])
    found = measure(page)
    print(json.dumps({k: v for k, v in found.items() if k != "tables"}, indent=1))
    print("widest table:", max((t["scroll_width"] for t in found["tables"]), default=0), "px")
    print("screenshot:", screenshot(page, shot))
