"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seeds 1002646, 1001817), shrunk;
both on the C++ path too, both dynamic programs (their sizes change between calls). Both had the
cause of seed 1001165 (`test_fuzz_unfold_of_dynamic_input.py`), fixed there: an `as_strided` over a
symbolic layout read its input from a contiguous copy at the positions of the input's own storage.

- 1002646, wrong: a scatter_reduce("amax") into a narrow of a bfloat16 input, called again with a
  larger first dim, returned garbage (3e38 under the interpreter, 7e19 in C++) in the elements its
  index does not reach: its source, the narrow, taken to the index's shape by an `as_strided`, was
  read past the end of the narrow's contiguous copy.
- 1001817, crash: an unfold of a select of an int64 input under dynamic=True built a view whose
  strides reach past its storage (`setStorage: ... out of bounds`) at the first call: the output
  view took the select's strides and offset in the input's storage over the select's contiguous copy.
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v5 = x0.narrow(1, 3, 1)
#     v10 = v5.scatter_reduce(3, ((torch.arange(150, device=DEVICE) * 1 + 1) % 6).reshape((5, 1, 5, 6)), v5, 'amax')
#     return (v10,)

SCATTER_AMAX = Program(
    seed=1002646,
    inputs=[
        Input(name='x0', shape=(5, 4, 5, 6), dtype='bfloat16', layout='contiguous', requires_grad=False, role='arg', seed=1002646000),
    ],
    steps=[
        Step(lines=('v5 = x0.narrow(1, 3, 1)',), defines=('v5',), reads=('x0',), family='view'),
        Step(lines=("v10 = v5.scatter_reduce(3, ((torch.arange(150, device=DEVICE) * 1 + 1) % 6).reshape((5, 1, 5, 6)), v5, 'amax')",), defines=('v10',), reads=('v5',), family='indexing'),
    ],
    outputs=['v10'],
    module=False,
    resized={'x0': (6, 4, 5, 6)},
)

# class M(torch.nn.Module):
#     def __init__(self, state):
#         super().__init__()
#     def forward(self, x0):
#         v6 = x0.select(1, 6)
#         v7 = v6.unfold(0, 2, 1)
#         return (v7,)

UNFOLD_OF_SELECT = Program(
    seed=1001817,
    inputs=[
        Input(name='x0', shape=(3, 8, 8), dtype='int64', layout='contiguous', requires_grad=False, role='arg', seed=1001817000),
    ],
    steps=[
        Step(lines=('v6 = x0.select(1, 6)',), defines=('v6',), reads=('x0',), family='view'),
        Step(lines=('v7 = v6.unfold(0, 2, 1)',), defines=('v7',), reads=('v6',), family='view'),
    ],
    outputs=['v7'],
    module=True,
    resized={'x0': (4, 8, 8)},
)

test_fuzz_scatter_amax_of_resized_narrow = regression_test(SCATTER_AMAX, target="triton-interpret")
test_fuzz_unfold_of_select_of_dynamic_input = regression_test(UNFOLD_OF_SELECT, target="triton-interpret")
