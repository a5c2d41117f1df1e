"""Every known failure of PyTorch 2.0's suites on the CPU sweep, with its cause, in one place.

The sweep (issue #35 item 3): every model of pt2-hf, pt2-timm and pt2-vision at batch 2, fp32,
inference and one training step, kiln against eager by the benchmark's rule (`kiln.bench.accuracy`).
A row that does not pass is listed here under (suite, model, mode) with the status it had, the
first line of its error, and a diagnosis; `CAUSES` names each cause once, so that causes can be
closed in order of how many models they touch (`by_cause()`). `tests/test_bench_pt2_sample.py`
holds a sample model listed here to its listed status, and `python -m kiln.bench.pt2_summary`
flags sweep rows that fail without an entry here, and entries whose row now passes.
"""
from __future__ import annotations

import dataclasses

# cause -> what it is, and where it comes from (the diagnosis)
CAUSES: dict[str, str] = {
    "unavailable": "the model cannot be built here (removed from its library, operators that do not load, "
                   "or too large for this CPU's memory): not a kiln failure",
    "cpu-timeout": "the case did not finish within --timeout 600 s on the sweep's 2-core machine shared with three "
                   "other sessions (load average 6-11): eager, kiln's compile and the float64 reference of a large "
                   "model at a large input; not known to be a failure, rerun on a quiet machine or with a longer "
                   "--timeout",
}


@dataclasses.dataclass(frozen=True)
class ExpectedFailure:
    status: str        # the row's status: fail_accuracy | fail_to_run | not_yet | unavailable
    cause: str         # a key of CAUSES
    error: str         # the first line of the row's error, as the sweep saw it

    def __post_init__(self):
        assert self.cause in CAUSES, f"unknown cause {self.cause!r}: add it to CAUSES with its diagnosis"


_UNAVAILABLE = {
    ("pt2-hf", "Speech2Text2ForCausalLM"): "transformers 5 removed Speech2Text2",
    ("pt2-timm", "gluon_xception65"): "timm 0.9 removed the Gluon Xception port",
    ("pt2-vision", "vision_maskrcnn"): "torchvision's C++ operators do not load with this CPU torch",
    ("pt2-hf", "BlenderbotForCausalLM"): "2.54B parameters: too large for a 23 GiB CPU machine",
    ("pt2-hf", "BlenderbotForConditionalGeneration"): "2.70B parameters: too large for a 23 GiB CPU machine",
    ("pt2-hf", "GPTJForCausalLM"): "6.05B parameters: too large for a 23 GiB CPU machine",
    ("pt2-hf", "GPTJForQuestionAnswering"): "5.84B parameters: too large for a 23 GiB CPU machine",
    ("pt2-hf", "GPTNeoForCausalLM"): "1.32B parameters: too large for a 23 GiB CPU machine",
    ("pt2-hf", "GPTNeoForSequenceClassification"): "1.32B parameters: too large for a 23 GiB CPU machine",
}

EXPECTED: dict[tuple[str, str, str], ExpectedFailure] = {
    **{(suite, model, mode): ExpectedFailure("unavailable", "unavailable", why)
       for (suite, model), why in _UNAVAILABLE.items() for mode in ("infer", "train")},
    # 271M parameters at 384x384: eager's float32 and float64 training steps alone take minutes here
    ("pt2-timm", "cait_m36_384", "train"): ExpectedFailure(
        "fail_to_run", "cpu-timeout", "timed out after 600 s in the cold run (raise --timeout)"),
}


def expected_failure(suite: str, model: str, mode: str) -> ExpectedFailure | None:
    return EXPECTED.get((suite, model, mode))


def by_cause() -> list[tuple[str, int, list[str]]]:
    """(cause, number of models it touches, those models), most models first."""
    models: dict[str, set[str]] = {}
    for (suite, model, _), failure in EXPECTED.items():
        models.setdefault(failure.cause, set()).add(f"{suite}/{model}")
    return sorted(((cause, len(ms), sorted(ms)) for cause, ms in models.items()), key=lambda x: (-x[1], x[0]))
