"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 1001852), shrunk: crash.

the process died (SIGSEGV): a sum over no elements loaded element 0 of an empty tensor, unmasked
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x4):
#     v3 = x4.transpose(0, 1).reshape(-1)
#     v7 = v3.sum()
#     return (v7,)

PROGRAM = Program(
    seed=1001852,
    inputs=[
        Input(name='x4', shape=(1, 3, 0), dtype='bool', layout='contiguous', requires_grad=False, role='arg', seed=1001852004),
    ],
    steps=[
        Step(lines=('v3 = x4.transpose(0, 1).reshape(-1)',), defines=('v3',), reads=('x4',), family='view'),
        Step(lines=('v7 = v3.sum()',), defines=('v7',), reads=('v3',), family='reduction'),
    ],
    outputs=['v7'],
    module=False,
)

test_fuzz_sum_over_no_elements_interpreted = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_sum_over_no_elements_interpreted()
