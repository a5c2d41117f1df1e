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


# The whole program of seed 1001817, found again by the rerun of the campaign's seeds at 64d6878
# (the shrunk one above passed since e6a8c91): with the slice `x0[:, :, 3::1]` beside, the unfold's
# as_strided took the stride `8 * 8` of two sizes the trace specialized; lowering left that product
# to an extern of the host program (a host value), so no rule saw the as_strided and it ran on a
# contiguous copy of the select at the input's offsets ("setStorage: ... out of bounds"). A number
# the trace specialized is now a number (`_NUMBER_OPS` in kiln/codegen/lowering.py).
#
# class M(torch.nn.Module):
#     def __init__(self, state):
#         super().__init__()
#         self.register_buffer('x3', state['x3'])
#     def forward(self, x0):
#         x3 = self.x3
#         v1 = x0[:, :, 3::1]
#         v2 = v1 * 2
#         v6 = x0.select(1, 6)
#         v7 = v6.unfold(0, 2, 1)
#         v8 = v2 | x3
#         return (v7,)

UNFOLD_OF_SELECT_BESIDE_A_SLICE = Program(
    seed=1001817,
    inputs=[
        Input(name='x0', shape=(3, 8, 8), dtype='int64', layout='contiguous', requires_grad=False, role='arg', seed=1001817000),
        Input(name='x3', shape=(8, 5), dtype='int64', layout='contiguous', requires_grad=False, role='buffer', seed=1001817003),
    ],
    steps=[
        Step(lines=('v1 = x0[:, :, 3::1]',), defines=('v1',), reads=('x0',), family='view'),
        Step(lines=('v2 = v1 * 2',), defines=('v2',), reads=('v1',), family='binary'),
        Step(lines=('v6 = x0.select(1, 6)',), defines=('v6',), reads=('x0',), family='view'),
        Step(lines=('v7 = v6.unfold(0, 2, 1)',), defines=('v7',), reads=('v6',), family='view'),
        Step(lines=('v8 = v2 | x3',), defines=('v8',), reads=('v2', 'x3'), family='binary'),
    ],
    outputs=['v7'],
    module=True,
    resized={'x0': (4, 8, 8)},
)

test_fuzz_1001817_whole_triton_interpret = regression_test(UNFOLD_OF_SELECT_BESIDE_A_SLICE, target='triton-interpret')
test_fuzz_1001817_whole_cpp = regression_test(UNFOLD_OF_SELECT_BESIDE_A_SLICE, target='cpp')
