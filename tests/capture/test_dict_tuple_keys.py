"""A global dict keyed by tuples of strings and dtypes (torch's linear_cross_entropy options table,
`_AUTO_DEFAULTS[(device.type, dtype)]`) is read as a dict, not refused as C code: `.get` and `[]`
fold to its entry, and the entry read is guarded (a changed entry recompiles)."""
import torch

import kiln

TABLE = {("cpu", torch.float32): ("a", 2.0), ("cpu", torch.float64): ("b", 3.0)}


def f(x):
    _, scale = TABLE.get((x.device.type, x.dtype), ("z", 1.0))
    return x * scale + TABLE[("cpu", torch.float64)][1]


def test_tuple_keyed_global_dict_is_read_and_guarded():
    compiled = kiln.compile(f, fullgraph=True)
    for dtype in (torch.float32, torch.float32, torch.float64, torch.float16):
        x = torch.ones(3, dtype=dtype)
        torch.testing.assert_close(compiled(x), f(x))
    TABLE[("cpu", torch.float32)] = ("a", 5.0)
    try:
        x = torch.ones(3)
        torch.testing.assert_close(compiled(x), f(x))
        assert compiled(x)[0].item() == 8.0
    finally:
        TABLE[("cpu", torch.float32)] = ("a", 2.0)
