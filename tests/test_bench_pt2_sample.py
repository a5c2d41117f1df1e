"""A fixed sample of PyTorch 2.0's suites (issue #35 item 3), compiled by kiln at batch 2 and
compared with eager by the benchmark's rule (allclose, else RMSE against float64 at most 2x eager's):
inference, and one training step's loss and gradients. The full sweep is `kiln bench --suite pt2-...`
(bench/results/pt2-suites/); its known failures, with causes, are in kiln/bench/pt2_expected_failures.py,
and a sample model listed there is expected to fail the same way."""
import pytest

from kiln.bench.case import Case, run
from kiln.bench.pt2_expected_failures import expected_failure
from kiln.bench.suites import SUITES

SAMPLE = [("pt2-timm", "lcnet_050"), ("pt2-vision", "squeezenet1_1"), ("pt2-hf", "ElectraForQuestionAnswering")]


@pytest.mark.parametrize("mode", ["infer", "train"])
@pytest.mark.parametrize("suite,name", SAMPLE)
def test_kiln_matches_eager_on_the_sample(suite, name, mode):
    if SUITES[suite].missing():
        pytest.skip(SUITES[suite].missing())
    row = run(Case(suite, name, mode, "fp32", "kiln", steps=1, warmup=0))
    expected = expected_failure(suite, name, mode)
    if expected is not None:
        assert row["status"] == expected.status, (row, expected)
        pytest.xfail(expected.cause)
    assert row["status"] == "pass", row
    assert row["graphs"] >= 1, "nothing was captured: the model ran eagerly"
