"""[Note: a raise on tensor values] (kiln/capture/opcodes.py): a branch on a tensor's truth whose one
side only raises a builtin exception is captured as the other side, and checked after the graph:
eager's values while the check holds, eager's exception type and message when it does not."""
import pytest
import torch
import torch.nn.functional as F

import kiln


def compiled(fn):
    kiln.reset()
    return kiln.compile(fn, fullgraph=True)


def test_a_torch_function_that_validates_values_is_one_graph():
    x, t, v = torch.randn(4, 3), torch.randn(4, 3), torch.rand(4, 3) + 0.1
    f = compiled(lambda a, b, c: F.gaussian_nll_loss(a, b, c))
    torch.testing.assert_close(f(x, t, v), F.gaussian_nll_loss(x, t, v))
    with pytest.raises(ValueError, match="var has negative entry"):
        F.gaussian_nll_loss(x, t, -v)
    with pytest.raises(ValueError, match="var has negative entry"):
        f(x, t, -v)


@pytest.mark.parametrize("negate", [False, True])
def test_a_users_check_raises_eagers_error_with_their_line(negate):
    def g(a):
        if negate:
            if not (a >= 0).all():
                raise RuntimeError("negative input")
        elif (a < 0).any():
            raise RuntimeError("negative input")
        return a.sqrt()
    gc = compiled(g)
    torch.testing.assert_close(gc(torch.full((3,), 4.0)), torch.full((3,), 2.0))
    with pytest.raises(RuntimeError, match=r"negative input .*test_capture_value_checks.py"):
        gc(-torch.ones(3))


def test_a_branch_that_computes_on_both_sides_still_breaks_the_graph():
    def h(a):
        if a.sum() > 0:
            return a * 2
        return a - 1
    with pytest.raises(kiln.errors.Unsupported):
        compiled(h)(torch.ones(3))
    kiln.reset()
    hc = kiln.compile(h)
    for x in (torch.ones(3), -torch.ones(3)):
        torch.testing.assert_close(hc(x), h(x))
