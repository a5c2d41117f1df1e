"""transformers GPT-2 and LLaMA (small random configs): a training step through aot_compile equals
eager. BERT and T5 run in the sweep script (tests/aot/sweeps/hf_models.py, output hf_models.md)."""
import os
import sys

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "sweeps"))
from hf_models import check  # noqa: E402


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_training_step_matches_eager(name):
    verdict, compiled, _ = check(name)
    assert verdict.ok, f"{name}: {verdict.detail}"
    assert compiled.bw is not None and compiled.info.bytes_saved < compiled.info.bytes_save_all
