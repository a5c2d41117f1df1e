"""Aliasing and live views: every alias of a container sees its mutations, in one graph and across
graph breaks ([Note: one object per tracker] in `rebuild.py`), and dict views read their dict as it
is when they are used (`views.py`). Each program here once gave a result eager does not."""
from __future__ import annotations

from capture_corpus import PROGRAMS, T, Program, program


def brk(graphs, breaks=1, inputs=T):
    def register(fn):
        PROGRAMS.append(Program("alias_" + fn.__name__, fn, inputs, graphs, breaks))
        return fn
    return register


# -- dict views are live ------------------------------------------------------------------------------
@program(name="view_read_after_dict_changed")
def _views_after_change(x):
    d = {"a": x}
    ks, vs, its = d.keys(), d.values(), d.items()
    d["b"] = x * 2
    del d["a"]
    return list(ks), [v + 1 for v in vs], list(its), len(ks), "b" in ks, ("b", None) in its


@program(name="view_loop_sees_values_written_during_the_loop")
def _items_loop_writes_later_value(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    for k, v in d.items():
        d["c"] = v * 10  # the loop reaches "c" after this wrote it
    return d


@program(name="view_set_algebra_and_equality")
def _views_set_ops(x):
    d = {"a": x, "b": 2}
    ks = d.keys()
    d["c"] = 3
    return x * len(ks - {"a"}), ks == {"a", "b", "c"}, sorted(ks & {"b", "c", "z"}), bool(d.values())


@program(name="view_iterator_next_is_live")
def _view_next(x):
    d = {"a": x, "b": x}
    it = iter(d.values())
    first = next(it)
    d["b"] = x * 3
    return first + next(it), next(it, None) is None


@brk(graphs=1)
def view_kept_across_a_break(x):
    d = {"a": x}
    ks, vs = d.keys(), d.values()
    print(end="")  # a graph break that prints nothing
    d["b"] = x * 2
    return list(ks), list(vs)


@brk(graphs=1)
def view_of_alias_across_a_break(x):
    d = {"a": x}
    e = d
    its = e.items()
    print(end="")  # a graph break that prints nothing
    d["b"] = x * 2
    return list(its), e is d


# -- one object however many aliases ----------------------------------------------------------------
@brk(graphs=1)
def list_aliased_twice(x):
    a = [x]
    b = a
    c = b
    print(end="")  # a graph break that prints nothing
    c.append(x * 2)
    b += [x * 3]
    return a, a is c


@brk(graphs=1)
def list_held_twice_in_another(x):
    inner = [x]
    outer = [inner, inner]
    print(end="")  # a graph break that prints nothing
    outer[0].append(x * 2)
    return outer[1], outer[0] is outer[1]


@brk(graphs=1)
def dict_aliased(x):
    d = {"a": x}
    e = d
    print(end="")  # a graph break that prints nothing
    e["b"] = x * 2
    return d


@brk(graphs=1)
def list_sorted_in_place_through_an_alias(x):
    order = [3, 1, 2]
    alias = order
    print(end="")  # a graph break that prints nothing
    order.sort()
    alias.reverse()
    return x * order[0], alias


class _Box:
    def __init__(self, v):
        self.v = v


@brk(graphs=1)
def new_object_aliased(x):
    box = _Box(x)
    same = box
    print(end="")  # a graph break that prints nothing
    same.v = x * 3
    return box.v, box is same


@program(name="alias_sort_in_place_one_graph")
def _sort_in_place(x):
    order = [3, 1, 2]
    alias = order
    order.sort(reverse=True)
    return x * alias[0], alias, sorted(alias)


@brk(graphs=1)
def iterator_aliased(x):
    it = iter([x, x * 2, x * 3])
    same = it
    print(end="")  # a graph break that prints nothing
    next(same)
    return next(it)
