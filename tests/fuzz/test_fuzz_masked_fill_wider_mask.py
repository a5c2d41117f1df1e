"""Found by `python -m kiln.testing.fuzz` (seed 1127), shrunk: crash.

call 1: CompileStageError: kiln prims stage failed: backend 'kiln': PrimArgumentError: kiln prim kiln_prims.broadcast_in_dim: input size 4 cannot broadcast to 1 at dim 0 (prims are strict: decompositions must convert dtypes and broadcast shapes explicitly)
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0, x2):
#     v3 = x2.clamp(-0.5, 0.5)
#     v6 = v3.clone()
#     v6.copy_(x2)
#     v7 = v6.view(-1)
#     v14 = v7.masked_fill(x0, -1.0)
#     return (v14,)

PROGRAM = Program(
    seed=1127,
    inputs=[
        Input(name='x0', shape=(4,), dtype='bool', layout='contiguous', requires_grad=False, role='arg', seed=1127000),
        Input(name='x2', shape=(1,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1127002),
    ],
    steps=[
        Step(lines=('v3 = x2.clamp(-0.5, 0.5)',), defines=('v3',), reads=('x2',), family='unary'),
        Step(lines=('v6 = v3.clone()', 'v6.copy_(x2)', 'v7 = v6.view(-1)'), defines=('v6', 'v7'), reads=('v3', 'x2'), family='inplace'),
        Step(lines=('v14 = v7.masked_fill(x0, -1.0)',), defines=('v14',), reads=('v7', 'x0'), family='mixed'),
    ],
    outputs=['v14'],
    module=False,
)

test_fuzz_masked_fill_wider_mask = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_masked_fill_wider_mask()
