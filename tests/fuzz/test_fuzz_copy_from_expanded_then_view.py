"""Found by `python -m kiln.testing.fuzz` (seed 20100), shrunk: crash.

call 1: RuntimeError: Expected a proper Tensor but got None (or an undefined Tensor in C++) for argument #1 'mat2'
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0, x6, x7):
#     v1 = x0.clone()
#     v1.copy_(x0)
#     v2 = v1.view(-1)
#     v12 = F.linear(v2, x6, x7)
#     return (v12,)

PROGRAM = Program(
    seed=20100,
    inputs=[
        Input(name='x0', shape=(4, 3, 1, 4), dtype='float32', layout='expanded', requires_grad=False, role='arg', seed=20100000),
        Input(name='x6', shape=(3, 48), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=20100006),
        Input(name='x7', shape=(3,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=20100007),
    ],
    steps=[
        Step(lines=('v1 = x0.clone()', 'v1.copy_(x0)', 'v2 = v1.view(-1)'), defines=('v1', 'v2'), reads=('x0',), family='inplace'),
        Step(lines=('v12 = F.linear(v2, x6, x7)',), defines=('v12',), reads=('v2', 'x6', 'x7'), family='matmul'),
    ],
    outputs=['v12'],
    module=False,
)

test_fuzz_copy_from_expanded_then_view = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_copy_from_expanded_then_view()
