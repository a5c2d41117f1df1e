"""[Note: mask elision] in kiln/capture/masks.py: an attention mask computed from the inputs that is
all true or causal is dropped for SDPA's own path, under a guard on the mask's values; any other
mask is passed as it is. Every call is compared with eager."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kiln
import kiln.capture
from capture_support import Recorder
from kiln.capture import frame
from kiln.config import CaptureConfig


def attend(q, k, v, attention_mask):
    """A Hugging Face-style mask: causal positions and the padding mask, broadcast, then SDPA."""
    lq, lk = q.shape[-2], k.shape[-2]
    rows = torch.arange(lk - lq, lk, device=q.device)[:, None]
    cols = torch.arange(lk, device=q.device)[None, :]
    mask = (cols <= rows)[None, None] & attention_mask.bool()[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def qkv(b=2, lq=6, lk=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, 2, n, 8, generator=g) for n in (lq, lk, lk)]


def compiled(fn):
    kiln.capture.reset()
    rec = Recorder()
    rec.events = []
    return kiln.capture.capture(fn, rec, CaptureConfig()), rec


def sdpa_calls(rec):
    return [dict(n.kwargs) for gm in rec.graphs for n in gm.graph.nodes if "scaled_dot" in str(n.target)]


def run(fn, rec, *args):
    frame._EVENT_SINKS.append(rec.events)
    try:
        got = fn(*args)
    finally:
        frame._EVENT_SINKS.remove(rec.events)
    return got


def test_a_causal_mask_without_padding_becomes_is_causal():
    fn, rec = compiled(attend)
    for seed in (0, 1):
        q, k, v = qkv(seed=seed)
        ones = torch.ones(2, 6, dtype=torch.long)
        torch.testing.assert_close(run(fn, rec, q, k, v, ones), attend(q, k, v, ones))
    (call,) = sdpa_calls(rec)
    assert call["attn_mask"] is None and call["is_causal"] is True
    assert not [e for e in rec.events if e.kind == "recompile"]


def test_an_all_true_mask_of_one_query_is_dropped():
    fn, rec = compiled(attend)
    q, k, v = qkv(lq=1, lk=7)
    ones = torch.ones(2, 7, dtype=torch.long)
    torch.testing.assert_close(run(fn, rec, q, k, v, ones), attend(q, k, v, ones))
    (call,) = sdpa_calls(rec)
    assert call["attn_mask"] is None and call["is_causal"] is False


def test_a_padded_mask_is_passed_as_it_is():
    fn, rec = compiled(attend)
    q, k, v = qkv()
    padded = torch.ones(2, 6, dtype=torch.long)
    padded[0, :2] = 0
    torch.testing.assert_close(run(fn, rec, q, k, v, padded), attend(q, k, v, padded))
    (call,) = sdpa_calls(rec)
    assert call["attn_mask"] is not None and not call.get("is_causal")


def test_padding_on_a_later_call_misses_the_value_guard_and_recompiles():
    fn, rec = compiled(attend)
    q, k, v = qkv()
    ones = torch.ones(2, 6, dtype=torch.long)
    padded = ones.clone()
    padded[1, :3] = 0
    for mask in (ones, padded, ones, padded):
        torch.testing.assert_close(run(fn, rec, q, k, v, mask), attend(q, k, v, mask))
    calls = sdpa_calls(rec)
    assert len(calls) == 2, "one entry per kind of mask, then cache hits"
    assert calls[0]["attn_mask"] is None and calls[1]["attn_mask"] is not None
    (recompile,) = [e for e in rec.events if e.kind == "recompile"]
    assert "attention mask" in str(recompile.detail) and "is causal" in str(recompile.detail)


def test_a_mask_of_constants_needs_no_guard():
    def fn(q, k, v):
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    report = kiln.explain(fn, *qkv())
    assert not [g for g in report.guards if "attention mask" in g]
    c, rec = compiled(fn)
    q, k, v = qkv()
    torch.testing.assert_close(run(c, rec, q, k, v), fn(q, k, v))
    assert sdpa_calls(rec)[0]["is_causal"] is True


def test_a_mask_written_in_place_is_kept():
    def fn(q, k, v, attention_mask):
        mask = attention_mask.bool()[:, None, None, :].expand(-1, 1, q.shape[-2], -1).clone()
        mask[..., 0] = True
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    c, rec = compiled(fn)
    q, k, v = qkv()
    ones = torch.ones(2, 6, dtype=torch.long)
    torch.testing.assert_close(run(c, rec, q, k, v, ones), fn(q, k, v, ones))
    assert sdpa_calls(rec)[0]["attn_mask"] is not None


def test_a_float_mask_and_an_explicit_is_causal_are_left_alone():
    def additive(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    c, rec = compiled(additive)
    q, k, v = qkv()
    zeros = torch.zeros(6, 6)
    torch.testing.assert_close(run(c, rec, q, k, v, zeros), additive(q, k, v, zeros))
    assert sdpa_calls(rec)[0]["attn_mask"] is not None


def test_explain_lists_the_value_guard_with_the_users_line():
    q, k, v = qkv()
    report = kiln.explain(attend, q, k, v, torch.ones(2, 6, dtype=torch.long))
    (guard,) = [g for g in report.guards if "attention mask" in g]
    assert "test_capture_masks.py" in guard and guard.endswith("is causal")


def test_a_mask_written_between_two_uses_is_kept_for_the_second():
    def fn(q, k, v, attention_mask):
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None] & attention_mask.bool()[:, None, None, :]
        first = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        mask[..., 0, 1] = True
        return first, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    c, rec = compiled(fn)
    q, k, v = qkv()
    ones = torch.ones(2, 6, dtype=torch.long)
    for got, want in zip(run(c, rec, q, k, v, ones), fn(q, k, v, ones)):
        torch.testing.assert_close(got, want)
    first, second = sdpa_calls(rec)
    assert first["attn_mask"] is None and second["attn_mask"] is not None


class SizedByHidden(torch.nn.Module):
    """HF BERT's shape under dynamic=True: the mask is sized by the hidden states, which depend on
    parameters, so its sizes are read from an intermediate, not from an input."""

    def __init__(self, causal: bool):
        super().__init__()
        self.proj, self.causal = torch.nn.Linear(16, 16), causal

    def forward(self, x):
        h = self.proj(x)
        b, n = h.shape[0], h.shape[1]
        rows = torch.arange(n)[None, None, :, None]
        mask = (rows >= torch.arange(n)[None, None, None, :]) if self.causal else (rows >= 0)
        q = h.view(b, n, 2, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask.expand(b, -1, n, n))


def test_a_mask_sized_by_an_intermediate_is_elided_for_every_symbolic_length():
    for causal in (False, True):
        kiln.capture.reset()
        model, rec = SizedByHidden(causal), Recorder()
        rec.events = []
        fn = kiln.capture.capture(model, rec, CaptureConfig(dynamic=True))
        with torch.no_grad():
            for n in (6, 9, 13):
                x = torch.randn(2, n, 16)
                torch.testing.assert_close(run(fn, rec, x), model(x))
        (call,) = sdpa_calls(rec)
        assert call["attn_mask"] is None and call["is_causal"] is causal, call
        assert not [e for e in rec.events if e.kind == "recompile"]


class EmbeddedAttention(torch.nn.Module):
    """A mask built, as Hugging Face's `sdpa_mask` does, from the length of the embedding's output
    (`inputs_embeds.shape[1]`), an intermediate whose producers read a parameter.
    `keep(cols, t)` says which keys each query sees."""

    def __init__(self, keep):
        super().__init__()
        self.keep = keep
        self.emb, self.qkv = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 48)

    def forward(self, ids):
        x = self.emb(ids)
        b, t, _ = x.shape
        cols = torch.arange(t, device=x.device) + 0
        mask = self.keep(cols, t)[None, None, None, :].expand(b, 1, t, t)
        q, k, v = self.qkv(x).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _over_lengths(keep, lengths):
    torch.manual_seed(0)
    model = EmbeddedAttention(keep).eval()
    kiln.capture.reset()
    rec = Recorder()
    rec.events = []
    fn = kiln.capture.capture(model, rec, CaptureConfig(dynamic=True))
    with torch.no_grad():
        for t in lengths:
            ids = torch.randint(0, 50, (2, t))
            torch.testing.assert_close(run(fn, rec, ids), model(ids))
    return rec


def test_a_mask_of_symbolic_sizes_that_is_all_true_is_dropped_for_every_length():
    """[Note: masks of symbolic sizes]: one graph, SDPA without a mask, at every length."""
    rec = _over_lengths(lambda cols, t: cols >= 0, (5, 7, 9, 7))
    (call,) = sdpa_calls(rec)
    assert call["attn_mask"] is None and call["is_causal"] is False
    assert not [e for e in rec.events if e.kind == "recompile"]


def test_a_mask_of_symbolic_sizes_that_masks_is_kept():
    rec = _over_lengths(lambda cols, t: cols < t - 1, (5, 7))
    (call,) = sdpa_calls(rec)
    assert call["attn_mask"] is not None


def test_a_mask_of_symbolic_sizes_all_true_only_at_some_lengths_recompiles_at_the_others():
    """All true up to length 8: the guard's verdict per length holds for 5 and 7 (cached), misses
    at 9, whose capture keeps the mask."""
    rec = _over_lengths(lambda cols, t: cols < 8, (5, 7, 9, 7, 9))
    calls = sdpa_calls(rec)
    assert len(calls) == 2 and calls[0]["attn_mask"] is None and calls[1]["attn_mask"] is not None
    (recompile,) = [e for e in rec.events if e.kind == "recompile"]
    assert "attention mask" in str(recompile.detail)
