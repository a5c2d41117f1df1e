"""timm models under capture (issue #4): each of the five captures as ONE graph under fullgraph=True,
and the captured graph, run as FX Python, gives eager's logits (eval mode)."""
import pytest
import torch

import kiln
from capture_support import Recorder
from timm_support import TIMM_MODELS, tiny_timm


@pytest.mark.parametrize("name", TIMM_MODELS)
def test_timm_model_captures_as_one_graph(name):
    model, images = tiny_timm(name)
    model.eval()
    kiln.reset()
    recorder = Recorder()
    compiled = kiln.compile(model, backend=recorder, fullgraph=True)
    with torch.no_grad():
        expected = model(images)
        got = compiled(images)
    assert len(recorder.graphs) == 1
    assert torch.equal(got, expected)   # the same torch ops run in the same order: bitwise equal
