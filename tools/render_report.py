#!/usr/bin/env python3
# /// script
# requires-python = ">=3.9"
# dependencies = []
# ///
"""Checks a `ktune report` page in a real browser and saves a screenshot.

Headless Chromium (Debian: `apt-get install chromium`) loads a copy of the page
with a small script appended that measures every `<svg>` as laid out (its
bounding box, its text and shape elements) and lists the resources the page
fetched; `--dump-dom` hands the measurements back. The checks: at least
--min-svgs charts, each laid out with a positive width and height and holding
text and shapes, no resource fetched (the page is self-contained), no
horizontal overflow at --width. Then the original page (no script) is
screenshotted at --width x --height (the top of the page) to --png.

    python3 tools/render_report.py report.html [--png report.png] [--width 1100]
        [--height 2200] [--min-svgs 3] [--chromium /usr/bin/chromium]

Prints one line per chart and a verdict; exit 0 when every check passes, 1 when
one fails, 2 when Chromium is missing or fails. Standard library only.
"""

import argparse
import html
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = """
<script>
window.addEventListener('load', () => {
  const svgs = [...document.querySelectorAll('svg')].map((s) => {
    const r = s.getBoundingClientRect();
    return {
      width: r.width,
      height: r.height,
      texts: s.querySelectorAll('text').length,
      shapes: s.querySelectorAll('circle, rect, polyline, polygon, path, line').length,
    };
  });
  const out = {
    title: document.title,
    svgs,
    resources: performance.getEntriesByType('resource').map((e) => e.name),
    scrollWidth: document.documentElement.scrollWidth,
    scrollHeight: document.documentElement.scrollHeight,
  };
  const pre = document.createElement('pre');
  pre.id = 'ktune-check';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def find_chromium(given):
    for name in [given] if given else ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]:
        path = shutil.which(name) if name else None
        if path:
            return path
    sys.exit("render_report: no chromium found; install it (Debian: apt-get install chromium) or pass --chromium")


def chromium(binary, profile_dir, args, timeout=120):
    """Runs headless Chromium with the network cut off; returns stdout."""
    cmd = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--no-first-run",
        "--disable-background-networking",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={profile_dir}",
        *args,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        sys.exit(f"render_report: chromium exited with {p.returncode}")
    return p.stdout


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", head[16:24])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--png", type=Path, help="screenshot path (default: the report's name with .png)")
    ap.add_argument("--width", type=int, default=1100)
    ap.add_argument("--height", type=int, default=2200)
    ap.add_argument("--min-svgs", type=int, default=1)
    ap.add_argument("--chromium")
    a = ap.parse_args()
    if not a.report.is_file():
        sys.exit(f"render_report: {a.report} is not a file; give the HTML page `ktune report` wrote")
    binary = find_chromium(a.chromium)
    png = a.png or a.report.with_suffix(".png")
    page = a.report.read_text(encoding="utf-8")
    if "</body>" not in page:
        sys.exit("render_report: the page has no </body>; is it a ktune report?")

    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.html"
        probe.write_text(page.replace("</body>", PROBE + "</body>", 1), encoding="utf-8")
        dom = chromium(
            binary,
            Path(tmp) / "profile",
            [f"--window-size={a.width},{a.height}", "--virtual-time-budget=5000", "--dump-dom", probe.resolve().as_uri()],
        )
        m = re.search(r'<pre id="ktune-check">(.*?)</pre>', dom, re.S)
        if not m:
            sys.exit("render_report: the probe left no measurements in the DOM (did the page load?)")
        got = json.loads(html.unescape(m.group(1)))
        svgs = got["svgs"]
        print(f"page: {a.report} ({len(page)} bytes), title: {got['title']!r}")
        print(f"laid out at {a.width} px: {got['scrollWidth']} x {got['scrollHeight']} px")
        print(f"charts: {len(svgs)} <svg> elements")
        for i, s in enumerate(svgs):
            ok = s["width"] > 0 and s["height"] > 0 and s["texts"] > 0 and s["shapes"] > 0
            print(f"  svg {i + 1:3}: {s['width']:7.1f} x {s['height']:7.1f} px, {s['texts']:4} texts, {s['shapes']:4} shapes{'' if ok else '  <-- FAIL'}")
            if not ok:
                failures.append(f"svg {i + 1} is empty or has no size: {s}")
        if len(svgs) < a.min_svgs:
            failures.append(f"{len(svgs)} charts, fewer than --min-svgs {a.min_svgs}")
        if got["resources"]:
            failures.append(f"the page fetched resources: {got['resources']}")
        else:
            print("resources fetched: none")
        if got["scrollWidth"] > a.width:
            failures.append(f"the page is {got['scrollWidth']} px wide, more than the {a.width} px window")

        chromium(binary, Path(tmp) / "profile2", [f"--window-size={a.width},{a.height}", f"--screenshot={png.resolve()}", a.report.resolve().as_uri()])
    size = png_size(png) if png.is_file() else None
    if size is None:
        failures.append(f"no PNG screenshot at {png}")
    else:
        print(f"screenshot: {png} ({size[0]} x {size[1]} px, {png.stat().st_size} bytes)")

    if failures:
        for f in failures:
            print(f"FAIL: {f}")
        sys.exit(1)
    print("ok: every chart is laid out with a size, nothing was fetched")


if __name__ == "__main__":
    main()
