"""The shape guard function skips the static size and stride tuples its caller compares already
(`checked`), and a call whose static sizes differ still misses: capture's tensor guards catch it."""
import torch

import kiln


def test_static_inputs_beside_a_dynamic_one_still_recompile_on_a_new_static_shape():
    def f(x, w):
        return (x.unsqueeze(-1) * w).sum(0)

    fast = kiln.compile(f)                   # automatic: x's length turns symbolic when it changes
    w = torch.randn(4, 3)
    for n in (5, 7, 9, 11):
        x = torch.randn(n, 4)
        torch.testing.assert_close(fast(x, w), f(x, w))
    wrapper = fast if hasattr(fast, "entries") else fast.__wrapped__
    entries = len(wrapper.entries)
    assert entries == 2, "5 static, then 7, 9, 11 one symbolic entry"
    shape_fns = [g.expected[0] for e in wrapper.entries for g in e.guards if g.kind.name == "SHAPES"]
    assert shape_fns and all("a1.size() != (4, 3)" not in fn.source for fn in shape_fns), \
        "w's static sizes are compared by its tensor guard only"
    w2 = torch.randn(4, 2)                   # a new static shape: a miss, then eager's numbers
    x = torch.randn(6, 4)
    torch.testing.assert_close(fast(x, w2), f(x, w2))
    assert len(wrapper.entries) == entries + 1
