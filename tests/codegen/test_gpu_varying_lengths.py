"""CUDA: HF BERT over ten sequence lengths compiles one graph (dynamic=True) or two (dynamic=None).

Issue #17: on the H200, BERT-base (batch 16, bf16 autocast, inference) over 128, 200, 256, 317,
384, 450, 512, 77, 300, 511 compiled a graph per length up to the cache limit, while the CPU gave
one. A failure here prints every recompile's reason (the guard, the value now, the user's line and
the kernel line that raised it) and the shape guards of the first entry: that names the guard
that depends on the device. Needs a CUDA device; run on the GPU machine:

    python -m pytest -q -m gpu tests/codegen/test_gpu_varying_lengths.py
"""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln import backends
from kiln.capture import frame
from kiln.capture.guards import GuardKind
from kiln.config import Options

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
transformers = pytest.importorskip("transformers")

LENGTHS = (128, 200, 256, 317, 384, 450, 512, 77, 300, 511)


def _bert() -> torch.nn.Module:
    """BERT-tiny with BERT-base's head size (64) and position table (512), dropout off."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=512, max_position_embeddings=512)
    return transformers.BertForMaskedLM(config).cuda().eval()


def _diagnosis(events, wrappers) -> str:
    lines = [f"  {e.kind} of {e.function}: {e.detail}" for e in events if e.kind in ("recompile", "eager", "break")]
    for w in wrappers:
        for g in (w.entries[0].guards if w.entries else []):
            if g.kind is GuardKind.SHAPES:
                lines.append(f"  first entry's shape guards of {frame._name(w.fn)}: {g.expected[2]}")
    return "\n".join(lines)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
@pytest.mark.parametrize("backend", ["kiln", "eager"])
def test_cuda_bert_over_lengths_compiles_once(backend, dynamic, precision):
    kiln.reset()
    model = _bert()
    inner = backends.resolve(backend, Options())
    graphs, programs = [], []

    def counting(gm, example_inputs):
        graphs.append(gm)
        programs.append(inner(gm, example_inputs))
        return programs[-1]
    fast = kiln.compile(model, backend=counting, dynamic=dynamic)
    events: list = []
    frame._EVENT_SINKS.append(events)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")
    try:
        with torch.no_grad(), autocast, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for length in LENGTHS:
                ids = torch.randint(0, 1000, (16, length), device="cuda")
                got, want = fast(input_ids=ids).logits, model(input_ids=ids).logits
                # loose in bf16: this test counts graphs; bench's accuracy rule judges bf16 numerics
                tol = dict(rtol=1e-1, atol=1e-1) if precision == "bf16" else dict(rtol=1e-3, atol=1e-3)
                torch.testing.assert_close(got.float(), want.float(), **tol, msg=lambda m: f"length {length}: {m}")
    finally:
        frame._EVENT_SINKS.remove(events)
    wrappers = [w for w in list(frame._ALL_WRAPPERS) if w.backend is not None and w.entries]
    expected = 1 if dynamic else 2
    assert len(graphs) == expected, f"{len(graphs)} graphs for {len(LENGTHS)} lengths:\n" + _diagnosis(events, wrappers)
    counts = [len(getattr(p, "programs", None) or {0: p}) for p in programs]
    assert sum(counts) == expected, f"backend programs per graph: {counts}"
