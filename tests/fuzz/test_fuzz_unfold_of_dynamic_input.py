"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seeds 1001145, 1001165), shrunk:
wrong, on the C++ path too; both unfold an input under dynamic=True.

- 1001145: `x.unfold(0, 2, 1)` returns a view of x whose strides overlap ((1, 1)). The output was
  rebuilt as a view of the input only for static sizes (the chain's `s0 - 1` windows are a node of
  the graph): the program returned a contiguous copy, and the backward copied the incoming gradient
  into the traced overlapping layout, keeping one value per location (every gradient element but
  the first and last wrong). Now the chain's sizes are computed from the real input and the view
  rebuilt, as for static sizes.
- 1001165: the unfold of a transposed bool input read the elements of a contiguous copy at the
  positions of the input's own (transposed) storage: an `as_strided` over a symbolic layout took
  its input to be contiguous. Now it reads a buffer in the input's traced strides.
"""
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

test_fuzz_unfold_of_dynamic_input_gradient = regression_test(GRADIENT, target="triton-interpret")
test_fuzz_unfold_of_dynamic_input_values = regression_test(VALUES, target="triton-interpret")
