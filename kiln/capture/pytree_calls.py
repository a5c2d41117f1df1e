"""`torch.utils._pytree` inside captured code: inlined, with its specs as constants.

[Note: pytree runs for real on a skeleton] How a tree flattens depends only on its containers and
their keys, which capture knows; never on the tensors at its leaves. So kiln builds the tree's
skeleton: real containers of the same types (list, tuple, namedtuple, structseq, dict,
OrderedDict, defaultdict, deque) holding constants as themselves and a `Token` for every other tracker, and runs
pytree's own function on it. `tree_flatten` hands back the tokens' trackers and the real `TreeSpec`
(an `ObjectVar`: a constant of the graph's Python, never a graph input); `tree_unflatten` builds the
real structure from tokens and reads it back into trackers. pytree itself decides what is a leaf,
the order of the leaves and every error; `tree_map` calls the user's function through the tracer
on each leaf. A leaf-deciding `is_leaf=` callable is refused (a graph break), not guessed.
"""
from __future__ import annotations

import collections

from torch.utils import _pytree as pytree

from kiln.capture import variables as V
from kiln.capture.callables import handles
from kiln.capture.iterators import Token
from kiln.capture.semantics import iterate
from kiln.capture.constants import is_python_constant, python_value

_REAL_DICTS = (dict, collections.OrderedDict, collections.defaultdict)


def skeleton(tx, v: V.Variable):
    """The tree `v` stands for, with a Token for each leaf that is not a constant."""
    if isinstance(v, V.ListVar) and v.cls not in (list, collections.deque):
        raise tx.unsupported(f"a {v.cls.__name__} (a list subclass) in a pytree")
    if isinstance(v, V.ListVar):
        items = [skeleton(tx, i) for i in v.items]
        return items if v.cls is list else collections.deque(items, v.maxlen)
    if isinstance(v, V.TupleVar) and v.cls is tuple:
        return tuple(skeleton(tx, i) for i in v.items)
    if isinstance(v, V.TupleVar) and hasattr(v.cls, "_fields"):
        return v.cls(*[skeleton(tx, i) for i in v.items])
    if isinstance(v, V.TupleVar) and hasattr(v.cls, "n_sequence_fields"):  # torch.return_types
        return v.cls([skeleton(tx, i) for i in v.items])
    if isinstance(v, V.DictVar) and v.cls in _REAL_DICTS:
        items = {k: skeleton(tx, i) for k, i in v.items.items()}
        if v.cls is collections.defaultdict:
            return collections.defaultdict(python_value(v.default_factory) if v.default_factory else None, items)
        return v.cls(items)
    if isinstance(v, (V.Constant, V.ObjectVar)) and is_python_constant(v):
        value = python_value(v)
        if type(value) in pytree.SUPPORTED_NODES:
            raise tx.unsupported(f"a {type(value).__name__} pytree node held by an object kiln does not model")
        return value
    if isinstance(v, (V.DictVar, V.TupleVar)) and v.python_type() in pytree.SUPPORTED_NODES:
        raise tx.unsupported(f"pytree over a {v.python_type().__name__}, a node type kiln does not rebuild")
    return Token(v)


def from_real(tx, value) -> V.Variable:
    """A real tree built from tokens and constants, read back into trackers."""
    if isinstance(value, Token):
        return value.var
    if type(value) is list:
        return V.ListVar([from_real(tx, i) for i in value])
    if isinstance(value, collections.deque):
        return V.ListVar([from_real(tx, i) for i in value], collections.deque, value.maxlen)
    if type(value) is tuple:
        return V.TupleVar([from_real(tx, i) for i in value])
    if isinstance(value, tuple) and (hasattr(type(value), "_fields") or hasattr(type(value), "n_sequence_fields")):
        return V.TupleVar([from_real(tx, i) for i in value], type(value))
    if type(value) in _REAL_DICTS:
        factory = None
        if isinstance(value, collections.defaultdict) and value.default_factory is not None:
            factory = V.ObjectVar(value.default_factory)
        return V.DictVar({k: from_real(tx, i) for k, i in value.items()}, type(value), factory)
    if type(value) in pytree.SUPPORTED_NODES:
        raise tx.unsupported(f"pytree built a {type(value).__name__}, a node type kiln does not read back")
    from kiln.capture.constants import constant_of
    return constant_of(tx, value)


def _no_is_leaf(tx, kwargs):
    is_leaf = kwargs.pop("is_leaf", None)
    if is_leaf is not None and not (isinstance(is_leaf, V.Constant) and is_leaf.value is None):
        raise tx.unsupported("pytree with an is_leaf= function inside captured code")


