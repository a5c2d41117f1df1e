"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seeds 1001145, 1001165), shrunk:
wrong, on the C++ path too. An unfold of an input under dynamic=True returns a view whose strides
overlap ((1, 1) for `x.unfold(0, 2, 1)`); the compiled program returns it contiguous (strides
(2, 1)), and the backward reads its tangent as if in the overlapping layout, so every gradient
element but the first and last is wrong; the bool case returns wrong values. Static sizes are
right (the output is rebuilt as a view of the input there). The gradient is not fixed yet: a strict
xfail, so the fix turns it into a failure to remove.

The bool case (1001165) read the elements of a contiguous copy of its transposed input at the
positions of the input's own storage: an `as_strided` over a symbolic layout took its input to be
contiguous. Now it reads a buffer in the input's traced strides.
"""
import pytest

from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x2):
#     v1 = x2.unfold(0, 2, 1)
#     return (v1,)

GRADIENT = Program(
    seed=1001145,
    inputs=[
        Input(name='x2', shape=(7,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1001145002),
    ],
    steps=[
        Step(lines=('v1 = x2.unfold(0, 2, 1)',), defines=('v1',), reads=('x2',), family='view'),
    ],
    outputs=['v1'],
    module=False,
    resized={'x2': (6,)},
)

# def f(x2):
#     v2 = x2.transpose(0, 1)
#     v4 = v2.unfold(1, 2, 1)
#     return (v4,)

VALUES = Program(
    seed=1001165,
    inputs=[
        Input(name='x2', shape=(5, 3, 5), dtype='bool', layout='transposed', requires_grad=False, role='arg', seed=1001165002),
    ],
    steps=[
        Step(lines=('v2 = x2.transpose(0, 1)',), defines=('v2',), reads=('x2',), family='view'),
        Step(lines=('v4 = v2.unfold(1, 2, 1)',), defines=('v4',), reads=('v2',), family='view'),
    ],
    outputs=['v4'],
    module=False,
    resized={'x2': (6, 3, 5)},
)

REASON = "an overlapping view output of a dynamic program is returned contiguous (issue: the fuzz campaign's summary)"
test_fuzz_unfold_of_dynamic_input_gradient = pytest.mark.xfail(strict=True, reason=REASON)(
    regression_test(GRADIENT, target="triton-interpret"))
test_fuzz_unfold_of_dynamic_input_values = regression_test(VALUES, target="triton-interpret")
