"""[Note: the entry that matched last is checked first] in kiln/capture/frame.py: a decoder's steps
match the decode entry again and again; the prompt's entry, compiled first, is not checked before
it on every call. Results compared with eager."""
import dataclasses

import torch

import kiln


def _counting(entry, index, calls):
    def check(*args, **kwargs):
        calls.append(index)
        return entry.check(*args, **kwargs)
    return dataclasses.replace(entry, check=check)


def test_the_entry_that_matched_last_is_checked_first():
    def f(x):
        return torch.sin(x) * 2 + 1

    fast = kiln.compile(f, dynamic=False)
    prompt, step = torch.randn(8), torch.randn(1)
    torch.testing.assert_close(fast(prompt), f(prompt))      # the prompt's entry
    torch.testing.assert_close(fast(step), f(step))          # the step's entry, compiled second
    wrapper = fast if hasattr(fast, "entries") else fast.__wrapped__
    assert len(wrapper.entries) == 2
    calls = []
    wrapper.entries[:] = [_counting(e, i, calls) for i, e in enumerate(wrapper.entries)]
    wrapper.last_hit = None
    for _ in range(5):
        torch.testing.assert_close(fast(step), f(step))
    # the first call finds the step's entry after the prompt's fails; then only the step's is checked
    assert calls == [0, 1, 1, 1, 1, 1], calls
    torch.testing.assert_close(fast(prompt), f(prompt))      # the prompt's entry still matches its inputs
    assert wrapper.last_hit is wrapper.entries[0] and calls[-2:] == [1, 0]


def test_reset_forgets_the_last_match():
    def f(x):
        return x.cos() + x

    fast = kiln.compile(f, dynamic=False)
    x = torch.randn(4)
    torch.testing.assert_close(fast(x), f(x))
    torch.testing.assert_close(fast(x), f(x))
    kiln.reset()
    wrapper = fast if hasattr(fast, "entries") else fast.__wrapped__
    assert wrapper.last_hit is None and not wrapper.entries
    torch.testing.assert_close(fast(x), f(x))
