"""Found by `python -m kiln.testing.fuzz` (seed 1154), shrunk: crash.

call 1: RuntimeError: !self.requires_grad() || self.is_contiguous() INTERNAL ASSERT FAILED at "/__w/pytorch/pytorch/aten/src/ATen/native/TensorShape.cpp":4754, please report a bug to PyTorch. as_strided_scatter is currently only supported for contiguous inputs
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x1):
#     v1 = x1.clone()
#     v1.select(2, 0).fill_(7)
#     v2 = v1 + 0
#     return (v2,)

PROGRAM = Program(
    seed=1154,
    inputs=[
        Input(name='x1', shape=(5, 1, 5), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1154001),
    ],
    steps=[
        Step(lines=('v1 = x1.clone()', 'v1.select(2, 0).fill_(7)', 'v2 = v1 + 0'), defines=('v1', 'v2'), reads=('x1',), family='inplace'),
    ],
    outputs=['v2'],
    module=False,
)

test_fuzz_write_through_select_of_grad_clone = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_write_through_select_of_grad_clone()
