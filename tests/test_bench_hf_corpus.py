"""The transformers capture corpus on a small sample (kiln.bench.hf_corpus): six architectures, one
of them a mixture of experts, each correct and ONE graph through kiln and through torch.compile
with the same counting backend; the markdown report counts them. The full corpus is
`python -m kiln.bench.hf_corpus` (its table is under bench/results/hf_corpus/)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from kiln.bench import hf_corpus, hf_corpus_report  # noqa: E402
from kiln.bench.hf_tiny import Entry  # noqa: E402

SAMPLE = [("gpt2", "GPT2Model"), ("bert", "BertForMaskedLM"), ("t5", "T5Model"), ("llama", "LlamaForCausalLM"),
          ("vit", "ViTModel"), ("mixtral", "MixtralForCausalLM")]


@pytest.fixture(scope="module")
def rows():
    return [hf_corpus.run_model(Entry(t, c, "sample")) for t, c in SAMPLE]


def test_sample_is_correct_and_one_graph(rows):
    for row in rows:
        assert "skipped" not in row, row
        for compiler in hf_corpus.COMPILERS:
            result = row[compiler]
            assert hf_corpus_report.one_graph(result), f"{row['model']} through {compiler}: {result}"


def test_report_counts_the_sample(rows, tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = hf_corpus_report.write_markdown(str(path))
    assert "| kiln | 6 | 6 | 0 | 0 | 0 | 6 | 0 |" in text and "| torch.compile | 6 | 6 | 0 | 0 | 0 | 6 | 0 |" in text
    assert (tmp_path / "run.md").read_text() == text


def test_wrong_results_are_reported():
    import torch
    assert hf_corpus.same(torch.ones(2), torch.ones(2)) is None
    assert "max difference" in hf_corpus.same(torch.ones(2), torch.zeros(2))
    assert "output tensors" in hf_corpus.same((torch.ones(2),), (torch.ones(2), torch.ones(1)))


def test_one_compiler_rerun_keeps_the_others_results():
    """`--compilers kiln --resume run.jsonl`: the new kiln result, torch.compile's from the run."""
    earlier = {"model": "M", "kiln": {"status": "wrong"}, "torch.compile": {"status": "correct"}}
    row = hf_corpus._with_earlier({"model": "M", "kiln": {"status": "correct"}}, earlier)
    assert row == {"model": "M", "kiln": {"status": "correct"}, "torch.compile": {"status": "correct"}}
    assert hf_corpus._with_earlier({"model": "M", "skipped": "x"}, earlier) == {"model": "M", "skipped": "x"}


def test_model_differences_are_not_wrong_results():
    """A compiled output unlike eager's is the model's doing when eager varies between calls, or when
    eager told it is being compiled (torch.compiler.is_compiling()) gives that output; else wrong."""
    import torch

    class ComputesOtherwiseCompiled(torch.nn.Module):
        def forward(self, x):
            return x * 2 if torch.compiler.is_compiling() else x

    class Random(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand_like(x)

    x = torch.ones(3)
    path = ComputesOtherwiseCompiled()
    assert hf_corpus._status(path, {"x": x}, [x * 2], path(x), path(x), {})[0] == "compile_path"
    assert hf_corpus._status(path, {"x": x}, [x * 3], path(x), path(x), {})[0] == "wrong"
    assert hf_corpus._status(path, {"x": x}, [x], path(x), path(x), {}) == ("correct", None)
    noisy = Random()
    assert hf_corpus._status(noisy, {"x": x}, [x], noisy(x), noisy(x), {})[0] == "eager_varies"


def test_fullgraph_column_is_one_graph_or_raised_naming_the_line():
    """`--compilers "kiln fullgraph"`: a break under fullgraph=True is `raised` with the user's line."""
    import torch

    class Breaks(torch.nn.Module):
        def forward(self, input_ids):
            return input_ids * int(input_ids.sum())

    result = hf_corpus._RUNNERS["kiln fullgraph"]
    try:
        result(Breaks(), {"input_ids": torch.ones(2)})
        raise AssertionError("fullgraph=True returned")
    except Exception as e:
        from kiln.errors import Unsupported
        assert isinstance(e, Unsupported) and e.where and "test_bench_hf_corpus.py" in e.where
    rows = [{"model": "A", "kiln fullgraph": {"status": "raised", "detail": "x.py:1 in f: r", "graphs": None,
                                              "breaks": []}, "kiln": {"status": "correct", "detail": None,
                                                                      "graphs": 2, "breaks": [{"reason": "r"}]}}]
    assert "1 models: 0 one graph, 1 raised" in hf_corpus_report.markdown(rows, "t")
