"""Hugging Face transformers under capture: ModelOutput, graph breaks in wrapped forwards, and
GPT-2 / BERT / T5 / LLaMA at tiny sizes captured as ONE graph under fullgraph=True.

Each model runs in eval mode (logits and output keys equal to eager, exactly one graph) and in
train mode (loss and every parameter's grad equal to eager through backend="aot_eager"). Dropout is
0 in the tiny configs so that eager and compiled draw no random numbers.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
from typing import Optional

import pytest
import torch
import torch._dynamo  # graph_break, to break the graph where a case needs one

import kiln
import kiln.capture
from capture_support import Recorder, assert_same, assert_train_step_equal, quiet_transformers  # noqa: F401
from kiln.config import CaptureConfig

transformers = pytest.importorskip("transformers")
from transformers.utils import ModelOutput  # noqa: E402


@dataclasses.dataclass
class _Out(ModelOutput):
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    hidden: Optional[tuple] = None


def _model_output_fn(x, w):
    h = x @ w
    out = _Out(logits=h.relu(), hidden=(h,))
    first = out[0]  # positions count only the fields that are set
    assert out.loss is None and "loss" not in out
    a, b = out.to_tuple()
    return _Out(loss=(first - a).abs().sum() + b[0].sum(), logits=out["logits"] * 2, hidden=out[1:])


def _capture(fn, backend=None, fullgraph=True):
    kiln.capture.reset()
    rec = backend or Recorder()
    return kiln.capture.capture(fn, rec, CaptureConfig(fullgraph=fullgraph)), rec


def test_model_output_is_built_read_and_returned():
    cf, rec = _capture(_model_output_fn)
    for _ in range(2):
        x, w = torch.randn(3, 4), torch.randn(4, 5)
        out = cf(x, w)
        assert type(out) is _Out and list(out.keys()) == ["loss", "logits", "hidden"]
        assert_same(out.to_tuple(), _model_output_fn(x, w).to_tuple())
    assert len(rec.graphs) == 1


def _keep_config(method):
    """A functools.wraps decorator over a `*args, **kwargs` method, as transformers' are."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        scale = kwargs.pop("scale", 1.0)
        return method(self, *args, **kwargs) * scale
    return wrapper


class _Odd:
    """A class whose own __new__ breaks the graph: building it is a graph break."""
    def __new__(cls, value):
        torch._dynamo.graph_break()
        obj = object.__new__(cls)
        obj.value = value
        return obj


class _Inner(torch.nn.Module):
    @_keep_config
    def forward(self, x, bias=None):
        return _Odd(x + (bias if bias is not None else 1)).value


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()

    @_keep_config
    def forward(self, x, bias=None):
        y = self.inner(x, bias=bias, scale=3.0)
        return y.sin() + x


def test_break_inside_wrapped_forward_keeps_the_rest_compiled():
    m = _Outer()
    rec = Recorder()
    kiln.reset()
    compiled = kiln.compile(m, backend=rec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = kiln.explain(m, torch.randn(4))
        for _ in range(2):
            x = torch.randn(4)
            assert_same(compiled(x, bias=x * 2, scale=0.5), m(x, bias=x * 2, scale=0.5))
    assert not any("whole function eagerly" in b.detail for b in report.breaks), str(report)
    assert report.graph_count >= 2  # before and after the break


def test_logging_in_traced_code_is_replayed_after_the_graph(caplog):
    log = logging.getLogger("kiln.tests.hf")

    def fn(x):
        log.warning("scaling by %d", 2)
        return x * 2

    cf, rec = _capture(fn)
    with caplog.at_level(logging.WARNING, logger="kiln.tests.hf"):
        assert_same(cf(torch.ones(3)), fn(torch.ones(3)))
    assert [r.getMessage() for r in caplog.records] == ["scaling by 2"] * 2  # one from kiln, one from eager
    assert len(rec.graphs) == 1


def _tiny(name):
    t = transformers
    ids = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    if name == "gpt2":
        cfg = t.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=500, n_positions=64,
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return t.GPT2LMHeadModel(cfg), dict(input_ids=ids, labels=ids)
    if name == "bert":
        cfg = t.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                           vocab_size=500, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
        return t.BertForMaskedLM(cfg), dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
    if name == "t5":
        cfg = t.T5Config(num_layers=2, d_model=32, d_kv=8, num_heads=4, d_ff=64, vocab_size=500,
                         decoder_start_token_id=0, dropout_rate=0.0)
        dec = ids[:, :6].contiguous()
        return t.T5ForConditionalGeneration(cfg), dict(input_ids=ids, decoder_input_ids=dec, labels=dec)
    cfg = t.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=64, vocab_size=500, max_position_embeddings=64)
    return t.LlamaForCausalLM(cfg), dict(input_ids=ids, labels=ids)


