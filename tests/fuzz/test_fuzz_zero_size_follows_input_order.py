"""Found by `python -m kiln.testing.fuzz` (seed 1090), shrunk: crash.

call 1: CompileStageError: kiln codegen stage failed: backend 'kiln': ZeroDivisionError: Modulo by zero
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0, x3, x4, x5):
#     v1 = x0.amin(-2)
#     v2 = x0.split(2, 0)[0]
#     v5 = torch.where(x3, v2, x4)
#     v6 = x5 * v5 + x5
#     return (v1, v6)

PROGRAM = Program(
    seed=1090,
    inputs=[
        Input(name='x0', shape=(1, 0), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=110091000),
        Input(name='x3', shape=(1, 0), dtype='bool', layout='contiguous', requires_grad=False, role='arg', seed=110091003),
        Input(name='x4', shape=(1, 1), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=110091004),
        Input(name='x5', shape=(0,), dtype='float32', layout='offset', requires_grad=False, role='arg', seed=110091005),
    ],
    steps=[
        Step(lines=('v1 = x0.amin(-2)',), defines=('v1',), reads=('x0',), family='reduction'),
        Step(lines=('v2 = x0.split(2, 0)[0]',), defines=('v2',), reads=('x0',), family='view'),
        Step(lines=('v5 = torch.where(x3, v2, x4)',), defines=('v5',), reads=('x3', 'v2', 'x4'), family='mixed'),
        Step(lines=('v6 = x5 * v5 + x5',), defines=('v6',), reads=('x5', 'v5'), family='binary'),
    ],
    outputs=['v1', 'v6'],
    module=False,
)

test_fuzz_1090 = regression_test(PROGRAM)   # a zero-size buffer was relaid: Mod by its size 0

if __name__ == "__main__":
    test_fuzz_1090()
