"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seed 1000079, and 42 more of the
campaign), shrunk: refusal, on the C++ path too. Under dynamic=True, std's backward (autograd's
var_backward) scales by the SymFloat `2.0 / (s1 - 1.0)`: kiln.aot had no rule for the constant 2.0
("cannot compute the symbolic size 2.0 in a graph"), and codegen lowered no float computed from sizes.
The graph now computes it with `operator` calls, the host program runs them (a host value), and a
backward binds the one its forward saved as a parameter. Seed 1005154 (an expanded input, called
again with other sizes) checks the second call: binding the saved value's traced number instead
scaled the gradient by 2/5 at s1 = 7 (wrong)."""
import torch

import kiln
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x2):
#     v1 = x2.std(0)
#     return (v1,)

STD_HALF = Program(
    seed=1000079,
    inputs=[
        Input(name='x2', shape=(4, 5), dtype='bfloat16', layout='contiguous', requires_grad=True, role='arg', seed=1000079002),
    ],
    steps=[
        Step(lines=('v1 = x2.std(0)',), defines=('v1',), reads=('x2',), family='reduction'),
    ],
    outputs=['v1'],
    module=False,
    resized={'x2': (8, 10)},
)

# def f(x0):
#     v1 = x0.std(1)
#     return (v1,)

STD_EXPANDED = Program(
    seed=1005154,
    inputs=[
        Input(name='x0', shape=(3, 6), dtype='float32', layout='expanded', requires_grad=True, role='arg', seed=1005154000),
    ],
    steps=[
        Step(lines=('v1 = x0.std(1)',), defines=('v1',), reads=('x0',), family='reduction'),
    ],
    outputs=['v1'],
    module=False,
    resized={'x0': (4, 7)},
)

test_fuzz_1000079_triton_interpret = regression_test(STD_HALF, target='triton-interpret')
test_fuzz_1000079_cpp = regression_test(STD_HALF, target='cpp')
test_fuzz_1005154_triton_interpret = regression_test(STD_EXPANDED, target='triton-interpret')
test_fuzz_1005154_cpp = regression_test(STD_EXPANDED, target='cpp')


def test_var_gradient_scale_follows_the_size_of_each_call():
    """The saved 2.0 / (n - 1.0) is the run's, at every size: one compile, three sizes."""
    def f(x):
        return x.var(1, correction=1) + x.std(1, correction=2)
    compiled = kiln.compile(f, dynamic=True)
    for n in (6, 7, 11):
        x = torch.randn(3, n, dtype=torch.float64)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        f(a).sum().backward()
        compiled(b).sum().backward()
        torch.testing.assert_close(b.grad, a.grad)


if __name__ == "__main__":
    test_fuzz_1000079_triton_interpret()
    test_fuzz_1000079_cpp()
    test_fuzz_1005154_triton_interpret()
    test_fuzz_1005154_cpp()
    test_var_gradient_scale_follows_the_size_of_each_call()