MODELS = ["gpt2", "bert", "t5", "llama"]


@pytest.mark.parametrize("name", MODELS)
def test_hf_model_infer_one_graph(name):
    torch.manual_seed(0)
    model, inputs = _tiny(name)
    model.eval()
    rec = Recorder()
    kiln.reset()
    compiled = kiln.compile(model, fullgraph=True, backend=rec)
    with torch.no_grad():
        expected = model(**inputs)
        for _ in range(2):
            actual = compiled(**inputs)
            assert type(actual) is type(expected) and list(actual.keys()) == list(expected.keys())
            assert_same(actual.logits, expected.logits)
            assert_same(actual.loss, expected.loss)
    assert len(rec.graphs) == 1


@pytest.mark.parametrize("name", MODELS)
def test_hf_model_train_grads_equal(name):
    torch.manual_seed(0)
    model, inputs = _tiny(name)
    model.train()
    kiln.reset()
    compiled = kiln.compile(model, fullgraph=True, backend="aot_eager")
    assert_train_step_equal(model, compiled, inputs)


def _pop_then_break(x, **kwargs):
    s = kwargs.pop("s")  # written back to kwargs before the break; the local must keep its value
    o = _Odd(x * s)
    return o.value + s, kwargs


def test_values_read_before_side_effects_are_replayed():
    cf, _ = _capture(_pop_then_break, fullgraph=False)
    for _ in range(2):
        x, s = torch.randn(3), torch.randn(3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert_same(cf(x, s=s, t=1), _pop_then_break(x, s=s, t=1))


def test_gpt_neox_generate_takes_eagers_attention_path():
    """generate() with the compiled forward, as the PyTorch 2.0 announcement's dolly example:
    the captured graphs run HF's masks through SDPA's own causal path ([Note: mask elision]), so
    each step's scores equal eager's bit for bit, in at most 3 compilations."""
    t = transformers
    torch.manual_seed(0)
    model = t.GPTNeoXForCausalLM(t.GPTNeoXConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=4, intermediate_size=64,
                                                 max_position_embeddings=64, rotary_pct=0.25)).eval()
    ids = torch.randint(0, 500, (1, 7), generator=torch.Generator().manual_seed(1))

    def generate():
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                  output_scores=True, return_dict_in_generate=True)
    expected = generate()
    rec = Recorder()
    kiln.reset()
    model.forward = kiln.compile(model.forward, backend=rec)
    try:
        actual = generate()
    finally:
        del model.forward
    assert torch.equal(actual.sequences, expected.sequences)
    assert all(torch.equal(a, e) for a, e in zip(actual.scores, expected.scores))
    assert 1 <= len(rec.graphs) <= 3, f"{len(rec.graphs)} compilations"
    calls = [n.kwargs for gm in rec.graphs for n in gm.graph.nodes if "scaled_dot" in str(n.target)]
    assert calls and all(c.get("attn_mask") is None for c in calls)


def _set_output_key(out, x):
    out["logits"] = x * 2
    out["hidden"] = (x,)
    return out.logits + 1


