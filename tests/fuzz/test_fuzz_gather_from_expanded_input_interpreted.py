"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 1000362), shrunk: crash.

call 1: InterpreterError: ValueError('Mask argument cannot be block type if pointer argument is not a block')
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v3 = F.embedding(((torch.arange(4, device=DEVICE) * 7 + 3) % 1).reshape((2, 2)), x0.reshape(1, -1))
#     return (v3,)

PROGRAM = Program(
    seed=1000362,
    inputs=[
        Input(name='x0', shape=(1, 8), dtype='float16', layout='expanded', requires_grad=True, role='arg', seed=1000362000),
    ],
    steps=[
        Step(lines=('v3 = F.embedding(((torch.arange(4, device=DEVICE) * 7 + 3) % 1).reshape((2, 2)), x0.reshape(1, -1))',), defines=('v3',), reads=('x0',), family='indexing'),
    ],
    outputs=['v3'],
    module=False,
)

test_fuzz_gather_from_expanded_input_interpreted = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_gather_from_expanded_input_interpreted()
