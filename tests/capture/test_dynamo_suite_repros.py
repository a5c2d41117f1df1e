"""Python semantics test_repros.py of the Dynamo suite (issue #39) found kiln getting wrong: each
program runs eagerly and under kiln, over calls that must not reuse a stale graph."""
from __future__ import annotations

import warnings

import numpy as np
import torch

import kiln
from capture_support import Recorder, assert_same


def compiled(fn, backend="eager", **config):
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kiln.compile(fn, backend=backend, **config)


# -- NumPy scalars are constants guarded by value ------------------------------------------------
def scaled_by_list(x, values):
    return x * torch.tensor(values), x * values[0]


def test_numpy_scalar_arguments_are_guarded_by_value():
    # guarded on their type alone, the second call reused the first call's graph
    fn = compiled(scaled_by_list)
    x = torch.ones(3)
    for values in ([np.int64(1), np.int64(2), np.int64(3)], [np.int64(4), np.int64(5), np.int64(6)]):
        assert_same(fn(x, values), scaled_by_list(x, values))
    floats = [np.float32(0.5)]
    assert_same(fn(torch.ones(1), floats), scaled_by_list(torch.ones(1), floats))
