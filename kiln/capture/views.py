"""Dict views (`d.keys()`, `d.values()`, `d.items()`): live windows onto a dict tracker.

A view is not a copy: read after its dict changed, it shows the new contents, and a loop over
`d.items()` sees a value written to a later key during the loop. So a view is a `DictViewVar`
holding the `DictVar` itself, and every read of it (iteration, `len`, `in`, folding to a constant,
rebuilding after the graph, where it becomes a view of the rebuilt dict) reads the dict as it is
at that moment. An iterator over a view (`IteratorVar.view`) holds the keys only, as CPython's
walks the dict's entries by position: each value is read when the loop reaches it, and the
iterator raises RuntimeError once the dict has changed size, as Python's does.

Hands on: `items_of`, `view_iter`, `advance` (steps an `IteratorVar`; `generators.advance` steps any
iterator);
the view types themselves are `variables.VIEW_TYPES`.
"""
from __future__ import annotations

from kiln.capture import variables as V

def _item(view: V.DictViewVar, k) -> V.Variable:
    if view.kind == "keys":
        return V.key_var(k)
    value = view.dict.items[k]
    return value if view.kind == "values" else V.TupleVar([V.key_var(k), value])


def items_of(view: V.DictViewVar) -> list[V.Variable]:
    """What iterating the view yields now."""
    return [_item(view, k) for k in view.dict.items]


def view_iter(view: V.DictViewVar) -> V.IteratorVar:
    return V.IteratorVar([V.key_var(k) for k in view.dict.items], view=view, size=len(view.dict.items), hinted=True)


def length_hint(it: V.IteratorVar) -> int:
    """`it.__length_hint__()` of an iterator over a builtin container: the items not yet reached
    (none once its dict changed size, as CPython's dict iterators answer)."""
    if it.view is not None and len(it.view.dict.items) != it.size:
        return 0
    return max(len(it.items) - it.index, 0)


def advance(tx, it: V.IteratorVar) -> V.Variable | None:
    """The iterator's next item, or None when it is exhausted."""
    if it.view is not None and it.index <= len(it.items) and len(it.view.dict.items) != it.size:
        it.index = len(it.items) + 1  # as CPython's: raise once, then stay exhausted
        tx.raise_(RuntimeError, "dictionary changed size during iteration")
    if it.index >= len(it.items):
        return None
    it.index += 1
    key = it.items[it.index - 1]
    return key if it.view is None else _item(it.view, _raw_key(it.view.dict, key))


def _raw_key(d: V.DictVar, key: V.Variable):
    """The entry of `d.items` a key tracker yielded by `V.key_var` stands for."""
    if isinstance(key, V.Constant):
        return key.value
    if key in d.items:
        return key
    return next((k for k in d.items if isinstance(k, V.ValueKey) and k.var is key), key)
