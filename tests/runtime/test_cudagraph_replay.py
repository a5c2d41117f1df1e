"""The replay contract of `mode="reduce-overhead"` (kiln/runtime/cudagraphs.py, [Note: CUDA graphs]),
on the CPU: a recording is emulated by a program whose outputs live in fixed memory that each replay
overwrites, as a CUDA graph's pool does. The real graphs run in tests/codegen/test_cudagraphs.py on
the GPU machine."""
from __future__ import annotations

import pytest
import torch

from kiln.runtime.cudagraphs import CudaGraphed, graphed


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
        made.append(graphed(program, meta, capture=_emulated_capture))
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
    # each layer's cumulative_length is copied back by the graph itself ([Note: written back inside the graph])
    assert len(recording.written_in_graph) == config.num_hidden_layers, recording.written_in_graph


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


def _counting_step(counter, weight, x):
    """What aot makes of `counter.add_(1); return x @ weight * counter`: the new value is an output
    the epilogue copies back into the input."""
    new = counter + 1
    return (x @ weight) * new, new


def _epilogue(counter, new):
    """aot's epilogue: the new value into the input, unless the program (or its graph) wrote it."""
    if new is not counter and not new.is_set_to(counter):
        counter.copy_(new)


def test_a_write_back_recorded_in_the_graph_advances_the_input_once_a_call():
    """[Note: written back inside the graph]: the recording's own runs of the program leave the
    input as it was, each replay writes it once, and the replay returns the input itself."""
    torch.manual_seed(0)
    weight, xs = torch.randn(4, 4), [torch.randn(2, 4) for _ in range(6)]
    graphed_step = CudaGraphed(_counting_step, static_inputs=(0, 1), capture=_emulated_capture,
                               written_back=(1,), written_into=((1, 0),))
    counter, eager_counter = torch.zeros(()), torch.zeros(())
    for x in xs:                          # call 0 warms up, call 1 records, the rest replay
        out, new = graphed_step(counter, weight, x)
        _epilogue(counter, new)
        want, eager_new = _counting_step(eager_counter, weight, x)
        eager_counter.copy_(eager_new)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(counter, eager_counter)
    recording = next(iter(graphed_step.recorded.values()))[0]
    assert recording.written_in_graph == {1: 0}
    assert new is counter, "a replay returns the input the graph wrote"
    assert graphed_step.replays == len(xs) - 2


def test_a_counter_that_moves_is_written_where_it_now_is():
    """A write-back recorded into the graph writes the recorded address: a counter elsewhere records
    again, and the one left behind is not written any more."""
    torch.manual_seed(0)
    weight, x = torch.randn(4, 4), torch.randn(2, 4)
    graphed_step = CudaGraphed(_counting_step, static_inputs=(0, 1), capture=_emulated_capture,
                               written_back=(1,), written_into=((1, 0),))
    first = torch.zeros(())
    for _ in range(4):
        _epilogue(first, graphed_step(first, weight, x)[1])
    assert first.item() == 4
    second = torch.full((), 10.0)
    for k in range(3):
        out, new = graphed_step(second, weight, x)
        _epilogue(second, new)
        torch.testing.assert_close(out, (x @ weight) * (11 + k))
    assert second.item() == 13 and first.item() == 4


def test_a_parameter_whose_data_is_replaced_in_place_records_again():
    """`p.data = t` keeps the Parameter object and moves its storage: a module-state input (sizes
    trusted, addresses compared) that moved must not replay the old graph."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)
    x = torch.randn(2, 4)
    program = lambda w, x: (x @ w,)       # noqa: E731
    graphed_mm = CudaGraphed(program, static_inputs=(0,), capture=_emulated_capture, fixed_size=(0,),
                             concrete_size=(0,))
    for _ in range(3):
        torch.testing.assert_close(graphed_mm(weight, x)[0], x @ weight)
    weight.data = weight.data * 2
    torch.testing.assert_close(graphed_mm(weight, x)[0], x @ weight)
    assert graphed_mm.recordings == 2


def test_a_new_layout_after_replays_does_not_replay_the_last_recording():
    """The replay's fast path tries the recording that replayed last: an input of another shape
    (or dtype) must fall through to its own warm-up and recording."""
    torch.manual_seed(0)
    weight = torch.randn(4, 4)
    program = lambda w, x: (x @ w + 1,)   # noqa: E731
    graphed_mm = CudaGraphed(program, static_inputs=(0,), capture=_emulated_capture)
    for rows in (2, 2, 2, 3, 3, 3, 2, 5):
        x = torch.randn(rows, 4)
        got = graphed_mm(weight, x)[0]
        assert got.shape == (rows, 4)
        torch.testing.assert_close(got, x @ weight + 1)
    x = torch.randn(2, 4, dtype=torch.float64)
    torch.testing.assert_close(graphed_mm(weight.double(), x)[0], x @ weight.double() + 1)
    assert graphed_mm.recordings == 2


def test_each_replay_returns_outputs_of_its_own():
    """Outputs are gathered from a plan made at recording: a kept output is a copy, not the graph's
    memory, and two replays' outputs never share storage."""
    program = lambda w, x: (x * w, x + w)   # noqa: E731
    graphed_pair = CudaGraphed(program, static_inputs=(0,), capture=_emulated_capture)
    w = torch.ones(3)
    outs = [graphed_pair(w, torch.full((3,), float(k))) for k in range(5)]
    assert type(outs[-1]) is tuple
    for k, (product, total) in enumerate(outs):
        assert product.tolist() == [float(k)] * 3 and total.tolist() == [k + 1.0] * 3
    assert outs[3][0].data_ptr() != outs[4][0].data_ptr()
