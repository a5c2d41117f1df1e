"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seeds 1004118, 1003200, 1003674),
shrunk: crashes, each on the C++ path too (not the Triton printer's), all fixed.

- 1004118 (fixed): call 2: CompileStageError: kiln codegen stage failed: backend 'kiln': TypeError: Cannot
  convert symbols to int. scatter_add takes its source to the index's shape with an `as_strided`,
  static windows of an input of symbolic size there; the rule's bound check read the input's sizes
  as ints. Such an as_strided now reads a buffer in its input's traced strides, as one over a
  symbolic layout does (seeds 1003267, 1003852, 1004618 the same).
- 1003200 (fixed): call 2: RuntimeError: Trying to backward through the graph a second time. A
  buffer written with a value requiring grad requires grad from then on; its requires_grad was not
  guarded. Its test is `test_fuzz_buffer_comes_to_require_grad.py`.
- 1003674 (fixed): call 1: UnboundLocalError: cannot access local variable 'val2' where it is not
  associated with a value. The clone's strides were a size an extern computed (`val2 = mul(5, 2)`,
  sizes the trace specialized); the scheduler moved the copy_strided extern reading it ahead of a
  kernel an earlier extern flushed, before `val2`'s extern, as it saw only buffers as reads. A host
  value is now a read too ([Note: host values are read too] in kiln/codegen/scheduler.py).
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v1 = x0.scatter_add(0, ((torch.arange(5, device=DEVICE) * 7 + 4) % 5).reshape((5,)), x0 * 2)
#     return (v1,)

SCATTER_ADD_RESIZED = Program(
    seed=1004118,
    inputs=[
        Input(name='x0', shape=(5,), dtype='float16', layout='contiguous', requires_grad=False, role='arg', seed=1004118000),
    ],
    steps=[
        Step(lines=('v1 = x0.scatter_add(0, ((torch.arange(5, device=DEVICE) * 7 + 4) % 5).reshape((5,)), x0 * 2)',), defines=('v1',), reads=('x0',), family='indexing'),
    ],
    outputs=['v1'],
    module=False,
    resized={'x0': (10,)},
)

test_fuzz_scatter_add_called_with_other_sizes = regression_test(SCATTER_ADD_RESIZED, target='triton-interpret')


# class M(torch.nn.Module):
#     def __init__(self, state):
#         super().__init__()
#     def forward(self, x0):
#         v1 = x0.scatter_reduce(2, ((torch.arange(10, device=DEVICE) * 1 + 0) % 2).reshape((1, 5, 2)), x0, 'amax')
#         v4 = x0.clone()
#         v4.add_(1)
#         return (v1, v4)

SCATTER_AMAX_MODULE = Program(
    seed=1003674,
    inputs=[
        Input(name='x0', shape=(1, 5, 2), dtype='float16', layout='contiguous', requires_grad=False, role='arg', seed=1003674000),
    ],
    steps=[
        Step(lines=("v1 = x0.scatter_reduce(2, ((torch.arange(10, device=DEVICE) * 1 + 0) % 2).reshape((1, 5, 2)), x0, 'amax')",), defines=('v1',), reads=('x0',), family='indexing'),
        Step(lines=('v4 = x0.clone()', 'v4.add_(1)'), defines=('v4',), reads=('x0',), family='inplace'),
    ],
    outputs=['v1', 'v4'],
    module=True,
    resized={'x0': (1, 6, 3)},
)

test_fuzz_scatter_amax_module_unbound_local = regression_test(SCATTER_AMAX_MODULE, target='triton-interpret')