def _leaves(tx, tree):
    real, spec = pytree.tree_flatten(skeleton(tx, tree))
    return [from_real(tx, leaf) for leaf in real], spec


def _spec_of(tx, v):
    spec = python_value(v)
    if not isinstance(spec, pytree.TreeSpec):
        tx.raise_(TypeError, f"expected a TreeSpec, got {type(spec).__name__}")
    return spec


def _rebuild(tx, leaves: list, spec) -> V.Variable:
    try:
        real = pytree.tree_unflatten([Token(leaf) for leaf in leaves], spec)
    except (ValueError, TypeError) as e:
        tx.raise_(type(e), *e.args)
    return from_real(tx, real)


@handles(pytree.tree_flatten)
def _tree_flatten(tx, args, kwargs):
    _no_is_leaf(tx, kwargs)
    leaves, spec = _leaves(tx, args[0])
    return V.TupleVar([V.ListVar(leaves), V.ObjectVar(spec)])


@handles(pytree.tree_leaves)
def _tree_leaves(tx, args, kwargs):
    _no_is_leaf(tx, kwargs)
    return V.ListVar(_leaves(tx, args[0])[0])


@handles(pytree.tree_structure)
def _tree_structure(tx, args, kwargs):
    _no_is_leaf(tx, kwargs)
    return V.ObjectVar(_leaves(tx, args[0])[1])


@handles(pytree.tree_unflatten)
def _tree_unflatten(tx, args, kwargs):
    leaves, spec = (list(args) + [kwargs.get("leaves"), kwargs.get("treespec")])[:2]
    return _rebuild(tx, iterate(tx, leaves), _spec_of(tx, spec))


def _map_leaves(tx, fn, tree, rests, select=None):
    leaves, spec = _leaves(tx, tree)
    columns = [[from_real(tx, x) for x in spec.flatten_up_to(skeleton(tx, r))] for r in rests]
    out = []
    for i, leaf in enumerate(leaves):
        if select is None or select(leaf):
            out.append(tx.call(fn, [leaf, *[c[i] for c in columns]]))
        else:
            out.append(leaf)
    return out, spec


@handles(pytree.tree_map)
def _tree_map(tx, args, kwargs):
    _no_is_leaf(tx, kwargs)
    out, spec = _map_leaves(tx, args[0], args[1], args[2:])
    return _rebuild(tx, out, spec)


@handles(pytree.tree_map_)
def _tree_map_inplace(tx, args, kwargs):
    _no_is_leaf(tx, kwargs)
    _map_leaves(tx, args[0], args[1], args[2:])
    return args[1]


def _type_selector(tx, types_var):
    """`tree_map_only`'s first argument: a type or tuple of types (a predicate is refused)."""
    from kiln.capture.builtins import BUILTINS
    types = python_value(types_var)
    if not (isinstance(types, type) or isinstance(types, tuple) and all(isinstance(t, type) for t in types)):
        raise tx.unsupported("pytree's *_only functions with a predicate inside captured code")
    return lambda leaf: BUILTINS[isinstance](tx, [leaf, types_var], {}).value


@handles(pytree.tree_map_only)
def _tree_map_only(tx, args, kwargs):
    _no_is_leaf(tx, kwargs)
    out, spec = _map_leaves(tx, args[1], args[2], [], _type_selector(tx, args[0]))
    return _rebuild(tx, out, spec)


def _all_any(reduce, only):
    def handle(tx, args, kwargs):
        from kiln.capture.semantics import truth
        _no_is_leaf(tx, kwargs)
        if only:
            select = _type_selector(tx, args[0])
            args = args[1:]
        leaves = _leaves(tx, args[1])[0]
        return V.Constant(reduce(truth(tx, tx.call(args[0], [leaf])) for leaf in leaves
                                 if not only or select(leaf)))
    return handle


handles(pytree.tree_all)(_all_any(all, False))
handles(pytree.tree_any)(_all_any(any, False))
handles(pytree.tree_all_only)(_all_any(all, True))
handles(pytree.tree_any_only)(_all_any(any, True))


@handles(pytree.tree_iter)
def _tree_iter(tx, args, kwargs):
    # pytree's generator over the leaves: its items are the leaves, in tree_leaves' order
    _no_is_leaf(tx, kwargs)
    return V.IteratorVar(_leaves(tx, args[0])[0])


@handles(pytree.arg_tree_leaves)
def _arg_tree_leaves(tx, args, kwargs):
    # the leaves of each positional argument, then of each keyword's value (pytree's fast path)
    leaves = [leaf for a in [*args, *kwargs.values()] for leaf in _leaves(tx, a)[0]]
    return V.ListVar(leaves)
