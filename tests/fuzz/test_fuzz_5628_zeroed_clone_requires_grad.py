"""Found by `python -m kiln.testing.fuzz` (seed 5628), shrunk: wrong.

call 1, gradients: result 0: eager gave a tensor, compiled NoneType

With `v12 = zeros_like(v7)` beside it, the compiled `v13` (a clone of a value that requires grad,
zeroed in place) came out not requiring grad, so x0.grad stayed None where eager's is zeros: both
outputs are zero fills, lowering returned one buffer for both, and autograd's
mark_non_differentiable of v12 marked that one tensor. Distinct outputs now get distinct buffers
(kiln/codegen/lowering.py, the output loop).
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0, x3):
#     v5 = F.softplus(x0)
#     v7 = torch.where(x3, v5, 0.0)
#     v12 = torch.zeros_like(v7)
#     v13 = v7.clone()
#     v13.zero_()
#     v14 = v13.view(-1)
#     return (v12, v13)

PROGRAM = Program(
    seed=5628,
    inputs=[
        Input(name='x0', shape=(5, 4), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=5628000),
        Input(name='x3', shape=(1, 1), dtype='bool', layout='contiguous', requires_grad=False, role='arg', seed=5628003),
    ],
    steps=[
        Step(lines=('v5 = F.softplus(x0)',), defines=('v5',), reads=('x0',), family='unary'),
        Step(lines=('v7 = torch.where(x3, v5, 0.0)',), defines=('v7',), reads=('x3', 'v5'), family='mixed'),
        Step(lines=('v12 = torch.zeros_like(v7)',), defines=('v12',), reads=('v7',), family='view'),
        Step(lines=('v13 = v7.clone()', 'v13.zero_()', 'v14 = v13.view(-1)'), defines=('v13', 'v14'), reads=('v7',), family='inplace'),
    ],
    outputs=['v12', 'v13'],
    module=False,
)

test_fuzz_5628 = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_5628()
