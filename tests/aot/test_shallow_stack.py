"""A dispatch with no Python frames above it: autograd runs a CUDA backward on a device thread of its
own, which calls the tracing mode's `__torch_dispatch__` from C++ (the GPU fuzz's 44 crashes of 600,
"call stack is not deep enough", at the joint graph's trace). Where-in-the-user's-code lookups then
find no user line instead of failing."""
import _thread
import threading

import torch
from torch import fx

from kiln.aot.rng import RngStream
from kiln.aot.trace import _Recorder
from kiln.symbolic import shape_env


def _in_bare_thread(fn):
    """fn() on a thread whose first Python frame is fn's own caller (as C++ calls into Python)."""
    done, result = threading.Event(), []

    def run():
        try:
            result.append(fn())
        except BaseException as e:       # noqa: BLE001 - handed back to the test
            result.append(e)
        done.set()
    _thread.start_new_thread(run, ())
    assert done.wait(60)
    return result[0]


def test_user_line_lookups_on_a_bare_thread():
    assert _in_bare_thread(shape_env._locate) == (None, None)
    recorder = _Recorder(fx.Graph(), {}, RngStream.__new__(RngStream))
    assert _in_bare_thread(lambda: recorder._origin(torch.ops.aten.add.Tensor)) == ("add", "")
