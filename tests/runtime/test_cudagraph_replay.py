"""The replay contract of `mode="reduce-overhead"` (kiln/runtime/cudagraphs.py, [Note: CUDA graphs]),
on the CPU: a recording is emulated by a program whose outputs live in fixed memory that each replay
overwrites, as a CUDA graph's pool does. The real graphs run in tests/codegen/test_cudagraphs.py on
the GPU machine."""
from __future__ import annotations

import pytest
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


def test_outputs_written_back_at_once_are_not_copied_out_of_the_graph():
    """aot's epilogue copies a mutated input's new value (a static cache's `cumulative_length`) into
    the input before the caller can call again: the replay hands it over without a copy, while the
    outputs the caller may keep are still copies."""
    def step(counter, x):       # what aot makes of `counter.add_(1); return x * counter`
        new = counter + 1
        return x * new, new
    graphed = CudaGraphed(step, capture=_emulated_capture, written_back=(1,))
    counter, x, kept = torch.zeros(()), torch.ones(2), []
    for _ in range(5):
        out, new = graphed(counter, x)
        counter.copy_(new)       # the epilogue
        kept.append(out)
    recording = next(iter(graphed.recorded.values()))[0]
    assert new is recording.outputs[1], "the written-back value is the graph's own, not a copy"
    assert kept[-1] is not recording.outputs[0]
    assert [k.tolist() for k in kept] == [[float(i), float(i)] for i in range(1, 6)]


def test_static_cache_decoding_copies_only_the_logits_out_of_the_graph():
    """A static-cache generate() of a tiny GPT-NeoX under emulated graphs: eager's tokens, and of
    the decode graph's outputs only the logits are copied (the caches are written in place, each
    layer's `cumulative_length` is written back at once)."""
    transformers = pytest.importorskip("transformers")
    import kiln
    import kiln.pipeline as pipeline
    made = []

    def wrap(options, program, meta, on_cuda):
        if not options.cudagraphs:
            return program
        made.append(CudaGraphed(program, meta.get("kiln_static_inputs", ()), capture=_emulated_capture,
                                written_back=meta.get("kiln_written_back", ()), fixed_size=meta.get("kiln_module_state", ())))
        return made[-1]
    config = transformers.GPTNeoXConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=64, rotary_pct=0.25)
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(config).eval()
    ids = torch.randint(0, 100, (1, 5))
    kw = dict(cache_implementation="static", max_new_tokens=6, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **kw)
    kiln.reset()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "_wrap", wrap)
        got = kiln.compile(model, mode="reduce-overhead").generate(ids, **kw)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    decode = [g for g in made if g.recordings]
    assert len(decode) == 1 and decode[0].replays >= 3
    recording = next(iter(decode[0].recorded.values()))[0]
    copied = [k for k, o in enumerate(recording.outputs) if isinstance(o, torch.Tensor)
              and k not in recording.static_outputs and k not in recording.uncopied]
    assert copied == [0], f"outputs copied out of the graph: {copied} of {len(recording.outputs)}"


def test_a_cache_that_alternates_between_two_addresses_is_recorded_twice_only():
    """generate() makes a new static cache each call; the allocator hands back the blocks of the
    one before last: the recordings of both address sets are kept and replayed in turn."""
    torch.manual_seed(0)
    weight, tokens = torch.randn(4, 4), [torch.randn(1, 4) for _ in range(4)]
    expected, expected_cache = _eager_steps(weight, tokens)
    graphed = CudaGraphed(_decode_step, static_inputs=(0, 1), capture=_emulated_capture)
    caches = [torch.zeros(8, 4), torch.zeros(8, 4)]
    for call in range(6):                   # six generate() calls, the cache at A, B, A, B, ...
        cache = caches[call % 2].zero_()
        for k, token in enumerate(tokens):
            logits, out = graphed(weight, cache, torch.tensor([k]), token)
            assert out is cache
            torch.testing.assert_close(logits, expected[k])
        torch.testing.assert_close(cache, expected_cache)
    assert graphed.recordings == 2, graphed.recordings
