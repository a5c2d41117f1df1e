"""Guards and recompiles: each change that matters makes a new entry (and the right answer);
changes that do not matter reuse the entry; past the cache limit the function runs eagerly with a
warning that names the failed guard."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import kiln.capture
from capture_support import Recorder, assert_same
from kiln.config import CaptureConfig


def compiled(fn, **config):
    kiln.capture.reset()
    rec = Recorder()
    return kiln.capture.capture(fn, rec, CaptureConfig(**config)), rec


def check(cf, fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(cf(*args), fn(*args))


def double(x):
    return x * 2


def with_arg(x, n):
    return x * n


@pytest.mark.parametrize("change", [
    lambda: torch.randn(5, 4),                                   # sizes
    lambda: torch.randn(4, 5, dtype=torch.float64),              # dtype
    lambda: torch.randn(4, 5, requires_grad=True),               # requires_grad
    lambda: torch.randn(5, 4).t(),                               # strides
])
def test_tensor_metadata_change_recompiles(change):
    cf, rec = compiled(double, dynamic=False)
    check(cf, double, torch.randn(4, 5))
    check(cf, double, torch.randn(4, 5))
    assert len(rec.graphs) == 1
    check(cf, double, change())
    assert len(rec.graphs) == 2


def test_new_values_same_metadata_reuse_the_entry():
    cf, rec = compiled(double)
    for _ in range(3):
        check(cf, double, torch.randn(4, 5))
    assert len(rec.graphs) == 1


def test_int_argument_is_specialized():
    cf, rec = compiled(with_arg)
    check(cf, with_arg, torch.randn(3), 2)
    check(cf, with_arg, torch.randn(3), 2)
    check(cf, with_arg, torch.randn(3), 3)
    check(cf, with_arg, torch.randn(3), 2.5)
    assert len(rec.graphs) == 3


def test_grad_mode_is_guarded():
    def f(x):
        return x * 2 if torch.is_grad_enabled() else x * 3
    cf, rec = compiled(f)
    x = torch.randn(3)
    check(cf, f, x)
    with torch.no_grad():
        check(cf, f, x)
    check(cf, f, x)
    assert len(rec.graphs) == 2


SCALE = 2.0


def uses_global(x):
    return x * SCALE


def test_global_constant_change_recompiles():
    global SCALE
    cf, rec = compiled(uses_global)
    x = torch.randn(3)
    check(cf, uses_global, x)
    SCALE = 5.0
    try:
        check(cf, uses_global, x)
    finally:
        SCALE = 2.0
    assert len(rec.graphs) == 2


def test_module_training_flag_is_guarded():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    cf, rec = compiled(m)
    x = torch.randn(2, 4)
    m.eval()
    check(cf, m, x)
    m.train()
    torch.manual_seed(0)
    out = cf(x)
    torch.manual_seed(0)
    torch.testing.assert_close(out, m(x))
    assert len(rec.graphs) == 2


def test_replaced_parameter_is_seen():
    m = nn.Linear(3, 3)
    cf, rec = compiled(m)
    x = torch.randn(2, 3)
    check(cf, m, x)
    m.weight = nn.Parameter(torch.randn(3, 3))
    check(cf, m, x)
    assert len(rec.graphs) == 2


def test_in_place_parameter_update_needs_no_recompile():
    m = nn.Linear(3, 3)
    cf, rec = compiled(m)
    x = torch.randn(2, 3)
    check(cf, m, x)
    with torch.no_grad():
        m.weight.mul_(2)
    check(cf, m, x)
    assert len(rec.graphs) == 1


def test_identity_guards_on_tensors_compare_by_identity():
    # guards are deduplicated; Python 3.13's dataclass __eq__ compares fields with ==, which on
    # two tensors is elementwise and has no truth value
    from kiln.capture.guards import Guard, GuardKind
    from kiln.capture.sources import GlobalSource
    src = GlobalSource("w", "__G")
    a, b = torch.randn(3), torch.randn(3)
    assert Guard(GuardKind.ID, src, a) == Guard(GuardKind.ID, src, a)
    assert Guard(GuardKind.ID, src, a) != Guard(GuardKind.ID, src, b)
    assert len({Guard(GuardKind.ID, src, a), Guard(GuardKind.ID, src, a), Guard(GuardKind.ID, src, b)}) == 2


def test_hook_added_after_compile_runs():
    m = nn.Linear(3, 3)
    cf, rec = compiled(m)
    x = torch.randn(2, 3)
    check(cf, m, x)
    m.register_forward_hook(lambda mod, args, out: out * 10)
    check(cf, m, x)
    assert len(rec.graphs) == 2


def test_hook_added_to_a_submodule_after_warm_calls_runs():
    # [Note: hook tables by registration count]: calls after the first full check skip the
    # tables' checks until a hook is registered anywhere; this one must still be seen
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    cf, rec = compiled(m)
    x = torch.randn(2, 3)
    for _ in range(3):
        check(cf, m, x)
    handle = m[2].register_forward_hook(lambda mod, args, out: out * 10)
    check(cf, m, x)
    assert len(rec.graphs) == 2
    handle.remove()
    check(cf, m, x)           # the first entry's tables are empty again: it is found, nothing compiles
    assert len(rec.graphs) == 2


def test_global_hook_added_after_warm_calls_runs():
    m = nn.Linear(3, 3)
    cf, rec = compiled(m)
    x = torch.randn(2, 3)
    for _ in range(2):
        check(cf, m, x)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: out + 1)
    try:
        check(cf, m, x)     # the entry misses; with a global hook the call runs as torch wrote it
    finally:
        handle.remove()
    check(cf, m, x)
    assert len(rec.graphs) == 1


def test_backward_hook_added_after_compile_runs():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    cf, rec = compiled(m)
    x = torch.randn(2, 3)
    check(cf, m, x)
    check(cf, m, x)
    seen = []
    m[0].register_full_backward_hook(lambda mod, gin, gout: seen.append(gout[0].shape))
    cf(x).sum().backward()
    assert seen == [torch.Size([2, 3])]


def test_a_hook_registered_elsewhere_does_not_recompile():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    cf, rec = compiled(m)
    x = torch.randn(2, 3)
    check(cf, m, x)
    other = nn.Linear(2, 2)
    other.register_forward_hook(lambda mod, args, out: out)      # the count moves: one full check
    torch.randn(2, requires_grad=True).register_hook(lambda g: g)
    for _ in range(2):
        check(cf, m, x)
    assert len(rec.graphs) == 1


def test_no_grad_entries_do_not_guard_the_parameters_flags():
    # [Note: requires_grad under no_grad]: freezing a parameter changes nothing a no_grad graph computes
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    cf, rec = compiled(m)
    x = torch.randn(4, 3)
    with torch.no_grad():
        check(cf, m, x)
        m[0].weight.requires_grad_(False)
        check(cf, m, x)
    assert len(rec.graphs) == 1
    check(cf, m, x)                     # with grad mode on, a graph of its own, the flag guarded
    m[0].weight.requires_grad_(True)
    out = cf(x)
    out.sum().backward()
    assert m[0].weight.grad is not None
    assert len(rec.graphs) == 3


def test_enable_grad_inside_no_grad_guards_the_flags_read_before():
    lin = nn.Linear(3, 3)

    def f(x):
        y = lin(x)                      # read with grad mode off
        with torch.enable_grad():
            return lin(y).sum()

    cf, rec = compiled(f)
    x = torch.randn(2, 3)
    with torch.no_grad():
        assert cf(x).requires_grad and f(x).requires_grad
        lin.weight.requires_grad_(False)
        lin.bias.requires_grad_(False)
        out = cf(x)
        assert not out.requires_grad and not f(x).requires_grad
        assert_same(out, f(x))
    lin.weight.requires_grad_(True)
    lin.bias.requires_grad_(True)
    assert len(rec.graphs) == 2


def test_dict_keys_and_list_length_are_guarded():
    def f(d, items):
        return sum(v for v in d.values()) + len(items)
    cf, rec = compiled(f)
    x = torch.randn(3)
    check(cf, f, {"a": x}, [1])
    check(cf, f, {"a": x, "b": x}, [1])
    check(cf, f, {"a": x, "b": x}, [1, 2])
    assert len(rec.graphs) == 3


def test_argument_type_is_guarded():
    def f(x, y):
        return x + y
    cf, rec = compiled(f)
    x = torch.randn(3)
    check(cf, f, x, 1)
    check(cf, f, x, x)
    check(cf, f, x, [1, 2, 3] and 2)
    assert len(rec.graphs) == 2 + 1


def test_cache_size_limit_falls_back_with_named_guard():
    # dynamic=False: the int stays a constant; [Note: ints that change] would make it symbolic
    cf, rec = compiled(with_arg, cache_size_limit=2, dynamic=False)
    x = torch.randn(3)
    check(cf, with_arg, x, 1)
    check(cf, with_arg, x, 2)
    with pytest.warns(UserWarning, match=r"cache_size_limit.*n == 2"):
        assert_same(cf(x, 3), with_arg(x, 3))
    check(cf, with_arg, x, 4)
    assert len(rec.graphs) == 2


def test_aliased_inputs_are_one_graph_input():
    def f(a, b):
        a.add_(1)
        return b * 2
    cf, rec = compiled(f)
    x = torch.zeros(3)
    out = cf(x, x)
    torch.testing.assert_close(out, torch.full((3,), 2.0))
    torch.testing.assert_close(x, torch.ones(3))


def test_guard_function_is_one_function():
    cf, rec = compiled(double)
    cf(torch.randn(2))
    src = cf.entries[0].check.__kiln_source__
    assert src.count("def __kiln_guard") == 1 and "x.size() == (2,)" in src


def test_nested_module_guards_read_each_chain_once():
    """[Note: guard reads shared] the chains to nested submodules are bound once; a change deep
    inside (a replaced weight, a flipped flag, a swapped submodule) still misses the entry."""
    m = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)), nn.Dropout(0.5)).eval()
    cf, rec = compiled(m)
    x = torch.randn(2, 4)
    check(cf, m, x)
    src = cf.compiled.entries[0].check.__kiln_source__
    assert ":=" in src and src.count("._modules['0']._modules['0']") <= 1, src
    check(cf, m, x)
    assert len(rec.graphs) == 1
    m[0][2].weight = nn.Parameter(torch.randn(4, 4))
    check(cf, m, x)
    assert len(rec.graphs) == 2
    m[0][0] = nn.Linear(4, 4)
    check(cf, m, x)
    assert len(rec.graphs) == 3
    m[0][1] = nn.Tanh()
    check(cf, m, x)
    assert len(rec.graphs) == 4


def test_compiled_function_called_from_captured_code_is_inlined():
    inner = kiln.capture.capture(double, Recorder(), CaptureConfig())

    def outer(x):
        return inner(x) + 1
    cf, rec = compiled(outer, fullgraph=True)
    check(cf, outer, torch.randn(3))
    assert len(rec.graphs) == 1


class _Settings:
    def __init__(self):
        self.scale = 2.0


_SETTINGS = _Settings()
_TABLE = {int: 1.0, float: 2.0}


def _copies_settings(x):
    import copy
    s = copy.copy(_SETTINGS)
    return x * s.scale + _TABLE.get(float, 0.0)


def test_copied_object_and_class_keyed_table_are_guarded():
    """copy.copy of a program's object reads its attributes through guards on the original; a
    table keyed by classes is guarded equal to its contents: changing either recompiles."""
    cf, rec = compiled(_copies_settings)
    x = torch.randn(3)
    check(cf, _copies_settings, x)
    _SETTINGS.scale, _TABLE[float] = 3.0, 2.0
    check(cf, _copies_settings, x)
    _TABLE[float] = 5.0
    check(cf, _copies_settings, x)
    _SETTINGS.extra = 1  # a new attribute is copied too: its __dict__'s keys are guarded
    check(cf, _copies_settings, x)
    del _SETTINGS.extra
    _SETTINGS.scale, _TABLE[float] = 2.0, 2.0
    assert len(rec.graphs) == 4
