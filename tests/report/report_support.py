"""Helpers of the report tests: run a script under `kiln report --`, read the event log, and load
a page in headless Chromium (its rendered DOM as a small element tree, and a screenshot)."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))


def run_report(script: str, folder: str) -> tuple[str, str, subprocess.CompletedProcess]:
    """`kiln report -o page --trace log -- python script` in a fresh process: (log folder, page, result).
    The program cache is off so that every graph is lowered and its kernels are in the log."""
    trace, page = os.path.join(folder, "trace"), os.path.join(folder, "report.html")
    env = {**os.environ, "PYTHONPATH": ROOT, "KILN_DISABLE_CACHE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("KILN_TRACE", None)
    result = subprocess.run([sys.executable, "-m", "kiln.cli", "report", "-o", page, "--trace", trace, "--",
                             sys.executable, os.path.join(HERE, script)],
                            cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return trace, page, result


def events(trace: str) -> list[dict]:
    with open(os.path.join(trace, "kiln-trace.jsonl")) as f:
        return [json.loads(line) for line in f]


# ------------------------------------------------------------------------------------- browser

def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (Debian: apt-get install -y chromium; .ci/run installs it "
                "when it runs as root)")


def _browser(page: str, profile: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                           *flags, "file://" + os.path.abspath(page)],
                          capture_output=True, text=True, timeout=180)


def rendered_dom(page: str, profile: str) -> "Element":
    result = _browser(page, profile, "--dump-dom")
    assert "<body" in result.stdout, result.stderr[-2000:]
    return parse_html(result.stdout)


def screenshot(page: str, png: str, profile: str) -> tuple[int, int]:
    """Save a 1280x2000 screenshot of `page` at `png`; returns the PNG's (width, height)."""
    _browser(page, profile, f"--screenshot={png}", "--window-size=1280,2000", "--hide-scrollbars")
    with open(png, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"no PNG written at {png}"
    return struct.unpack(">II", head[16:24])


# ---------------------------------------------------------------------------------- a DOM tree

@dataclasses.dataclass
class Element:
    tag: str
    attrs: dict
    children: list = dataclasses.field(default_factory=list)   # Element | str

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    @property
    def classes(self) -> set:
        return set(self.attrs.get("class", "").split())

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs) -> list["Element"]:
        out = []
        for c in self.children:
            if isinstance(c, Element):
                if (tag is None or c.tag == tag) and (cls is None or cls in c.classes) and \
                        all(c.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items()):
                    out.append(c)
                out += c.find_all(tag, cls, **attrs)
        return out

    def find(self, tag: str | None = None, cls: str | None = None, **attrs) -> "Element":
        found = self.find_all(tag, cls, **attrs)
        assert found, f"no <{tag or '*'} class={cls} {attrs}> in the page"
        return found[0]


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _TreeBuilder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in _VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag):
        for k in range(len(self.stack) - 1, 0, -1):
            if self.stack[k].tag == tag:
                del self.stack[k:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse_html(text: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(text)
    return builder.root
