"""Found by `python -m kiln.testing.fuzz` (seed 2610, the 10,000-program run at f805b4d), shrunk:
reported wrong, and unstable by [Note: results eager cannot pin down] in kiln/testing/fuzz.py.

The gradient of the layer norm's bias sums 32 terms of about 1e5 (group norm and batch norm of a
constant each scale by 1 / sqrt(eps)) that cancel: eager's float32 lands 2e-11 from float64 on
these values, kiln's 0.0078 with two threads (its reduction splits by thread count; one thread
gives eager's). Eager's own float32, on the same inputs moved by one rounding, lands as far off:
float32 does not determine this result to the rule's 1e-4, so it is not held to eager's first answer.
"""
from kiln.bench.accuracy import rmse
from kiln.testing.fuzz import PERTURBED_RUNS, _unstable, check, eager_run, perturbed_eager_run, regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0, x5, x6, x7, x8, x9, x10):
#     v1 = F.rms_norm(x0, (1,))
#     v14 = F.layer_norm(v1, (1,), x5, x6)
#     v19 = F.group_norm(v14, 1)
#     v20 = F.batch_norm(v19, x9, x10, x7, x8, training=True)
#     return (v20,)

PROGRAM = Program(
    seed=2610,
    inputs=[
        Input(name='x0', shape=(4, 8, 1), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=2610000),
        Input(name='x5', shape=(1,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=2610005),
        Input(name='x6', shape=(1,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=2610006),
        Input(name='x7', shape=(8,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=2610007),
        Input(name='x8', shape=(8,), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=2610008),
        Input(name='x9', shape=(8,), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=2610009),
        Input(name='x10', shape=(8,), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=2610010),
    ],
    steps=[
        Step(lines=('v1 = F.rms_norm(x0, (1,))',), defines=('v1',), reads=('x0',), family='normalization'),
        Step(lines=('v14 = F.layer_norm(v1, (1,), x5, x6)',), defines=('v14',), reads=('v1', 'x5', 'x6'), family='normalization'),
        Step(lines=('v19 = F.group_norm(v14, 1)',), defines=('v19',), reads=('v14',), family='normalization'),
        Step(lines=('v20 = F.batch_norm(v19, x9, x10, x7, x8, training=True)',), defines=('v20',), reads=('v19', 'x9', 'x10', 'x7', 'x8'), family='normalization'),
    ],
    outputs=['v20'],
    module=False,
)

test_fuzz_2610 = regression_test(PROGRAM)


def test_eager_itself_moves_by_more_than_the_tolerance_under_one_rounding_of_its_inputs():
    exact = eager_run(PROGRAM, double=True)[2]
    moved = [perturbed_eager_run(PROGRAM, trial)[2] for trial in range(PERTURBED_RUNS)]
    worst = max(rmse(e, m) for run in moved for e, m in zip(exact, run))
    assert worst > 1e-3, worst


def test_a_wrong_result_of_a_well_conditioned_program_is_not_excused():
    """The second opinion never covers an error eager's rounding cannot make: the same program's
    forward result (well conditioned: batch norm's output is its bias) moved by 1e-3 stays wrong."""
    ref, exact = eager_run(PROGRAM), eager_run(PROGRAM, double=True)
    wrong = [t + 1e-3 for t in ref[0]]
    assert _unstable(PROGRAM, 0, wrong, exact[0], tol=1e-4) is None
    assert check(PROGRAM).kind in ("ok", "unstable")
