"""(op, sample) pairs the every-sample sweep (tests/codegen/sweep_ops.py --every-sample) found
failing, run as the sweep runs them: fullgraph=True, float32, CPU, forward and gradients."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from sweep_ops import _samples, run_sample  # noqa: E402

# (op name, variant, sample index, what was wrong)
PAIRS = [
    # diag_embed's values were broadcast with the batch dims out of order when a batch dim comes
    # after the diagonal's (dim1=0, dim2=1): the prims stage refused the broadcast
    ("diag_embed", "", 12, "offset=1, dim1=1, dim2=2"),
    ("diag_embed", "", 13, "offset=2, dim1=0, dim2=1"),
    ("diag_embed", "", 14, "offset=-2, dim1=0, dim2=1"),
]


@pytest.mark.parametrize("name,variant,index,why", PAIRS, ids=[f"{n}-{i}" for n, _, i, _ in PAIRS])
def test_pair_matches_eager(name, variant, index, why):
    from torch.testing._internal.common_methods_invocations import op_db
    op = next(o for o in op_db if o.name == name and o.variant_test_name == variant)
    grad = bool(op.supports_autograd)
    row = run_sample(op, _samples(op, grad)[index], grad)
    assert row["forward"] == "pass", row
    assert row["gradient"] in ("pass", "skip") and (row["gradient"] == "pass" or not grad), row


def test_a_sample_with_dims_first_is_not_swapped():
    import kiln
    x = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)   # every dim a different size
    for kwargs in ({"offset": 0, "dim1": 0, "dim2": 1}, {"offset": 1, "dim1": 0, "dim2": 2},
                   {"offset": -1, "dim1": 1, "dim2": 3}):
        kiln.reset()
        got = kiln.compile(lambda t: torch.diag_embed(t, **kwargs), fullgraph=True)(x)
        torch.testing.assert_close(got, torch.diag_embed(x, **kwargs), rtol=0, atol=0)


def test_a_bfloat16_pair_is_held_to_the_benchmarks_rule():
    """[Note: reduced-precision sweep]: a bfloat16 sample passes when kiln is as close to its
    float64 run as eager is, and a result off by 5% fails however the float64 run lies."""
    from torch.testing._internal.common_methods_invocations import op_db
    from sweep_ops import _compare_reduced
    op = next(o for o in op_db if o.name == "nn.functional.layer_norm")
    sample = _samples(op, True, torch.bfloat16)[1]
    row = run_sample(op, sample, True, torch.bfloat16)
    assert row["forward"] == "pass" and row["gradient"] == "pass", row
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    assert _compare_reduced(x, x, x.double(), 1e-2) == ""
    assert _compare_reduced(x * 1.05, x, x.double(), 1e-2).startswith("AssertionError")


def test_the_expected_failures_name_real_ops_and_still_fail():
    """Every entry of sweep_expected_failures.py names an op of op_db, a kind and a reason; the listed
    samples of the cheap entries still miss (a fix must take its entry out)."""
    from torch.testing._internal.common_methods_invocations import op_db
    from sweep_expected_failures import ALL, EXPECTED, EXPECTED_IN
    ops = {o.name + (f".{o.variant_test_name}" if o.variant_test_name else ""): o for o in op_db}
    assert set(EXPECTED_IN) <= {"bfloat16", "complex64"}
    for name, kinds in [*EXPECTED.items(), *(e for table in EXPECTED_IN.values() for e in table.items())]:
        assert name in ops, name
        for kind, (samples, reason) in kinds.items():
            assert kind in ("forward", "gradient") and reason and (samples == ALL or samples), (name, kind)
    for name, index in (("as_strided.partial_views", 1), ("equal", 0)):
        op = ops[name]
        grad = bool(op.supports_autograd)
        assert run_sample(op, _samples(op, grad)[index], grad)["forward"] == "fail", name


def test_eval_batch_norms_empty_statistics_keep_a_bfloat16_inputs_dtype_on_the_cpu():
    import kiln
    x, stat = torch.randn(3, 2, 4, dtype=torch.bfloat16), torch.rand(2, dtype=torch.bfloat16) + 0.5
    args = (x, stat, stat, stat, stat, False, 0.1, 1e-5)
    kiln.reset()
    got = kiln.compile(lambda *a: torch.native_batch_norm(*a), fullgraph=True)(*args)
    want = torch.native_batch_norm(*args)
    assert [t.dtype for t in got] == [t.dtype for t in want] == [torch.bfloat16] * 3
    torch.testing.assert_close(got[0], want[0], rtol=1.6e-2, atol=1e-2)


def test_a_sweep_process_killed_by_a_signal_is_recorded_and_resumed_past_its_op(tmp_path):
    """A segfault in one sample ended a whole shard before, silently: `supervise` records the
    crash on the sample after the last one written, and the next process resumes past that op."""
    import json
    from sweep_ops import CRASH, supervise
    out = tmp_path / "rows.jsonl"
    child = tmp_path / "child.py"
    child.write_text(f"""
import json, os, signal, sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
from sweep_ops import _resume
assert sys.argv[-1] == "--resume"
done = _resume({str(out)!r})
with open({str(out)!r}, "a") as f:
    for op in ("a", "b", "c"):
        if op in done:
            continue
        f.write(json.dumps({{"op": op, "sample": -2, "forward": "skip", "gradient": "skip", "why": "started"}}) + "\\n")
        for k in range(3):
            if op == "b" and k == 1:
                f.flush()
                os.kill(os.getpid(), signal.SIGSEGV)
            f.write(json.dumps({{"op": op, "sample": k, "forward": "pass", "gradient": "pass", "why": ""}}) + "\\n")
""")
    out.write_text("")
    assert supervise([], str(out), program=(sys.executable, str(child))) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    crashed = [r for r in rows if r["why"].startswith(CRASH)]
    assert [(r["op"], r["sample"], r["forward"]) for r in crashed] == [("b", 1, "fail")]
    assert "-11" in crashed[0]["why"]
    assert [(r["op"], r["sample"]) for r in rows if r["sample"] >= 0 and r["forward"] == "pass"] == \
        [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("c", 0), ("c", 1), ("c", 2)]


def test_an_inf_norms_gradient_over_complex_values_is_not_nan():
    """masked.normalize(p=inf) of complex64 sample 14: the norm's maximum and its gradient's mask
    each computed |z|, one in a loop's vector body and one in a scalar tail; with libm's hypot the
    two differed by an ulp, no element matched, and the count of 0 made the gradient NaN. A complex
    magnitude is now IEEE arithmetic only (refs.magnitude): the same bits in every kernel."""
    from torch.testing._internal.common_methods_invocations import op_db
    op = next(o for o in op_db if o.name == "masked.normalize")
    row = run_sample(op, _samples(op, True, torch.complex64)[14], True, torch.complex64)
    assert row["forward"] == "pass" and row["gradient"] == "pass", row
