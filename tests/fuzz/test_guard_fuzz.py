"""Guard fuzzing (kiln.testing.guard_fuzz): mutation sequences agree with eager and never reuse a
stale entry; and the fuzzer does see a stale reuse when guards are bypassed."""
import pytest

from kiln.capture import frame
from kiln.testing import guard_fuzz


def test_sequences_match_eager_and_fresh_compiles():
    counts = guard_fuzz.campaign(20, seed=7000, kiln_every=10, log=lambda m: None)
    assert counts["wrong"] == 0 and counts["stale"] == 0 and counts["crash"] == 0, counts


def test_bypassed_guards_are_caught(monkeypatch):
    def first_entry_always(self, *args, **kwargs):   # a cache that never checks its guards
        if self.entries:
            return self.entries[0].run(*args, **kwargs)
        return self._miss(args, kwargs)
    monkeypatch.setattr(frame.CompiledFunction, "__call__", first_entry_always)
    failures = [f for seed in range(6) for f in guard_fuzz.sequence(seed)]
    kinds = {kind for kind, _, _ in failures}
    assert kinds & {"wrong", "stale"}, failures
