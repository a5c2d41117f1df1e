"""An output that is a view of an input requiring grad is rebuilt by replaying its traced view
steps on the real input; the traced input was a `clone()`, contiguous where the real one is
strided (`x[::2]`) or offset, so `x.diagonal()` came back with the clone's strides: wrong elements, no
error. Found while shrinking fuzz seeds 851 and 985 (whose expanded inputs still fail plainly:
see [_program_copy] in kiln/aot/trace.py)."""
import torch

import kiln


def test_view_of_a_strided_input_that_requires_grad():
    base = torch.randn(8, 4)
    for make in (lambda: base[::2], lambda: base[:, ::2].t(), lambda: base[1:, 1:], lambda: base.view(-1)[3:19].view(4, 4)):
        for fn in (lambda x: (x.diagonal(),), lambda x: (x[1:], x.t())):
            x = make().detach().requires_grad_()
            kiln.reset()
            got = kiln.compile(fn)(x)
            ref = fn(x)
            for g, r in zip(got, ref):
                torch.testing.assert_close(g, r, rtol=0, atol=0)
                assert g.stride() == r.stride()
            sum(g.sum() for g in got).backward()
            mine, x.grad = x.grad, None
            sum(r.sum() for r in ref).backward()
            torch.testing.assert_close(mine, x.grad)
