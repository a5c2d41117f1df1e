"""PyTorch 2.0's suites (pt2-hf, pt2-timm, pt2-vision): every list name maps to a model built from
its config or constructor, or to a stated reason; a few models of each run through the harness at
batch 1 with their suite's inputs; --shard and --resume pick the cases they should."""
import argparse
import json
import os

import pytest
import torch

from kiln.bench.__main__ import build_cases, parser
from kiln.bench.case import Case, run, status_of_error
from kiln.bench.pt2_suites import ModelUnavailable, hf_inputs, read_list, reason_unavailable
from kiln.bench.suites import SUITES

LISTS = {"pt2-hf": "pt2_huggingface.txt", "pt2-timm": "pt2_timm.txt", "pt2-vision": "pt2_vision.txt"}
SAMPLE = {"pt2-hf": ["ElectraForQuestionAnswering", "BlenderbotSmallForCausalLM"],
          "pt2-timm": ["lcnet_050", "regnety_002"],
          "pt2-vision": ["squeezenet1_1", "shufflenet_v2_x1_0"]}


def suite_or_skip(suite: str):
    if SUITES[suite].missing():
        pytest.skip(SUITES[suite].missing())
    return SUITES[suite].models()


@pytest.mark.parametrize("suite", sorted(LISTS))
def test_every_list_name_is_a_model_or_a_stated_reason(suite):
    models = suite_or_skip(suite)
    listed = read_list(LISTS[suite])
    assert list(models) == list(listed) and len(listed) == {"pt2-hf": 53, "pt2-timm": 62, "pt2-vision": 12}[suite]
    for name, spec in models.items():
        reason = reason_unavailable(suite, name)
        if reason is not None:
            with pytest.raises(ModelUnavailable, match=name) as raised:
                spec.make("meta", batch=2)
            assert reason in str(raised.value)
            continue
        model, args, kwargs = spec.make("meta", batch=2)   # shapes only: no memory, no download
        assert sum(p.numel() for p in model.parameters()) > 1e6, name
        first = (args or tuple(kwargs.values()))[0]
        assert (first[0] if isinstance(first, list) else first).shape[0] in (2, 3), name


def test_batch_is_the_lists_on_cuda_and_two_elsewhere():
    spec = suite_or_skip("pt2-timm")["lcnet_050"]
    assert spec.batch == 128 and spec.cpu_batch == 2
    _, (images,), _ = spec.make("meta")
    assert images.shape == (2, 3, 224, 224)


def test_hf_inputs_follow_pytorchs_runner():
    transformers = pytest.importorskip("transformers")
    bart = hf_inputs("BartForConditionalGeneration", transformers.BartConfig(), 2, torch.device("cpu"))
    assert bart["input_ids"].shape == (2, 1024) and bool((bart["input_ids"][:, -1] == 2).all())
    assert bart["labels"].shape == (2, 1024)
    qa = hf_inputs("BertForQuestionAnswering", transformers.BertConfig(), 2, torch.device("cpu"))
    assert set(qa) == {"input_ids", "start_positions", "end_positions"} and qa["start_positions"].shape == (2,)
    t5 = hf_inputs("T5Small", transformers.T5Config(), 1, torch.device("cpu"))
    assert torch.equal(t5["decoder_input_ids"], t5["input_ids"])


@pytest.mark.parametrize("suite,name", [(s, n) for s, names in SAMPLE.items() for n in names])
def test_sample_models_run_eagerly_through_the_harness(suite, name):
    suite_or_skip(suite)
    for mode in ("infer", "train"):
        row = run(Case(suite, name, mode, "fp32", "eager", steps=1, warmup=1, batch=1))
        assert row["status"] == "pass" and row["ms"] > 0, (mode, row)


def test_an_unavailable_model_is_its_own_status():
    assert status_of_error(ModelUnavailable("x: gone"))["status"] == "unavailable"
    assert status_of_error(RuntimeError("boom"))["status"] == "fail_to_run"


def args_of(*argv: str) -> argparse.Namespace:
    args = parser().parse_args(list(argv))
    args.method = args.method or "interleaved"
    return args


def test_shards_partition_the_models_and_resume_skips_finished_cases(tmp_path):
    suite_or_skip("pt2-vision")
    flags = ("--suite", "pt2-vision", "--modes", "infer,train", "--compilers", "eager,kiln")
    everything, _ = build_cases(args_of(*flags))
    shards = [build_cases(args_of(*flags, "--shard", f"{i}/3"))[0] for i in range(3)]
    assert sorted(c.key for s in shards for c in s) == sorted(c.key for c in everything)
    assert len({c.model for c in shards[0]} & {c.model for c in shards[1]}) == 0
    done = tmp_path / "done.jsonl"
    first = everything[0]
    lines = [{"type": "run"}] + [{"type": "row", "suite": first.suite, "model": first.model, "mode": first.mode,
                                  "precision": first.precision, "compiler": c, "device": "cpu", "batch": None}
                                 for c in ("eager", "kiln")]
    done.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    resumed, notes = build_cases(args_of(*flags, "--resume", str(done)))
    assert [c.key for c in resumed] == [c.key for c in everything[1:]] and any("resumed" in n for n in notes)
    with pytest.raises(SystemExit):
        build_cases(args_of(*flags, "--shard", "3/3"))


def test_a_model_too_large_for_this_cpu_is_unavailable_with_its_size():
    from kiln.bench.pt2_suites import BYTES_PER_PARAMETER, too_large_for_cpu
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert too_large_for_cpu(10_000_000) is None
    reason = too_large_for_cpu(int(memory / BYTES_PER_PARAMETER))
    assert reason is not None and "GiB" in reason


def test_the_sweep_summary_counts_passes_and_groups_failures_by_cause(tmp_path):
    from kiln.bench.pt2_summary import summarize
    rows = [{"model": "lcnet_050", "mode": "infer", "status": "pass"},
            {"model": "lcnet_050", "mode": "train", "status": "fail_accuracy", "error": "result 3: RMSE"},
            {"model": "gluon_xception65", "mode": "infer", "status": "unavailable", "error": "removed"},
            {"model": "gluon_xception65", "mode": "train", "status": "pass"}]
    path = tmp_path / "cpu_pt2-timm.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"type": "run"}] + [
        {"type": "row", "suite": "pt2-timm", "compiler": "kiln", "precision": "fp32", "device": "cpu", **r}
        for r in rows]) + "\n")
    text = summarize([str(path)])
    assert "| pt2-timm | 2 | 1/2 | 1/2 | 1 | 1 |" in text
    assert "**unavailable** (1 rows, 1 models)" in text
    assert "pt2-timm/lcnet_050 train: fail_accuracy: result 3: RMSE" in text     # no entry: unexplained
    assert "pt2-timm/gluon_xception65 train: passes now" in text                   # an entry that is stale
