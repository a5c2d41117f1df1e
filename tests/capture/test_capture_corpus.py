"""The corpus (`capture_corpus.py`, `capture_corpus_python.py`, `capture_corpus_stdlib.py`,
`capture_corpus_libraries.py`, `capture_corpus_breaks.py`, `capture_corpus_aliasing.py`,
`capture_corpus_real_code.py`): each program equals eager on two input sets, each
called twice, and compiles to the expected number of graphs (one, where no break is intended)."""
from __future__ import annotations

import pytest

import capture_corpus as corpus
import capture_corpus_aliasing  # noqa: F401 (registers programs)
import capture_corpus_breaks  # noqa: F401 (registers programs)
import capture_corpus_python  # noqa: F401 (registers programs)
import capture_corpus_libraries  # noqa: F401 (registers programs)
import capture_corpus_stdlib  # noqa: F401 (registers programs)
import capture_corpus_real_code  # noqa: F401 (registers programs)
from capture_support import breaks_of, run_compiled
from kiln.config import CaptureConfig

PROGRAMS = corpus.PROGRAMS


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_program(prog):
    fullgraph = prog.breaks == 0
    recorder = run_compiled(prog.fn, prog.inputs, config=CaptureConfig(fullgraph=fullgraph))
    breaks = breaks_of(recorder)
    assert len(recorder.graphs) == prog.graphs, f"{len(recorder.graphs)} graphs, expected {prog.graphs}"
    assert len(breaks) == prog.breaks, f"{len(breaks)} breaks ({[b.detail for b in breaks]}), expected {prog.breaks}"


def test_corpus_size():
    assert len(PROGRAMS) >= 400
