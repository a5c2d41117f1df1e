"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 30), shrunk: crash.

call 1: RuntimeError: kiln_prims::view() Expected a value of type List[int] for argument shape but instead found type immutable_list (an output view of symbolic sizes replayed with graph nodes)
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v3 = x0.unflatten(0, (1, 6))
#     return (v3,)

PROGRAM = Program(
    seed=30,
    inputs=[
        Input(name='x0', shape=(6, 33, 2), dtype='float16', layout='contiguous', requires_grad=True, role='arg', seed=30000),
    ],
    steps=[
        Step(lines=('v3 = x0.unflatten(0, (1, 6))',), defines=('v3',), reads=('x0',), family='view'),
    ],
    outputs=['v3'],
    module=False,
    resized={'x0': (6, 34, 2)},
)

test_fuzz_unflatten_output_of_dynamic_input = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_unflatten_output_of_dynamic_input()
