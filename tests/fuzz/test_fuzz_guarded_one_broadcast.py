"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 1006522), shrunk: wrong, on the
C++ path too. Under dynamic=True the slice `x1[..., 5::3]` of 8 elements has size `(s2 - 3) // 3`,
1 at s2 = 8 under a guard; broadcast against x1, lowering saw no literal 1 and read the slice at
every position of the dim (integer results differed). The dim is now squeezed and broadcast anew
(`broadcast_to` in kiln/prims/decompositions/refs.py)."""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x1):
#     v1 = x1[:, :, :, 5::3]
#     v2 = v1 & x1
#     return (v2,)

PROGRAM = Program(
    seed=1006522,
    inputs=[
        Input(name='x1', shape=(6, 2, 1, 8), dtype='int64', layout='offset', requires_grad=False, role='arg', seed=1006522001),
    ],
    steps=[
        Step(lines=('v1 = x1[:, :, :, 5::3]',), defines=('v1',), reads=('x1',), family='view'),
        Step(lines=('v2 = v1 & x1',), defines=('v2',), reads=('v1', 'x1'), family='binary'),
    ],
    outputs=['v2'],
    module=False,
    resized={'x1': (7, 2, 1, 8)},
)

test_fuzz_1006522_triton_interpret = regression_test(PROGRAM, target='triton-interpret')
test_fuzz_1006522_cpp = regression_test(PROGRAM, target='cpp')

if __name__ == "__main__":
    test_fuzz_1006522_triton_interpret()
    test_fuzz_1006522_cpp()
