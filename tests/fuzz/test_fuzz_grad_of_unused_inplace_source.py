"""Found by `python -m kiln.testing.fuzz` (seed 70142), shrunk: wrong.

call 1, gradients: result 0: eager gave NoneType, compiled a tensor

Cause: the compiled backward ran with zeros for the missing tangent of the mutated input x4
and returned a zero gradient for x2, where eager leaves x2.grad None ([Note: gradients no tangent
reached] in kiln/aot/runtime.py).
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x2, x4, x6):
#     x4.add_(x2)
#     v26 = x6.amin(-1, keepdim=True)
#     return (v26,)

PROGRAM = Program(
    seed=70142,
    inputs=[
        Input(name='x2', shape=(4,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=70142002),
        Input(name='x4', shape=(4,), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=70142004),
        Input(name='x6', shape=(4,), dtype='float32', layout='offset', requires_grad=True, role='arg', seed=70142006),
    ],
    steps=[
        Step(lines=('x4.add_(x2)',), defines=(), reads=('x4', 'x2'), family='inplace'),
        Step(lines=('v26 = x6.amin(-1, keepdim=True)',), defines=('v26',), reads=('x6',), family='reduction'),
    ],
    outputs=['v26'],
    module=False,
)

test_fuzz_70142 = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_70142()
