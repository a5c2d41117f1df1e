"""The replay contract of `mode="reduce-overhead"` (kiln/runtime/cudagraphs.py, [Note: CUDA graphs]),
on the CPU: a recording is emulated by a program whose outputs live in fixed memory that each replay
overwrites, as a CUDA graph's pool does. The real graphs run in tests/codegen/test_cudagraphs.py on
the GPU machine."""
from __future__ import annotations

import torch

from kiln.runtime.cudagraphs import CudaGraphed


def _emulated_capture(program, graph_args):
    outputs = program(*graph_args)

    def replay():   # the recorded kernels write the same memory again
        for kept, new in zip(outputs, program(*graph_args)):
            if isinstance(kept, torch.Tensor) and not new.is_set_to(kept):
                kept.copy_(new)
    return replay, outputs


def _decode_step(weight, cache, position, token):
    """A decoding step's shape: write the token's state into the cache in place, read it all."""
    cache.index_put_((position,), token @ weight)
    return cache.sum(0, keepdim=True) * 2, cache


def _eager_steps(weight, tokens):
    cache = torch.zeros(8, 4)
    return [_decode_step(weight, cache, torch.tensor([k]), t)[0].clone() for k, t in enumerate(tokens)], cache


def test_kept_outputs_survive_later_replays_and_the_cache_is_written_in_place():
    torch.manual_seed(0)
    weight, tokens = torch.randn(4, 4), [torch.randn(1, 4) for _ in range(6)]
    expected, expected_cache = _eager_steps(weight, tokens)
    # inputs 0 (a parameter) and 1 (the cache the program writes) are used in place
    graphed = CudaGraphed(_decode_step, static_inputs=(0, 1), capture=_emulated_capture)
    cache = torch.zeros(8, 4)
    kept = []
    for k, token in enumerate(tokens):      # call 0 warms up, call 1 records, the rest replay
        logits, cache_out = graphed(weight, cache, torch.tensor([k]), token)
        assert cache_out is cache, "the written cache comes back as the caller's own tensor"
        kept.append(logits)
    assert len(graphed.recorded) == 1 and graphed.replays == len(tokens) - 2
    for got, want in zip(kept, expected):   # each step's output as it was, not the last replay's
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(cache, expected_cache)


def test_a_moved_static_input_records_again():
    torch.manual_seed(0)
    weight, tokens = torch.randn(4, 4), [torch.randn(1, 4) for _ in range(4)]
    expected, _ = _eager_steps(weight, tokens)
    graphed = CudaGraphed(_decode_step, static_inputs=(0, 1), capture=_emulated_capture)
    cache = torch.zeros(8, 4)
    for k, token in enumerate(tokens[:3]):
        graphed(weight, cache, torch.tensor([k]), token)
    moved = cache.clone()                   # the caller's cache now lives elsewhere
    logits, out = graphed(weight, moved, torch.tensor([3]), tokens[3])
    assert out is moved
    torch.testing.assert_close(logits, expected[3])


def test_a_static_input_of_another_size_at_the_same_address_records_again():
    """A new cache of another length can be allocated where a freed one was."""
    program = lambda cache, x: (cache * 2 + x.sum(),)     # noqa: E731
    graphed = CudaGraphed(program, static_inputs=(0,), capture=_emulated_capture)
    storage = torch.zeros(16)
    for _ in range(3):
        graphed(storage[:8].view(2, 4), torch.ones(3))
    smaller = storage[:6].view(2, 3)                       # the same address, another size
    torch.testing.assert_close(graphed(smaller, torch.ones(3))[0], smaller * 2 + 3)
