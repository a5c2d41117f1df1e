"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seed 1003200), shrunk: crash at
the second call, on the C++ path too: "Trying to backward through the graph a second time".

The module slices its buffer and adds its parameter into it. The first call's epilogue writes the
buffer with a value that requires grad, so from then on the buffer requires grad (a non-leaf whose
history holds the first call's compiled Function). Three things were wrong:

- the entry traced with the buffer not requiring grad was reused: a parameter's or buffer's
  `requires_grad` was not guarded (only its identity), so a parameter unfrozen after the first call
  got no gradient at all (a wrong answer); now guarded (kiln/capture/output.py `parameter`);
- the recompiled graph broke at `add_`: capture's fake of a non-leaf tensor requiring grad was a leaf,
  on which eager refuses an in-place write; it is a non-leaf now (kiln/symbolic/fake.py `_NonLeaf`);
- the second backward reaches the first call's Function again (as eager's reaches the nodes of its
  write), whose `ctx.saved_tensors` raised, freed by the first backward; a Function that writes an
  input with a value requiring grad now holds what it saves on ctx ([Note: a backward reached
  twice] in kiln/aot/runtime.py);
- the warm-start cache's key left out which buffers require grad, so the recompiled graph loaded the
  first one's program, which differentiated nothing through the buffer (a wrong gradient in
  `test_buffer_that_comes_to_require_grad_recompiles_and_matches_eager_over_calls`).

The fuzzer's harness also reset the module for the second call without resetting the buffer's
requires_grad; it makes the buffer a fresh leaf now.
"""
import torch

import kiln
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

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

test_fuzz_1003200_triton_interpret = regression_test(BUFFER_VIEW_BACKWARD, target='triton-interpret')
test_fuzz_1003200_cpp = regression_test(BUFFER_VIEW_BACKWARD, target='cpp')


class _AddsIntoBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.tensor([0.5, -1.0, 2.0]))
        self.weight = torch.nn.Parameter(torch.tensor([1.5, 0.25, -0.75]))

    def forward(self, x):
        seen = self.state[0::2] * x[0::2] + self.weight[1]
        self.state.add_(self.weight * x)
        return seen


def test_buffer_that_comes_to_require_grad_recompiles_and_matches_eager_over_calls():
    """No reset between calls: the buffer requires grad from the second call on, and the second
    call's gradient goes through the first call's write, in eager and compiled alike: the first
    call's Function runs backward a second time, with what it saved ([Note: a backward reached
    twice] in kiln/aot/runtime.py; a third call's backward would reach the first write's nodes
    again, where eager raises: they ran already)."""
    eager, compiled_module = _AddsIntoBuffer(), _AddsIntoBuffer()
    compiled = kiln.compile(compiled_module)
    xs = [torch.randn(3) for _ in range(2)]
    for call, x in enumerate(xs):
        a, b = eager(x), compiled(x)
        torch.testing.assert_close(b, a)
        assert compiled_module.state.requires_grad == eager.state.requires_grad
        a.sum().backward()
        b.sum().backward()
        torch.testing.assert_close(compiled_module.weight.grad, eager.weight.grad, msg=f"call {call + 1}")
        torch.testing.assert_close(compiled_module.state.detach(), eager.state.detach())


def test_buffer_history_backward_after_the_output_backward():
    """A backward through the output, then one through the buffer the call wrote (the second
    reaches the Function again, which must still hold the input it saved)."""
    class WritesState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("state", torch.zeros(3))
            self.weight = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))

        def forward(self, x):
            self.state.add_(self.weight * x)
            return x * 2
    grads = []
    for wrap in (lambda m: m, kiln.compile):
        m = WritesState()
        x = torch.tensor([0.25, 1.5, -3.0], requires_grad=True)
        wrap(m)(x).sum().backward()
        m.state.sum().backward()
        grads.append((m.weight.grad, x.grad))
    torch.testing.assert_close(grads[1], grads[0])


def test_unfrozen_parameter_gets_its_gradient():
    """A parameter frozen at the first call and unfrozen after: a recompile, and its gradient."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    lin.weight.requires_grad_(False)
    compiled = kiln.compile(lin)
    x = torch.randn(4, 3)
    compiled(x).sum().backward()
    assert lin.weight.grad is None
    lin.weight.requires_grad_(True)
    compiled(x).sum().backward()
    torch.testing.assert_close(lin.weight.grad, torch.ones(2, 4) @ x)
    lin.weight.requires_grad_(False)
    lin.weight.grad = None
    compiled(x).sum().backward()
    assert lin.weight.grad is None


def test_non_leaf_input_written_in_place_is_one_graph():
    """A non-leaf argument requiring grad written in place, as eager allows: no graph break."""
    def f(x, y):
        x.add_(y)
        return x * 2
    w, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    report = kiln.explain(f, w * 1, y)
    assert report.graph_count == 1 and report.break_count == 0, str(report)
    w2, y2 = w.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    out, ref = kiln.compile(f)(w * 3, y), f(w2 * 3, y2)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)
    torch.testing.assert_close(y.grad, y2.grad)


def test_non_leaf_input_under_no_grad_still_requires_grad():
    """Under no_grad the fake of a non-leaf input requiring grad still requires grad, as the input."""
    def f(x):
        return x * 2 if x.requires_grad else x * 3
    a = torch.randn(3, requires_grad=True) * 1
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(f)(a), f(a))


if __name__ == "__main__":
    test_fuzz_1003200_triton_interpret()
    test_fuzz_1003200_cpp()
    test_buffer_that_comes_to_require_grad_recompiles_and_matches_eager_over_calls()
    test_buffer_history_backward_after_the_output_backward()
    test_unfrozen_parameter_gets_its_gradient()
    test_non_leaf_input_written_in_place_is_one_graph()
    test_non_leaf_input_under_no_grad_still_requires_grad()
