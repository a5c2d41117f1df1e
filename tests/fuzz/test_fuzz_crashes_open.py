"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seeds 1004118, 1003200, 1003674),
shrunk: crashes, each on the C++ path too (not the Triton printer's). Those not fixed yet are strict
xfails, so the fix turns them into failures to remove.

- 1004118 (fixed): call 2: CompileStageError: kiln codegen stage failed: backend 'kiln': TypeError: Cannot
  convert symbols to int. scatter_add takes its source to the index's shape with an `as_strided`,
  static windows of an input of symbolic size there; the rule's bound check read the input's sizes
  as ints. Such an as_strided now reads a buffer in its input's traced strides, as one over a
  symbolic layout does (seeds 1003267, 1003852, 1004618 the same).
- 1003200 (open): call 2: RuntimeError: Trying to backward through the graph a second time. The
  first call's epilogue writes the buffer with `copy_` of a value that requires grad, so the
  buffer enters the second call as a non-leaf requiring grad, whose history holds the first call's
  compiled Function. The second call reuses the entry traced with the buffer not requiring grad
  (no recompile is logged: a buffer's requires_grad looks unguarded), so its backward does not
  differentiate the buffer's old
  value; autograd still sends the zeros of CopyBackwards' `self` gradient into the first call's
  Function, whose `ctx.saved_tensors` raises after its first backward (even with none saved).
  Skipping that access makes the crash pass, but then a run that does not reset the module between
  calls gets x5.grad 2 where eager's is 3 (eager's second backward goes through the first call's
  AddBackward): a wrong answer in place of a crash, so it is not done. The fix to make: recompile
  when a buffer comes to require grad, and differentiate the buffer's old value there.
- 1003674 (fixed): call 1: UnboundLocalError: cannot access local variable 'val2' where it is not
  associated with a value. The clone's strides were a size an extern computed (`val2 = mul(5, 2)`,
  sizes the trace specialized); the scheduler moved the copy_strided extern reading it ahead of a
  kernel an earlier extern flushed, before `val2`'s extern, as it saw only buffers as reads. A host
  value is now a read too ([Note: host values are read too] in kiln/codegen/scheduler.py).
"""
import pytest

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
#         self.register_buffer('x4', state['x4'])
#         self.x5 = torch.nn.Parameter(state['x5'])
#     def forward(self, ):
#         x4 = self.x4
#         x5 = self.x5
#         v5 = x4[0::3]
#         x4.add_(x5)
#         return (v5,)

BUFFER_VIEW_BACKWARD = Program(
    seed=1003200,
    inputs=[
        Input(name='x4', shape=(1,), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=1003200004),
        Input(name='x5', shape=(), dtype='float32', layout='contiguous', requires_grad=True, role='param', seed=1003200005),
    ],
    steps=[
        Step(lines=('v5 = x4[0::3]',), defines=('v5',), reads=('x4',), family='view'),
        Step(lines=('x4.add_(x5)',), defines=(), reads=('x4', 'x5'), family='inplace'),
    ],
    outputs=['v5'],
    module=True,
)

test_fuzz_buffer_view_backward_second_call = pytest.mark.xfail(strict=True, reason=(
    "backward through freed graph: the entry traced with the buffer not requiring grad is reused after "
    "the first call's epilogue made it require grad (open; see the docstring)"))(
    regression_test(BUFFER_VIEW_BACKWARD, target='triton-interpret'))


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
