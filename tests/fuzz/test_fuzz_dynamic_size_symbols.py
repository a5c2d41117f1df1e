"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seeds below), shrunk: refusals
of dynamic=True programs, on the C++ path too, 20 of the campaign's 2,261 + 7,739 programs.

- "the size symbol s3 is no dim of any tensor input" (pad's backward, seeds 1000926, 1001433,
  1002267, 1005472, 1007722, 1008391; a view `x.view(2, s0 // 2)` saved for the backward, 1003571,
  1001610; 1003813, 1008687): the backward computes with a size that reached it only inside an
  expression, a saved `1 + s1` or a saved tensor of `s0 // 2` rows, so its program could not bind
  the symbol. The partition saves such sizes as the symbols they are computed from
  ([Note: saved sizes are symbols] in kiln/aot/partition.py).
- "the symbol s7 comes from no traced input" (a clone or unfold of a strided input, seeds 1000056,
  1001781, 1004979, 1006390, 1008583): the one-row dim of `x[::2]` has a stride symbol of its own,
  which a clone keeps; aot read symbols from sizes only, now from strides too (`sym_stride`).
"""
import torch

import kiln
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x1):
#     v1 = F.pad(x1, (1, 2))
#     return (v1,)
PAD = Program(
    seed=1007722,
    inputs=[
        Input(name='x1', shape=(5, 4, 2, 8), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1007722001),
    ],
    steps=[Step(lines=('v1 = F.pad(x1, (1, 2))',), defines=('v1',), reads=('x1',), family='shape')],
    outputs=['v1'],
    module=False,
    resized={'x1': (6, 4, 2, 8)},
)

# def f(x0, x3):
#     v1 = F.max_pool2d(x0, 2)
#     v2 = v1 @ x3
#     return (v2,)
POOL_MATMUL = Program(
    seed=1001610,
    inputs=[
        Input(name='x0', shape=(3, 3, 5, 2), dtype='float32', layout='strided', requires_grad=False, role='arg', seed=1001610000),
        Input(name='x3', shape=(1, 3), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1001610003),
    ],
    steps=[
        Step(lines=('v1 = F.max_pool2d(x0, 2)',), defines=('v1',), reads=('x0',), family='nn'),
        Step(lines=('v2 = v1 @ x3',), defines=('v2',), reads=('v1', 'x3'), family='matmul'),
    ],
    outputs=['v2'],
    module=False,
    resized={'x0': (3, 3, 5, 3), 'x3': (1, 4)},
)

# def f(x2, x3):
#     v1 = F.embedding(((torch.arange(6, device=DEVICE) * 3 + 4) % 2).reshape((3, 2)), x2.reshape(2, -1))
#     with torch.autocast(DEVICE, dtype=torch.float16):
#         v2 = F.linear(v1, x3)
#         v3 = F.gelu(v2) * v2
#     v4 = v3.float() * 2
#     return (v4,)
EMBEDDING_OF_VIEW = Program(
    seed=1003571,
    inputs=[
        Input(name='x2', shape=(2,), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=1003571002),
        Input(name='x3', shape=(3, 1), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1003571003),
    ],
    steps=[
        Step(lines=('v1 = F.embedding(((torch.arange(6, device=DEVICE) * 3 + 4) % 2).reshape((3, 2)), x2.reshape(2, -1))',),
             defines=('v1',), reads=('x2',), family='indexing'),
        Step(lines=('with torch.autocast(DEVICE, dtype=torch.float16):', '    v2 = F.linear(v1, x3)',
                    '    v3 = F.gelu(v2) * v2'), defines=('v2', 'v3'), reads=('v1', 'x3'), family='autocast'),
        Step(lines=('v4 = v3.float() * 2',), defines=('v4',), reads=('v3',), family='unary'),
    ],
    outputs=['v4'],
    module=False,
    resized={'x3': (2, 1)},
)

# def f(x0, x2):
#     v1 = x0.sign()
#     v2 = x2.clone()
#     return (v2,)
CLONE_OF_STRIDED = Program(
    seed=1001781,
    inputs=[
        Input(name='x0', shape=(6, 2, 2, 6), dtype='int64', layout='contiguous', requires_grad=False, role='arg', seed=1001781000),
        Input(name='x2', shape=(1, 2), dtype='float16', layout='strided', requires_grad=False, role='arg', seed=1001781002),
    ],
    steps=[
        Step(lines=('v1 = x0.sign()',), defines=('v1',), reads=('x0',), family='unary'),
        Step(lines=('v2 = x2.clone()',), defines=('v2',), reads=('x2',), family='inplace'),
    ],
    outputs=['v2'],
    module=False,
    resized={'x0': (7, 2, 2, 6)},
)

# def f(x4):
#     v8 = x4.unfold(0, 2, 1)
#     return (v8,)
UNFOLD_OF_STRIDED = Program(
    seed=1008583,
    inputs=[
        Input(name='x4', shape=(5, 6, 6), dtype='bool', layout='strided', requires_grad=False, role='arg', seed=1008583004),
    ],
    steps=[Step(lines=('v8 = x4.unfold(0, 2, 1)',), defines=('v8',), reads=('x4',), family='view')],
    outputs=['v8'],
    module=False,
    resized={'x4': (5, 6, 7)},
)

test_fuzz_1007722_triton_interpret = regression_test(PAD, target='triton-interpret')
test_fuzz_1007722_cpp = regression_test(PAD, target='cpp')
test_fuzz_1001610_triton_interpret = regression_test(POOL_MATMUL, target='triton-interpret')
test_fuzz_1001610_cpp = regression_test(POOL_MATMUL, target='cpp')
test_fuzz_1003571_triton_interpret = regression_test(EMBEDDING_OF_VIEW, target='triton-interpret')
test_fuzz_1001781_triton_interpret = regression_test(CLONE_OF_STRIDED, target='triton-interpret')
test_fuzz_1001781_cpp = regression_test(CLONE_OF_STRIDED, target='cpp')
test_fuzz_1008583_triton_interpret = regression_test(UNFOLD_OF_STRIDED, target='triton-interpret')


def test_pad_backward_at_three_sizes_matches_eager():
    """One compile of pad under dynamic=True; its backward slices the tangent to `1 + s1`."""
    compiled = kiln.compile(lambda x: torch.nn.functional.pad(x, (1, 2)) * 3, dynamic=True)
    for n in (6, 7, 13):
        x = torch.randn(2, n, dtype=torch.float64)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        t = torch.randn(2, n + 3, dtype=torch.float64)
        (torch.nn.functional.pad(a, (1, 2)) * 3).backward(t)
        out = compiled(b)
        assert out.shape == (2, n + 3)
        out.backward(t)
        torch.testing.assert_close(b.grad, a.grad)


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
