"""The host program: generated, printable Python that allocates buffers, calls kernels and externs.

`plan_host(graph, schedule, ...)` writes the source of one function `call(arg0, arg1, ...)`; all
decisions are made here, once, so a call does no Python work beyond the generated lines:
allocation (with buffers reused by liveness), one ctypes call per kernel, one call per extern.

[Note: buffer reuse] A buffer's storage returns to a pool after its last reader; a later buffer of
the same dtype, device and storage size takes it, and a pooled buffer no later one takes is
released (`del`) where it entered the pool. An extern may return a view of its inputs, so its
inputs live as long as its outputs, and its outputs are released at their last use, never pooled
(their storage may be shared). Graph outputs and inputs are never reused. So the program holds
only live buffers, as eager does: peak memory follows liveness, not the number of steps.

[Note: boxed programs] A backward's inputs are mostly saved activations, and eager frees each
once the node reading it has run. A program called as `call(*inputs)` cannot free any: the
caller's argument tuple holds them to the end, so a training step's backward peak held every
saved value at once. A boxed program, `call(args)`, takes a list, empties it, and drops each
input's name after its last use, so the caching allocator gets the storage back (never pooled for
reuse: the caller may hold another reference). The source says so with `_BOXED = True`, and the
linked callable with `call.boxed`.

[Note: kept buffers] On CPU every allocation the program makes is fresh memory from malloc, and
the kernel that first writes it page-faults on every 4 KiB page: on the zoo's vit, 1,500 faults
per call and a fifth of its single-threaded time on this project's 2-core CI machine. So a CPU program keeps the storage of its
internal buffers between calls, per thread (`_keep(slot, ...)`, grown when a dynamic size needs
more): a storage chain (a fresh allocation and the buffers reusing its storage) is internal when
no buffer of it is a graph output or input, nor read by an extern that may return a view of it.
A matmul writes its result into a buffer of ours through its `out=` overload, so that buffer
joins the pool like a kernel's. Memory held between calls is the program's internal peak under
[Note: buffer reuse]; outputs stay fresh tensors.

The source is self-contained apart from the names in `HostProgram.globals_spec` (kernels by name,
extern ops by qualified name, constants by graph attribute), which is what lets the warm-start
cache (`kiln.runtime.cache`) store and re-link it in another process.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.scheduler import Schedule

_LITERAL_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.layout, torch.memory_format)


@dataclasses.dataclass(frozen=True)
class HostProgram:
    source: str                        # Python source defining `call`
    kernels: tuple[tuple[str, int, int], ...]   # (name, #buffer args, #size args)
    externs: tuple[tuple[str, Any], ...]          # (global name, op)
    constants: tuple[str, ...]         # buffer names bound to graph constants
    cacheable: bool                    # every global can be rebuilt in another process

    def __str__(self):
        return self.source


def py_index(e) -> str:
    """An index or size expression as Python over the bound size symbols (integer arithmetic)."""
    from kiln.symbolic.sympy_ops import FloorDiv, to_python
    e = sympy.sympify(e)
    if e.is_Integer:
        return str(int(e))
    e = e.replace(sympy.floor, lambda arg: FloorDiv(*sympy.fraction(sympy.together(arg))))
    return to_python(e, {s: s.name for s in e.free_symbols})


def py_tuple(exprs) -> str:
    """A tuple of index or size expressions as Python source: `(16, s0*3, )`."""
    return "(" + "".join(f"{py_index(e)}, " for e in exprs) + ")"


def _literal(v, binds: dict, state: dict) -> str:
    if isinstance(v, ir.BufferArg):
        return v.name
    if isinstance(v, ir.ViewArg):
        return f"_view({v.name}, {py_tuple(v.sizes)}, {py_tuple(v.strides)}, {py_index(v.offset)})"
    if isinstance(v, ir.SizeArg):
        return py_index(v.expr)
    if isinstance(v, sympy.Expr):   # a size the graph returns (saved for the backward)
        return py_index(v)
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_literal(x, binds, state) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return f"float('{v}')"
    if isinstance(v, _LITERAL_TYPES):
        return repr(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    name = f"_obj{len(binds)}"
    binds[name] = v
    state["cacheable"] = False
    return name


def plan_host(graph: ir.Graph, sched: Schedule, takes_pointers: bool = True,
              probe: bool = False, boxed: bool = False, keep: bool = False,
              index_errors: bool = False) -> tuple[HostProgram, dict]:
    """The host program for `graph` as scheduled; also returns the non-serializable globals.
    `probe`: after each kernel or extern, hand every buffer it wrote to `_probe(step, name, tensor)`
    (`kiln.codegen.check` binds it). `boxed`: see [Note: boxed programs]. `keep`: see
    [Note: kept buffers]. `index_errors`: a kernel with index checks returns the code of the one
    that failed, and the program raises ([Note: index bounds checks] in lowering_reduce)."""
    keep = keep and not probe   # the checker compares what each step wrote, call by call
    buffers = graph.buffer_map()
    steps = list(sched.steps)
    inputs = [b for b in graph.inputs if b is not None]
    param_names = [b if b is not None else f"_unused{i}" for i, b in enumerate(graph.inputs)]
    for i, sym in graph.size_inputs:  # a symbolic int input is its symbol's value
        param_names[i] = sym.name
    constants = tuple(b.name for b in graph.buffers if b.name.startswith("const"))
    outputs = {o if isinstance(o, str) else o.name for o in graph.outputs if isinstance(o, (str, ir.ViewArg))}
    never_reuse = set(inputs) | set(constants) | outputs
    held_to_end = never_reuse - (set(inputs) - outputs if boxed else set())

    # [Note: scatters write in place] (ir.py): a scatter's result is the buffer it writes into,
    # under another name; that buffer's storage lives as long as the result's, and
    # the kernel that writes it reads it (its other elements are the result's)
    written_into = {n.buffer: n.body.into for n in graph.nodes
                    if isinstance(n, ir.ComputedBuffer) and isinstance(n.body, ir.Scatter)}

    def reads(step) -> list[str]:
        if isinstance(step, ir.Kernel):
            stored = {s.buffer for st in step.stages for s in st.body if isinstance(s, ir.Store)}
            return [a for a in step.buffer_args if a not in stored] + [written_into[b] for b in stored if b in written_into]
        return [a.name for a in torch.utils._pytree.tree_leaves((step.args, [v for _, v in step.kwargs]))
                if isinstance(a, (ir.BufferArg, ir.ViewArg))]

    def writes(step) -> list[str]:
        if isinstance(step, ir.Kernel):
            return list(dict.fromkeys(s.buffer for st in step.stages for s in st.body if isinstance(s, ir.Store)))
        return [o for o in step.outputs if o is not None and o in buffers]  # not host values

    last_use: dict[str, int] = {}     # the last step naming a buffer: its name is dropped after it
    for i, step in enumerate(steps):
        for b in reads(step) + writes(step):
            last_use[b] = i
    for b in held_to_end:
        last_use[b] = len(steps)
    # A storage may be overwritten only once every view of it is dead: an extern that may return a
    # view of its inputs keeps them until its outputs die. (Dropping a name is always safe: a view
    # holds its base's storage.)
    storage_end = dict(last_use)
    for i in reversed(range(len(steps))):
        if isinstance(steps[i], ir.ExternKernel) and _may_alias(steps[i].op):
            end = max((storage_end.get(o, i) for o in writes(steps[i])), default=i)
            for b in reads(steps[i]):
                storage_end[b] = max(storage_end.get(b, i), end)
        elif isinstance(steps[i], ir.Kernel):
            for b in writes(steps[i]):
                if b in written_into:
                    storage_end[written_into[b]] = max(storage_end.get(written_into[b], i), storage_end.get(b, i))
    seen_by_views = {b for step in steps if isinstance(step, ir.ExternKernel) and _may_alias(step.op)
                     for b in reads(step)}
    escaping = never_reuse | seen_by_views
    # externs writing into a buffer of ours through `out=` (the buffer is then pooled like a kernel's)
    into_out: dict[int, Any] = {}
    for i, step in enumerate(steps):
        if keep and isinstance(step, ir.ExternKernel) and len(step.outputs) == 1:
            out, op = step.outputs[0], _out_overload(step.op)
            if op is not None and out in buffers and out not in escaping:
                into_out[i] = op
    extern_outputs = {o for i, step in enumerate(steps) if isinstance(step, ir.ExternKernel) and i not in into_out
                      for o in writes(step)} | written_into.keys()
    chain: dict[str, str] = {}         # buffer -> the fresh allocation whose storage it holds
    fresh_at: dict[str, int] = {}      # fresh allocation -> its line, rewritten to `_keep` if internal
    chain_escapes: set[str] = set()

    binds: dict[str, Any] = {}
    state = {"cacheable": True}
    externs: list[tuple[str, Any]] = []
    if boxed:
        lines = ["_BOXED = True", "def call(args):",
                 f"    {''.join(n + ', ' for n in param_names)}= args", "    args.clear()"]
    else:
        lines = [f"def call({', '.join(param_names)}):"]
    unbound = _unbacked_symbols(graph, steps, buffers)
    unbacked = frozenset(unbound)
    lines += _bind_sizes(graph, steps, buffers, param_names, unbound)
    for name in inputs:
        lines += _layout_check(buffers[name])
    lines += [f"    {name} = {name}.to({buffers[name].device!r})" for name in graph.moved_inputs if name in last_use]
    unread = [n for n in param_names if n not in last_use and n not in held_to_end and n in inputs]
    if boxed and unread:
        lines.append(f"    del {', '.join(unread)}")
    pool: dict[tuple, list[str]] = {}
    pooled_at: dict[str, int] = {}     # a pooled buffer -> the line after which it entered the pool
    def allocate(b: str) -> None:
        if b in written_into:          # the storage it writes into, by another name
            into = written_into[b]
            chain[b] = chain.get(into, into)
            if b in escaping:
                chain_escapes.add(chain[b])
            lines.append(f"    {b} = {into}")
            return
        line, old = _alloc(buffers[b], pool, buffers)
        chain[b] = b if old is None else chain[old]
        if old is None:
            fresh_at[b] = len(lines)
        if b in escaping:
            chain_escapes.add(chain[b])
        lines.append(line)
        if old is not None:   # the new name holds the storage now
            del pooled_at[old]
            lines.append(f"    del {old}")

    for i, step in enumerate(steps):
        if isinstance(step, ir.Kernel):
            for b in writes(step):
                if b not in sched.local_buffers:
                    allocate(b)
            args = [f"{a}.data_ptr()" if takes_pointers else a for a in step.buffer_args]
            args += [py_index(s) for s in step.size_args]
            checks = ir.index_checks(step) if index_errors else ()
            if checks:
                table = ", ".join(f"({c.kind!r}, {py_index(c.size)}, {c.origin.op if c.origin else ''!r}, "
                                  f"{c.origin.where if c.origin else ''!r})" for c in checks)
                lines += [f"    _failed = {step.name}({', '.join(args)})",
                          f"    if _failed: _index_error({step.name!r}, ({table},)[_failed - 1])"]
            else:
                lines.append(f"    {step.name}({', '.join(args)})")
            if probe:
                lines += [f"    _probe({step.name!r}, {b!r}, {b})" for b in writes(step) if b not in sched.local_buffers]
        else:
            gname = f"_extern{len(externs)}"
            externs.append((gname, _direct_op(step.op)))
            args = [_literal(a, binds, state) for a in step.args]
            args += [f"{k}={_literal(v, binds, state)}" for k, v in step.kwargs]
            outs = [o if o is not None else "_" for o in step.outputs]
            if i in into_out:
                externs[-1] = (gname, into_out[i])
                allocate(outs[0])
                args.append(f"out={outs[0]}")
            call = f"{gname}({', '.join(args)})"
            if len(outs) == 1:
                calling = [f"    {outs[0]} = _one({call})"]
            else:
                calling = [f"    {', '.join(outs)} = {call}"]
                if "_" in outs:   # results nobody reads are released at once
                    calling.append("    del _")
            if step.origin is not None:    # ATen's index error, with the user's op and line as a note
                o = step.origin
                calling = (["    try:"] + ["    " + line for line in calling] +
                           ["    except (IndexError, RuntimeError) as _e:",
                            f"        _note_extern_error(_e, {o.op!r}, {o.where!r})"])
            lines += calling
            for o in writes(step):   # an undefined optional result (cuDNN attention's logsumexp) is None
                lines += _bind_unbacked(buffers[o], unbound, unbacked)
                lines += _layout_check(buffers[o], may_be_none=True)
            if probe:
                lines += [f"    if {o} is not None: _probe({gname + ':' + str(step.op)!r}, {o!r}, {o})"
                          for o in writes(step)]
        dead = []
        for b in sorted(set(reads(step) + writes(step))):
            if last_use.get(b) == i and b not in held_to_end and b not in sched.local_buffers:
                if b in never_reuse or b in extern_outputs or storage_end[b] != i:   # not ours to reuse
                    dead.append(b)
                else:
                    pool.setdefault(_storage_key(buffers[b]), []).append(b)
                    pooled_at[b] = len(lines)
        if dead:
            lines.append(f"    del {', '.join(dead)}")
    if keep:
        for b, at in fresh_at.items():
            if b not in chain_escapes:
                lines[at] = f"    {b} = {_keep_call(buffers[b], at)}"   # a slot per fresh allocation
    for b, at in sorted(pooled_at.items(), key=lambda kv: -kv[1]):   # never taken: release
        lines.insert(at, f"    del {b}")
    outs = [o if isinstance(o, str) else _literal(o, binds, state) for o in graph.outputs]
    outs = [f"{o}.cpu()" if k in graph.cpu_outputs else o for k, o in enumerate(outs)]
    lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    program = HostProgram("\n".join(lines) + "\n",
                          tuple((k.name, len(k.buffer_args), len(k.size_args)) for k in steps
                                if isinstance(k, ir.Kernel)),
                          tuple(externs), constants, state["cacheable"])
    return program, binds


def _symbols_of(graph: ir.Graph, steps) -> set[sympy.Symbol]:
    """The size symbols the host program reads: in buffer layouts, kernel and extern arguments."""
    exprs = [e for b in graph.buffers for e in (*b.sizes, *b.strides, b.offset)]
    for step in steps:
        if isinstance(step, ir.Kernel):
            exprs += step.size_args
            continue
        for a in torch.utils._pytree.tree_leaves((step.args, [v for _, v in step.kwargs]),
                                                 is_leaf=lambda x: isinstance(x, (ir.SizeArg, ir.ViewArg))):
            if isinstance(a, ir.SizeArg):
                exprs.append(a.expr)
            elif isinstance(a, ir.ViewArg):
                exprs += [*a.sizes, *a.strides, a.offset]
    exprs += [e for o in graph.outputs if isinstance(o, ir.ViewArg) for e in (*o.sizes, *o.strides, o.offset)]
    return {s for e in exprs for s in sympy.sympify(e).free_symbols}


def _unbacked_symbols(graph: ir.Graph, steps, buffers: dict) -> set[sympy.Symbol]:
    """[Note: sizes bound by externs] A size known only at run time (an unbacked symbol of
    kiln.symbolic: nonzero's count, unique's, a number read with `.item()`) is no size of any
    input. The extern that computes it is the first step whose output buffer has it as a whole
    dim (`buf1: int64[u0, 2]`), or returns it as a host value named after it (`u0 = _extern0(...)`,
    lowering's `extern_fallback`). The host program binds the symbol right after that extern
    (`u0 = buf1.shape[0]`), so every later kernel and allocation takes it as any other size: one
    program for every count. Returns the symbols so bound; `_bind_unbacked` emits each once."""
    from_inputs = {s for name in graph.inputs if name is not None
                   for e in (*buffers[name].sizes, *buffers[name].strides) for s in sympy.sympify(e).free_symbols}
    from_inputs |= {sym for _, sym in graph.size_inputs}
    found = set()
    for step in steps:
        if isinstance(step, ir.ExternKernel):
            for o in step.outputs:
                if o is not None and o in buffers:
                    found |= {d for d in buffers[o].sizes if isinstance(d, sympy.Symbol)}
    return found - from_inputs


def _bind_unbacked(buf: ir.Buffer, unbound: set, unbacked: frozenset = frozenset()) -> list[str]:
    """Lines binding the symbols `buf` (an extern's output) is the first to hold as a dim, and
    checking its dims over symbols bound before: tracing assumed what an op requires of a count
    (`x[m1] * y[m2]`: the two counts equal, u1 replaced by u0), where eager raises if it fails, so
    the program raises too instead of reading past a buffer."""
    lines = []
    for d, size in enumerate(buf.sizes):
        if isinstance(size, sympy.Symbol) and size in unbound:
            unbound.discard(size)
            lines.append(f"    {size.name} = {buf.name}.shape[{d}]")
        elif sympy.sympify(size).free_symbols & unbacked and not sympy.sympify(size).free_symbols & unbound:
            lines += [f"    if {buf.name}.shape[{d}] != {py_index(size)}:",
                      f"        raise RuntimeError(f'kiln: {buf.name} has {{{buf.name}.shape[{d}]}} rows in dim {d} where the "
                      f"compiled program assumed {size} = {{{py_index(size)}}} (a count known only at run time; "
                      f"eager raises here too: e.g. two boolean masks that select different counts)')"]
    return lines


def _bind_sizes(graph: ir.Graph, steps, buffers: dict, param_names: list[str], unbound: set = frozenset()) -> list[str]:
    """Lines binding each size symbol at the top of `call`: from a symbolic int input (already a
    parameter of that name), else from the first tensor input dim whose size is that symbol, else
    from the first whose stride is (a slice of a longer tensor: `ids[:, :n]` of a padded batch).
    Symbols an extern returns (a host value) or computes ([Note: sizes bound by externs]) are bound
    where it runs."""
    bound = {sym.name for _, sym in graph.size_inputs} | {sym.name for sym in unbound}
    bound |= {o for step in steps if isinstance(step, ir.ExternKernel)   # host values externs return
              for o in step.outputs if o is not None and o not in buffers}
    lines = []
    for sym in sorted(_symbols_of(graph, steps), key=lambda s: s.name):
        if sym.name in bound:
            continue
        line = _read_symbol(sym, graph, buffers, param_names)
        if line is not None:
            lines.append(line)
        else:
            from kiln.errors import NotYetImplemented
            raise NotYetImplemented(f"kiln codegen: the size symbol {sym} is no dim of any tensor input and no "
                                    "int input of the graph, so the host program cannot read it at run time")
    return lines


def _read_symbol(sym, graph: ir.Graph, buffers: dict, param_names: list[str]) -> str | None:
    """The line reading `sym` from a tensor input's sizes, else strides; None if no input has it."""
    for attribute, read in (("sizes", "shape"), ("strides", "stride()")):
        for i, name in enumerate(graph.inputs):
            if name is not None and sym in getattr(buffers[name], attribute):
                return f"    {sym} = {param_names[i]}.{read}[{list(getattr(buffers[name], attribute)).index(sym)}]"
    return None


def _layout_check(buf: ir.Buffer, may_be_none: bool = False) -> list[str]:
    """A tensor whose strides differ from those the kernels were written for is copied into that
    layout (symbolic strides are compared after the size symbols are bound)."""
    strides = py_tuple(buf.strides)
    if all(sympy.sympify(s).is_number for s in buf.strides):
        strides = repr(tuple(int(s) for s in buf.strides))
    none = f"{buf.name} is not None and " if may_be_none else ""
    return [f"    if {none}{buf.name}.stride() != {strides} and _strides_differ({buf.name}, {strides}): "
            f"{buf.name} = _restride({buf.name}, {strides})"]


def _strides_differ(t: torch.Tensor, strides: tuple) -> bool:
    """Whether `t`'s strides differ from `strides` in a dim of more than one element (the stride of a
    size-1 dim is never read: a 1x1 convolution's weight gradient comes back as (16, 1, 16, 16)
    where (16, 1, 1, 1) was planned, the same layout)."""
    return any(n != 1 and a != b for n, a, b in zip(t.shape, t.stride(), strides))


def _may_alias(op) -> bool:
    """Whether an extern's results may be views of its arguments (by its schema; unknown: yes)."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return True
    return any(r.alias_info is not None for r in schema.returns)


def _direct_op(op):
    """An extern prim mirrors one ATen overload (same schema); call ATen directly and skip the
    custom op's Python dispatch (tens of microseconds per call)."""
    try:
        from kiln.prims.externs import ATEN_OF_PRIM
    except ImportError:
        return op
    return ATEN_OF_PRIM.get(op, op)


def _storage_key(buf: ir.Buffer) -> tuple:
    """Buffers of one key can share storage: dtype, device and the elements the layout spans. A
    zero-size dim spans none, whatever the strides say (sizes 0 and 1 are never symbolic): sizes
    (3, 0) with strides (1, 1) took 2, and a 2-element buffer was given their empty storage (fuzz
    seed 20729)."""
    if any(s == 0 for s in buf.sizes):
        return (buf.dtype, buf.device, sympy.Integer(0))
    extent = sympy.Integer(1) + sum(((s - 1) * st for s, st in zip(buf.sizes, buf.strides)), sympy.Integer(0))
    return (buf.dtype, buf.device, sympy.expand(extent))


def _alloc(buf: ir.Buffer, pool: dict, layouts: dict) -> tuple[str, str | None]:
    """The line allocating `buf`, and the pooled buffer whose storage it takes (None: a new one)."""
    sizes, strides = py_tuple(buf.sizes), py_tuple(buf.strides)
    free = pool.get(_storage_key(buf))
    if free:
        old = free.pop()
        if (buf.sizes, buf.strides) == (layouts[old].sizes, layouts[old].strides):
            return f"    {buf.name} = {old}  # reuses {old}'s storage", old
        return f"    {buf.name} = {old}.as_strided({sizes}, {strides})  # reuses {old}'s storage", old
    return (f"    {buf.name} = _empty({sizes}, {strides}, dtype={buf.dtype!r}, "
            f"device={str(buf.device)!r})"), None


# ATen matmuls whose `out=` overload is a kernel of its own (autogenerated ones compute into a
# temporary and copy it over)
_WRITES_INTO_OUT = ("mm", "bmm", "addmm", "baddbmm")


def _out_overload(op):
    """The `out=` overload of an extern that writes a kept buffer (see [Note: kept buffers])."""
    aten_op = _direct_op(op)
    if not isinstance(aten_op, torch._ops.OpOverload) or aten_op.overloadpacket.__name__ not in _WRITES_INTO_OUT:
        return None
    return getattr(aten_op.overloadpacket, "out", None)


def _keep_call(buf: ir.Buffer, slot: int) -> str:
    return f"_keep({slot}, {py_tuple(buf.sizes)}, {py_tuple(buf.strides)}, {buf.dtype!r})"


class _KeptStorage(threading.local):
    """A program's kept buffers ([Note: kept buffers]): per thread, so concurrent calls of one
    compiled function never share one. A slot remembers the view it last handed out, which a call
    with the same sizes (every call, for static shapes) takes as it is."""

    def __init__(self):
        self.slots: dict[int, tuple[tuple, tuple, torch.Tensor]] = {}

    def keep(self, slot: int, sizes: tuple, strides: tuple, dtype: torch.dtype) -> torch.Tensor:
        held = self.slots.get(slot)
        if held is not None and held[0] == sizes and held[1] == strides:
            return held[2]
        extent = 1 + sum((n - 1) * st for n, st in zip(sizes, strides)) if all(sizes) else 0
        flat = held[2] if held is not None else None
        if flat is None or flat.untyped_storage().nbytes() < extent * flat.element_size():
            flat = torch.empty(extent, dtype=dtype)
        view = flat.as_strided(sizes, strides, 0)
        self.slots[slot] = (sizes, strides, view)
        return view


def _restride(t: torch.Tensor, strides: tuple) -> torch.Tensor:
    """`t` in the layout a program was written for. A layout with stride-0 dims (an expanded
    input, saved for the backward, which the forward handed on as a dense copy) holds one
    element along them: `t`'s first is taken, as every one is equal in a broadcast value."""
    broadcast = [d for d, st in enumerate(strides) if st == 0 and t.shape[d] > 1]
    if broadcast:
        small = t
        for d in broadcast:
            small = small.narrow(d, 0, 1)
        return _restride(small, strides).expand(t.shape)
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _view(t: torch.Tensor, sizes: tuple, strides: tuple, offset: int) -> torch.Tensor:
    return t.as_strided(sizes, strides, t.storage_offset() + offset)


def _index_error(kernel: str, check: tuple) -> None:
    """Raise for a kernel's failed index check ([Note: index bounds checks] in lowering_reduce):
    `check` is (kind, the dim's size, the user's op, their line), as `plan_host` prints it."""
    kind, size, op, where = check
    raise ir.IndexCheck(kind, size, ir.CheckOrigin(op, where)).error(kernel, size)


def _note_extern_error(e: BaseException, op: str, where: str) -> None:
    """Re-raise ATen's error of an indexing extern with a note naming the user's op and line
    (the message and type stay ATen's, as eager's)."""
    e.add_note(f"kiln: raised by ATen's kernel for {op or 'an indexing op'}" + (f" at {where}" if where else ""))
    raise e


def _one(result):
    return result[0] if isinstance(result, (tuple, list)) else result


# torch's Python bindings of ATen functions, where an extern may be called through one
_BINDINGS = (torch._C._VariableFunctions, torch._C._nn, torch._C._linalg, torch._C._special)


def _binding(op):
    """[Note: externs through torch's bindings] An `OpOverload` call converts its arguments through
    the operator's schema (boxed IValues): on the H200 `aten.convolution.default` took 31 us of host
    time a call where `torch.convolution`, the same kernel through torch's generated argument
    parser, took 20. A training step calls hundreds of externs, so an extern is called through the
    binding of its ATen function's name when the binding can select no other overload for the
    arguments the host program passes: those are named by `op`'s schema, and every other overload
    requires an argument `op` does not have (`mm.dtype`'s `out_dtype`, `topk.values`'s `values`);
    given `out=`, a binding calls the out overload. Anything else keeps the `OpOverload`."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return op
    packet = op.overloadpacket
    names = {a.name for a in op._schema.arguments}
    # a binding given `out=` calls the out overload, never the default one
    selectable = set(packet.overloads()) - {op._overloadname, "default" if op._overloadname == "out" else ""}
    for other in selectable:
        schema = getattr(packet, other)._schema
        if all(
                a.name in names for a in schema.arguments if not a.has_default_value()):
            return op
    for module in _BINDINGS:
        binding = getattr(module, packet.__name__, None)
        if binding is not None:
            return binding
    return op


def link(program: HostProgram, kernels: dict, constants: dict, binds: dict | None = None):
    """Make the `call` function: the generated source with kernels, externs and constants bound."""
    import math
    env = {"torch": torch, "_empty": torch.empty_strided, "_restride": _restride, "_strides_differ": _strides_differ,
           "_one": _one, "_view": _view, "_index_error": _index_error, "_note_extern_error": _note_extern_error,
           "_keep": _KeptStorage().keep, "math": math}
    env.update(kernels)
    env.update({name: _binding(op) for name, op in program.externs})
    env.update(constants)
    env.update(binds or {})
    exec(compile(program.source, "<kiln host program>", "exec"), env)
    call = env["call"]
    call.host_source = program.source   # what it runs, for logs and tests
    call.boxed = env.get("_BOXED", False)
    return call
