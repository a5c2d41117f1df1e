"""Decompositions keep eager's strides ([Note: decompositions keep eager's strides] in
kiln/aot/trace.py): index_select through `index` came out dim-permuted, so a view of its result
was traced as a copy and a write through that view was lost (fuzz seed 70246)."""
import torch

import kiln


def test_index_select_result_has_eager_strides_and_views_alias():
    idx = torch.tensor([0, 0])

    def f(x):
        v = torch.index_select(x, 2, idx).clone()
        v.view(-1)[0:1].add_(5)
        return v, torch.index_select(x, 2, idx)
    x = torch.randn(3, 4, 1)
    got, ref = kiln.compile(f)(x), f(x)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)
        assert g.stride() == r.stride()


def test_dynamic_sizes_add_no_guard_for_the_check(monkeypatch):
    import kiln.aot
    traced = []
    real = kiln.aot.aot_compile
    monkeypatch.setattr(kiln.aot, "aot_compile", lambda *a, **k: (traced.append(1), real(*a, **k))[1])

    def f(x):
        return torch.index_select(x, 1, torch.tensor([0, 1])) * 2
    compiled = kiln.compile(f, dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(traced) == 1      # one trace serves every size: the layout check added no guard
