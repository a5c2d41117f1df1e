"""Every `bench/results/...` path that README.md, kiln/, bench/'s scripts and the tests cite exists.

Results are filed one folder per purpose (bench/results/README.md, the index); a figure's file that
moved, or a citation mistyped, fails here instead of leaving a reader with a dead path. A path may
end in a glob (`X.*`, `X_*.md`) or a brace list (`X.{jsonl.gz,md}`): each alternative must match a
file. Placeholders (`<run>`, `...`) are not paths and are skipped.
"""
from __future__ import annotations

import glob
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
CITED = re.compile(r"bench/results/[A-Za-z0-9_.*{},/-]*[A-Za-z0-9_*}/]")


def citing_files() -> list[pathlib.Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "kiln").rglob("*.py"))]
    files += sorted((ROOT / "bench").glob("*.py")) + sorted((ROOT / "bench").glob("*.sh"))
    files += [f for f in sorted((ROOT / "tests").rglob("*.py")) if f != pathlib.Path(__file__).resolve()]
    return files


def alternatives(path: str) -> list[str]:
    """`a.{x,y}` -> [`a.x`, `a.y`] (one brace list, as the citations use)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if m is None:
        return [path]
    return [path[:m.start()] + part + path[m.end():] for part in m.group(1).split(",")]


def missing_in(text: str, root: pathlib.Path = ROOT) -> list[str]:
    """The cited paths in `text` that match no file or folder under `root`."""
    missing = []
    for cited in CITED.findall(text):
        if "<" in cited or "..." in cited:
            continue
        for path in alternatives(cited.rstrip(".,")):
            if not glob.glob(str(root / path)):
                missing.append(path)
    return missing


def test_cited_results_exist():
    dead = [f"{f.relative_to(ROOT)}: {p}" for f in citing_files() for p in missing_in(f.read_text())]
    assert not dead, "cited results that do not exist (see bench/results/README.md):\n" + "\n".join(dead)


def test_a_dead_citation_is_found():
    text = ("see `bench/results/cpu-zoo/20261201-134204_cpu_zoo.md` and `bench/results/20261201-134204_cpu_zoo.md`,\n"
            "bench/results/gpu-suite/20261201-205258_cuda_hf.{jsonl.gz,md} and bench/results/fuzz/none_*.md")
    assert missing_in(text) == ["bench/results/20261201-134204_cpu_zoo.md", "bench/results/fuzz/none_*.md"]
