"""mode="reduce-overhead" (kiln/runtime/cudagraphs.py): programs replayed as CUDA graphs equal eager
across calls with new inputs, in-place parameter updates and replaced parameters. The CUDA tests
run on the GPU machine; on the CPU the mode compiles as the default one."""
import pytest
import torch

import kiln

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 8)).to(device).eval()


def test_reduce_overhead_on_the_cpu_equals_eager():
    model = _model("cpu")
    kiln.reset()
    compiled = kiln.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), model(x))


@cuda
def test_replays_equal_eager_and_follow_parameter_updates():
    model = _model("cuda")
    kiln.reset()
    compiled = kiln.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        outs = []
        for step in range(5):
            x = torch.randn(4, 16, device="cuda")
            got = compiled(x)
            outs.append(got)
            torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
            if step == 2:
                model[0].weight.mul_(0.5)                                        # in place: same address
            if step == 3:
                model[3].weight = torch.nn.Parameter(model[3].weight.clone() * 2)  # moved: records again
        assert outs[0].data_ptr() != outs[1].data_ptr(), "a replay must return its own copy"
    graphed = _programs()
    assert graphed and any(g.recordings for g in graphed), "no CUDA graph was recorded"


@cuda
def test_new_sizes_record_their_own_graph():
    model = _model("cuda")
    kiln.reset()
    compiled = kiln.compile(model, mode="reduce-overhead", dynamic=True)
    with torch.no_grad():
        for n in (3, 5, 3, 5, 7, 7):
            x = torch.randn(n, 16, device="cuda")
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


def _programs():
    """Every CUDA-graphed program alive."""
    import gc
    from kiln.runtime.cudagraphs import CudaGraphed
    return [o for o in gc.get_objects() if isinstance(o, CudaGraphed)]


@cuda
def test_static_cache_decoding_replays_with_eager_tokens():
    """generate() of a tiny LLaMA under reduce-overhead (a StaticCache: [Note: reduce-overhead decodes
    with a static cache] in kiln/api.py): the decoding step replays one recording per generate(),
    writes the cache in place, and gives eager's tokens; a step's kept logits stay its own."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config).cuda().eval()
    ids = torch.randint(1, 97, (1, 6), device="cuda")
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                  pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    kiln.reset()
    fast = kiln.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        for _ in range(2):
            got = fast.generate(ids, **kwargs)
            assert torch.equal(got.sequences, expected.sequences)
    assert type(got.past_key_values).__name__ == "StaticCache"
    for step, (mine, theirs) in enumerate(zip(got.logits, expected.logits)):
        torch.testing.assert_close(mine, theirs, rtol=1e-3, atol=1e-3, msg=lambda m: f"step {step}: {m}")
    assert len({l.data_ptr() for l in got.logits}) == len(got.logits), "kept logits share memory"
    assert sum(g.replays for g in _programs()) >= 2 * 20, "the decoding steps did not replay"


def test_generate_under_reduce_overhead_defers_the_stop_check():
    """[Note: decoding without a stop sync] in kiln/api.py: during a reduce-overhead generate(),
    transformers' DeferredStopCheck applies on CUDA under transformers' own conditions, and after
    it, transformers decides as it ships. (CPU: the check is only asked; CPU has no events to run it.)"""
    transformers = pytest.importorskip("transformers")
    from transformers.generation.utils import DeferredStopCheck
    cuda_device = torch.device("cuda")

    def deferred(cache=None, returned=False, assistant=False):
        return DeferredStopCheck.is_supported(cuda_device, cache, returned, assistant)

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=48, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    asked = []

    def ask(input_ids, scores):
        asked.append((deferred(), deferred(assistant=True)))
        return scores

    ids = torch.randint(1, 97, (1, 5))
    kiln.reset()
    fast = kiln.compile(model, mode="reduce-overhead")
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        got = fast.generate(ids, logits_processor=[ask], **kwargs)
    assert torch.equal(got, expected)
    assert asked and all(a == (True, False) for a in asked), asked
    assert not deferred(), "the deferral outlived the call"


@cuda
def test_deferred_stop_check_gives_eager_sequences_when_generation_stops_early():
    """A deferred stop (read one step late) runs one extra step after every sequence is done;
    transformers drops its token. Sequences stopping at an end token, batch 2, against eager."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config).cuda().eval()
    ids = torch.randint(1, 97, (2, 6), device="cuda")
    with torch.no_grad():
        free = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                              pad_token_id=0)
        eos = int(free[0, 6 + 5])          # a token the first sequence makes at its sixth step
        kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, pad_token_id=0,
                      eos_token_id=eos)
        expected = model.generate(ids, **kwargs)
        kiln.reset()
        got = kiln.compile(model, mode="reduce-overhead").generate(ids, **kwargs)
    assert torch.equal(got, expected)
