"""Found by `python -m kiln.testing.fuzz` (seed 1225), shrunk: crash.

call 1: NameError: name 'buf11' is not defined
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x1, x5):
#     v2 = F.gelu(x1)
#     v4 = F.group_norm(v2, 1)
#     v5 = torch.sigmoid(v4)
#     v6 = v4.norm(dim=2)
#     v10 = v6.reshape((16,))
#     v16 = v10 + x5
#     v19 = torch.cumsum(v16, -1)
#     v21 = torch.floor(v19)
#     v23 = F.avg_pool1d(v5, 1)
#     v25 = v23.movedim(2, 0)
#     v26 = v25[((torch.arange(3) * 3 + 3) % 4).reshape((3,))]
#     return (v21, v26)

PROGRAM = Program(
    seed=1225,
    inputs=[
        Input(name='x1', shape=(4, 4, 5), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1225001),
        Input(name='x5', shape=(16,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1225005),
    ],
    steps=[
        Step(lines=('v2 = F.gelu(x1)',), defines=('v2',), reads=('x1',), family='unary'),
        Step(lines=('v4 = F.group_norm(v2, 1)',), defines=('v4',), reads=('v2',), family='normalization'),
        Step(lines=('v5 = torch.sigmoid(v4)',), defines=('v5',), reads=('v4',), family='unary'),
        Step(lines=('v6 = v4.norm(dim=2)',), defines=('v6',), reads=('v4',), family='reduction'),
        Step(lines=('v10 = v6.reshape((16,))',), defines=('v10',), reads=('v6',), family='view'),
        Step(lines=('v16 = v10 + x5',), defines=('v16',), reads=('v10', 'x5'), family='binary'),
        Step(lines=('v19 = torch.cumsum(v16, -1)',), defines=('v19',), reads=('v16',), family='reduction'),
        Step(lines=('v21 = torch.floor(v19)',), defines=('v21',), reads=('v19',), family='unary'),
        Step(lines=('v23 = F.avg_pool1d(v5, 1)',), defines=('v23',), reads=('v5',), family='convolution'),
        Step(lines=('v25 = v23.movedim(2, 0)',), defines=('v25',), reads=('v23',), family='view'),
        Step(lines=('v26 = v25[((torch.arange(3) * 3 + 3) % 4).reshape((3,))]',), defines=('v26',), reads=('v25',), family='indexing'),
    ],
    outputs=['v21', 'v26'],
    module=False,
)

test_fuzz_recomputed_value_reads_local = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_recomputed_value_reads_local()
