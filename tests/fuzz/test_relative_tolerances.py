"""The fuzzer's accuracy rule ([Note: tolerances relative to the reference] in
kiln/bench/accuracy.py, [Note: results eager cannot pin down] in kiln/testing/fuzz.py): a small
result is held to its own scale, and excused only where float32 determines none of its digits."""
import torch

from kiln.bench.accuracy import same
from kiln.testing.fuzz import GRAD_TOL, _undetermined


def test_a_tiny_wrong_gradient_is_wrong_where_eager_has_digits():
    torch.manual_seed(0)
    exact = 1e-6 * torch.randn(64, dtype=torch.float64)
    eager = exact.float()
    wrong = eager * 1.5
    assert same(eager, wrong, exact, tol=GRAD_TOL).ok                       # the benchmark's rule
    assert not same(eager, wrong, exact, tol=GRAD_TOL, relative=True).ok     # the fuzzer's
    assert _undetermined([eager], [wrong], [exact], GRAD_TOL) is None


def test_noise_around_a_zero_result_is_undetermined():
    """Seed 2610's layer norm over one element: float64 1e-13, eager's float32 6e-5 of noise."""
    torch.manual_seed(0)
    exact = 1e-13 * torch.randn(8, dtype=torch.float64)
    eager = (exact + 6e-5 * torch.randn(8, dtype=torch.float64)).float()
    other = (exact + 1.5e-4 * torch.randn(8, dtype=torch.float64)).float()
    assert not same(eager, other, exact, tol=GRAD_TOL, relative=True).ok
    assert "determines no digit" in _undetermined([eager], [other], [exact], GRAD_TOL)


def test_one_determined_failing_leaf_is_enough_to_be_wrong():
    torch.manual_seed(0)
    noise_exact = 1e-13 * torch.randn(8, dtype=torch.float64)
    noise = (noise_exact + 6e-5 * torch.randn(8, dtype=torch.float64)).float()
    exact = torch.randn(8, dtype=torch.float64)
    eager = exact.float()
    assert _undetermined([noise, eager], [noise * 3, eager + 1e-2], [noise_exact, exact], GRAD_TOL) is None


def test_without_a_float64_run_a_wrong_result_of_a_stable_program_is_not_excused():
    """The no-float64 second opinion compares kiln's difference with eager's own spread under one
    rounding of the inputs: an error of 1e-3 on batch norm's well-determined output stays wrong."""
    from kiln.testing.fuzz import _unstable, eager_run
    from tests.fuzz.test_fuzz_2610_cancelling_gradient import PROGRAM
    ref = eager_run(PROGRAM)
    wrong = [t + 1e-3 for t in ref[0]]
    assert _unstable(PROGRAM, 0, wrong, None, 1e-4, ref=ref[0]) is None
    assert _unstable(PROGRAM, 0, [t.clone() for t in ref[0]], None, 1e-4, ref=ref[0]) is not None