def test_writes_into_an_input_model_output_replay_key_by_key():
    """ModelOutput forbids clear() and update(): its writes replay through __setitem__."""
    x = torch.randn(3)
    eager_out, compiled_out = _Out(loss=x.sum()), _Out(loss=x.sum())
    fn, rec = _capture(_set_output_key)
    assert_same(fn(compiled_out, x), _set_output_key(eager_out, x))
    assert list(compiled_out.keys()) == list(eager_out.keys()) == ["loss", "logits", "hidden"]
    assert_same(compiled_out.logits, eager_out.logits)
    assert_same(compiled_out.hidden, eager_out.hidden)
    assert len(rec.graphs) == 1


@pytest.mark.parametrize("name", ["gpt_neox", "llama"])
def test_output_hidden_states_hooks_are_inlined_into_one_graph(name):
    """output_hidden_states=True collects layer outputs through forward hooks (OrderedDicts)."""
    t = transformers
    torch.manual_seed(0)
    if name == "gpt_neox":
        model = t.GPTNeoXForCausalLM(t.GPTNeoXConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=4, intermediate_size=64,
                                                     max_position_embeddings=64, rotary_pct=0.25))
    else:
        model, _ = _tiny("llama")
    model.eval()
    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(2))
    fn, rec = _capture(lambda i: model(input_ids=i, use_cache=False, output_hidden_states=True))
    with torch.no_grad():
        expected = model(input_ids=ids, use_cache=False, output_hidden_states=True)
        actual = fn(ids)
    assert_same(actual.logits, expected.logits)
    assert len(actual.hidden_states) == len(expected.hidden_states) == 3
    for a, e in zip(actual.hidden_states, expected.hidden_states):
        assert_same(a, e)
    assert len(rec.graphs) == 1


def _outputs_from_containers(x):
    maps = _Out((x, x * 2))  # a tuple of tensors: the first field's value (DETR backbones)
    pairs = _Out([("logits", x + 1), ("loss", x.sum())])  # (name, value) pairs set those fields
    named = _Out({"hidden": (x,), "logits": x - 1})
    empty = _Out([])
    return maps, pairs, named, len(empty), maps.logits is None


def test_model_output_built_from_one_container():
    cf, rec = _capture(_outputs_from_containers)
    x = torch.randn(3)
    actual, expected = cf(x), _outputs_from_containers(x)
    for a, e in zip(actual[:3], expected[:3]):
        assert type(a) is _Out and list(a.keys()) == list(e.keys())
        assert_same(a.to_tuple(), e.to_tuple())
    assert actual[3:] == expected[3:]
    assert len(rec.graphs) == 1


def _set_fields_out_of_order(x):
    out = _Out(hidden=(x,))
    out.logits = x * 2  # a field set later goes last, as ModelOutput.__setattr__ appends it
    out["loss"] = x.sum()
    return out, out[0], out.to_tuple()[1]


def test_model_output_keys_keep_the_order_they_were_set_in():
    cf, rec = _capture(_set_fields_out_of_order)
    x = torch.randn(3)
    (a, a0, a1), (e, e0, e1) = cf(x), _set_fields_out_of_order(x)
    assert list(a.keys()) == list(e.keys()) == ["hidden", "logits", "loss"]
    assert_same(a.to_tuple(), e.to_tuple())
    assert_same((a0, a1), (e0, e1))
    assert len(rec.graphs) == 1


def _set_field_of_input_output(out, x):
    out.logits = out.loss * x  # gemma3n sets pooler_output on its vision tower's output
    return out.logits + 1


def test_attribute_writes_into_an_input_model_output_replay():
    x = torch.randn(3)
    eager_out, compiled_out = _Out(loss=x.sum()), _Out(loss=x.sum())
    fn, rec = _capture(_set_field_of_input_output)
    assert_same(fn(compiled_out, x), _set_field_of_input_output(eager_out, x))
    assert list(compiled_out.keys()) == list(eager_out.keys()) == ["loss", "logits"]
    assert_same(compiled_out.logits, eager_out.logits)
    assert_same(compiled_out["logits"], eager_out["logits"])
    assert len(rec.graphs) == 1
