"""How each reduction and scan of a stage prints, persistent or looped.

A `_Reducer` owns one `Accumulate` (or a Welford pair, or one `ScanAccumulate`) of a stage and
prints in three places: `init` before a looped stage's loop (chunk-wide accumulators), `update`
where the statement sits in the body (persistent: the whole row is there, so it reduces at once;
looped: fold the chunk into the accumulators), and `finish` after the loop (reduce the accumulators
across the chunk). After a reduction, `Var(name)` is a `[XBLOCK, 1]` column; inside a scan stage
it is the running value, `[XBLOCK, RBLOCK]`.

`SIMPLE` maps sum/prod/max/min/any/all to (elementwise fold, row reduce, identity); `plan(stage)`
picks a reducer per statement by op. Row reductions go through the `_k_r*` helpers of `ops`.
"""
from __future__ import annotations

import dataclasses

from typing import Callable

import torch

from kiln.codegen import ir
from kiln.codegen.triton import heuristics, ops
from kiln.codegen.triton.ops import Value

FULL = "[XBLOCK, RBLOCK]"


def _lowest(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return 'float("-inf")'
    return "0" if dtype == torch.bool else str(torch.iinfo(dtype).min)


def _highest(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return 'float("inf")'
    return "1" if dtype == torch.bool else str(torch.iinfo(dtype).max)


def _rmax(x: str, dtype: torch.dtype) -> str:
    return f"_k_rmax({x})" if dtype.is_floating_point else f"tl.reduce({x}, 1, tl.standard._elementwise_max)"


def _rmin(x: str, dtype: torch.dtype) -> str:
    return f"_k_rmin({x})" if dtype.is_floating_point else f"tl.reduce({x}, 1, tl.standard._elementwise_min)"


class Simple:
    def __init__(self, fold: str, reduce: Callable[[str, torch.dtype], str], identity: Callable):
        self.fold, self.reduce, self.identity = fold, reduce, identity


# op -> how to fold two values, reduce a row, and what a lane starts from
SIMPLE = {
    "sum": Simple("({0} + {1})", lambda x, d: f"tl.reduce({x}, 1, tl.standard._sum_combine)", lambda d: "0"),
    "prod": Simple("({0} * {1})", lambda x, d: f"tl.reduce({x}, 1, _k_prod)", lambda d: "1"),
    "max": Simple("_k_maximum({0}, {1})", _rmax, _lowest),
    "min": Simple("_k_minimum({0}, {1})", _rmin, _highest),
    "any": Simple("tl.maximum({0}, {1})", _rmax, lambda d: "0"),
    "all": Simple("tl.minimum({0}, {1})", _rmin, lambda d: "1"),
}


def _acc_dtype(op: str, dtype: torch.dtype) -> torch.dtype:
    if op in ("any", "all"):
        return torch.int8
    if dtype == torch.bool:
        return torch.int64 if op in ("sum", "prod") else torch.int8
    return ops.compute_dtype(dtype)


def _row_free(e: ir.ScalarExpr, p, assigns: dict) -> ir.ScalarExpr | None:
    """`e` with each whole-row `Var` replaced by the expression assigned to it, so it can be read
    again at other offsets; None if one is not an `Assign` of the kernel. Reduction results (one
    value a row) stay `Var`s."""
    if isinstance(e, ir.Var):
        if "r" not in p.vars[e.name].deps:
            return e
        return _row_free(assigns[e.name], p, assigns) if e.name in assigns else None
    if isinstance(e, ir.Op):
        args = [_row_free(a, p, assigns) for a in e.args]
        return None if any(a is None for a in args) else ir.Op(e.name, tuple(args), e.dtype)
    if isinstance(e, ir.Load) and e.indirect:
        subs = [(sym, _row_free(sub, p, assigns)) for sym, sub in e.indirect]
        return None if any(sub is None for _, sub in subs) else dataclasses.replace(e, indirect=tuple(subs))
    return e


def _assigned_before(kernel: ir.Kernel, stmt) -> dict[str, ir.ScalarExpr]:
    """Each name's latest `Assign` before `stmt`: later stages reuse names (BERT's embedding kernel
    assigns its stored sum and a later stage the sum reloaded, under one name)."""
    assigns = {}
    for s in (s for stage in kernel.stages for s in stage.body):
        if s is stmt:
            break
        if isinstance(s, ir.Assign):
            assigns[s.name] = s.expr
    return assigns


def _mask(p) -> str:
    return f"xmask & {p.rmask}{p.group}"


def _name(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


class _Reducer:
    def __init__(self, stmt, stage: ir.Stage):
        self.stmt = stmt
        self.stage = stage
        self.key = _name(stmt.name)

    def init(self, p) -> None:
        pass

    def finish(self, p) -> None:
        pass

    @staticmethod
    def block(value: Value, dtype: torch.dtype) -> str:
        """`value` as a full `[XBLOCK, RBLOCK]` block of `dtype` (masks select from it)."""
        text = value.text
        if ops.compute_dtype(value.dtype) != dtype:
            text = f"({text}).to({ops.tl_dtype(dtype)})"
        if value.deps != frozenset("xr"):
            text = f"(tl.full({FULL}, 0, {ops.tl_dtype(dtype)}) + {text})"
        return text


class SimpleReducer(_Reducer):
    def dtype(self) -> torch.dtype:
        return _acc_dtype(self.stmt.op, self.stmt.expr.dtype)

    def input(self, p) -> str:
        v = p.value(self.stmt.expr)
        if self.stmt.op in ("any", "all"):
            v = Value(f"({v.text} != 0)", v.deps, torch.bool)
        return self.block(v, self.dtype())

    def identity(self) -> str:
        """What a lane starts from. A max/min of bools accumulates in int8 but starts from False /
        True, not int8's extremes: an empty row's max is stored into a bool buffer, and -128 read
        as a bool is True (fuzz seed 200041 of --triton-interpret: `(x > 0).any()` of no elements)."""
        return SIMPLE[self.stmt.op].identity(torch.bool if self.stmt.expr.dtype == torch.bool else self.dtype())

    def publish(self, p, reduced: str) -> None:
        any_all = self.stmt.op in ("any", "all")
        p.out.line(f"v_{self.key} = {reduced}[:, None]" + (" != 0" if any_all else ""))
        p.vars[self.stmt.name] = Value(f"v_{self.key}", frozenset("x"),
                                       torch.bool if any_all else self.stmt.expr.dtype)

    def init(self, p) -> None:
        p.out.line(f"acc_{self.key} = tl.full({FULL}, {self.identity()}, {ops.tl_dtype(self.dtype())})")

    def update(self, p) -> None:
        rule = SIMPLE[self.stmt.op]
        value = self.input(p)
        if p.persistent:
            masked = p.out.let(f"tl.where({_mask(p)}, {value}, {self.identity()})")
            self.publish(p, rule.reduce(masked, self.dtype()))
            return
        acc = f"acc_{self.key}"
        p.out.line(f"{acc} = tl.where({_mask(p)}, {rule.fold.format(acc, value)}, {acc})")

    def finish(self, p) -> None:
        self.publish(p, SIMPLE[self.stmt.op].reduce(f"acc_{self.key}", self.dtype()))


class ArgReducer(_Reducer):
    """argmax/argmin over the flat reduction index; the first index wins ties, NaN is extreme."""

    def setup(self):
        dtype = _acc_dtype("max", self.stmt.expr.dtype)
        extreme = (_lowest if self.stmt.op == "argmax" else _highest)(dtype)
        return dtype, extreme, "_k_maximum" if self.stmt.op == "argmax" else "_k_minimum"

    def update(self, p) -> None:
        dtype, extreme, better = self.setup()
        v = self.block(p.value(self.stmt.expr), dtype)
        idx = f"tl.broadcast_to(rindex, {FULL})"
        k = self.key
        if p.persistent:
            vals = p.out.let(f"tl.where({_mask(p)}, {v}, {extreme})")
            self.publish(p, vals, idx)
            return
        # Per lane: take the first value seen, then only a strictly better one (or a first NaN),
        # so each lane keeps the earliest index of its extreme.
        p.out.line(f"new_{k} = {v}")
        p.out.line(f"take_{k} = {_mask(p)} & ((ai_{k} == 2147483647) | "
                   f"(({better}(av_{k}, new_{k}) != av_{k}) & (av_{k} == av_{k})))")
        p.out.line(f"ai_{k} = tl.where(take_{k}, {idx}, ai_{k})")
        p.out.line(f"av_{k} = tl.where(take_{k}, new_{k}, av_{k})")

    def init(self, p) -> None:
        dtype, extreme, _ = self.setup()
        p.out.line(f"av_{self.key} = tl.full({FULL}, {extreme}, {ops.tl_dtype(dtype)})")
        p.out.line(f"ai_{self.key} = tl.full({FULL}, 2147483647, tl.int32)")

    def finish(self, p) -> None:
        self.publish(p, f"av_{self.key}", f"ai_{self.key}")

    def publish(self, p, values: str, indices: str) -> None:
        helper = "_k_rargmax" if self.stmt.op == "argmax" else "_k_rargmin"
        p.out.line(f"v_{self.key} = {helper}({values}, {indices})[:, None].to(tl.int64)")
        p.vars[self.stmt.name] = Value(f"v_{self.key}", frozenset("x"), torch.int64)


class WelfordReducer(_Reducer):
    """welford_mean and welford_m2 of one expression, computed together.

    Persistent: the row is in registers; float32 statistics are reduced in the order of eager's CUDA
    layer_norm (`eager_order`), others in an exact two-pass mean and sum of squared deviations.
    Looped: per-lane Welford updates, combined across lanes after the loop (`_k_rwelford`).
    Known limit: a looped row holding +-inf gets a NaN mean (inf - inf in the update), where eager
    returns +-inf; the variance is NaN either way."""

    def __init__(self, stmt, stage):
        super().__init__(stmt, stage)
        self.mean: ir.Accumulate | None = None
        self.m2: ir.Accumulate | None = None

    def publish(self, p, mean: str, m2: str) -> None:
        for acc, text in ((self.mean, mean), (self.m2, m2)):
            if acc is not None:
                p.out.line(f"v_{_name(acc.name)} = {text}")
                p.vars[acc.name] = Value(f"v_{_name(acc.name)}", frozenset("x"), self.stmt.expr.dtype)

    def update(self, p) -> None:
        dtype = ops.compute_dtype(self.stmt.expr.dtype)
        rnumel = ir.product(p.groups[p.group])
        # rows eager's vectorized kernel takes (N % 4 == 0) and that fit in registers on 128 threads
        fits = not rnumel.is_Integer or (rnumel % 4 == 0 and rnumel <= heuristics.ROW_THREADS_MAX_RNUMEL)
        if p.persistent and dtype == torch.float32 and fits:
            expr = _row_free(self.stmt.expr, p, _assigned_before(p.kernel, self.stmt))
            if expr is not None:
                self.block(p.value(self.stmt.expr), dtype)   # the whole row's loads first, all in flight
                self.eager_order(p, expr)                    # then read again, from the cache
                return
        x = self.block(p.value(self.stmt.expr), dtype)
        k, mask, o = self.key, _mask(p), p.out
        if p.persistent:
            o.line(f"wmean_{k} = tl.reduce(tl.where({mask}, {x}, 0.0), 1, tl.standard._sum_combine)[:, None]"
                   f" / rnumel{p.group}")
            o.line(f"wdev_{k} = tl.where({mask}, {x} - wmean_{k}, 0.0)")
            o.line(f"wm2_{k} = tl.reduce(wdev_{k} * wdev_{k}, 1, tl.standard._sum_combine)[:, None]")
            self.publish(p, f"wmean_{k}", f"wm2_{k}")
            return
        o.line(f"wx_{k} = {x}")
        o.line(f"wn_{k} = wn_{k} + tl.where({mask}, 1.0, 0.0)")
        o.line(f"wdelta_{k} = wx_{k} - wmean_{k}")
        o.line(f"wmean_{k} = tl.where({mask}, wmean_{k} + wdelta_{k} / tl.where({mask}, wn_{k}, 1.0), wmean_{k})")
        o.line(f"wm2_{k} = tl.where({mask}, wm2_{k} + wdelta_{k} * (wx_{k} - wmean_{k}), wm2_{k})")

    def eager_order(self, p, expr: ir.ScalarExpr) -> None:
        """[Note: eager's layer_norm statistics] Eager's CUDA layer_norm (rows of N % 4 == 0) gives a
        row 128 threads: thread t runs an online Welford update over elements 4i .. 4i + 3 for
        i = t, t + 128, ... (float4 loads); each warp combines its lanes by shuffles down by 16, 8,
        4, 2, 1, and the four warps in a tree, 2 then 1 apart. A row held in registers is summed the
        same way here, so mean and m2 come out bit for bit as eager's
        (bench/results/diagnostics/20261201-145500_cuda_ln_probe.md found the order on the H200):

        - the statement's value is read again, 512 elements a step, and split so that lane t holds
          elements 4t .. 4t + 3 of the step, updated in that order. Values assigned earlier in the
          kernel are computed again from their expressions (`_row_free`): their `Var`s hold the row;
        - the 128 lanes are combined by one `tl.reduce` with eager's combine (`_k_ln_combine`). With
          one row a program on 4 warps (`ROW_THREADS`, which the launcher honours), lane t is thread
          t, and Triton's reduction, a butterfly of shuffles within each warp and then across the
          warps' partials, combines lane i with lane i + k in the same order as eager's tree:
          whatever lanes the result depends on, each pair is (lower, higher), as eager's is.

        On the H200 (bench/results/diagnostics/20261201-164100_cuda_ln_eager_order.md) this is eager's bits at every
        shape measured, and faster than eager on 8192 x 8192 float32 (0.20 ms against 0.22), but
        slower than the two-pass statistics, which are not eager's bits (0.135 ms there; 16384 x 2560
        bfloat16: 0.099 ms against eager's 0.074 and two-pass 0.060): the row is in registers on 4
        warps, so fewer rows are in flight than on 16. Not matched: a row eager's kernel cannot load
        as float4 (a misaligned view) takes eager's other kernel, whose order this is not."""
        k, o, g = self.key, p.out, p.group
        p.row_threads = 128
        space = p.index.spaces["r"]
        # The step's index and mask have names of their own: a loop may not change a variable's shape.
        lanes = dataclasses.replace(space, flat="lindex")
        lanes.per_dim_name = lambda d: f"l{d}_{g}"
        outer_cse, outer_stored = o.cse, p.stored
        o.cse, p.stored, p.index.spaces["r"], p.rmask = {}, {}, lanes, "lmask"
        for part in ("wmean", "wm2", "wn"):
            o.line(f"{part}_{k} = tl.full([XBLOCK, 128], 0, tl.float32)")
        o.line("wlane = tl.arange(0, 128)[None, :] * 4")
        o.line(f"for lbase in range(0, rnumel{g}, 512):")
        o.indent += 1
        o.line("lindex = lbase + tl.arange(0, 512)[None, :]")
        o.line(f"lmask{g} = lindex < rnumel{g}")
        start = len(o.lines)
        v = p.value(expr)
        x = v.text if ops.compute_dtype(v.dtype) == torch.float32 else f"({v.text}).to(tl.float32)"
        o.lines[start:start] = ["    " * o.indent + line.strip() for line in p._r_defs(lanes)]
        # [XBLOCK, 128, 2, 2]: (t, i, j) is element 4t + 2i + j of the step
        o.line(f"wx02_{k}, wx13_{k} = tl.split(tl.reshape({x}, [XBLOCK, 128, 2, 2]))")
        o.line(f"wx0_{k}, wx2_{k} = tl.split(wx02_{k})")
        o.line(f"wx1_{k}, wx3_{k} = tl.split(wx13_{k})")
        o.line("for lne in tl.static_range(4):")
        o.indent += 1
        o.line(f"wx_{k} = wx0_{k} if lne == 0 else (wx1_{k} if lne == 1 else (wx2_{k} if lne == 2 else wx3_{k}))")
        o.line(f"ok_{k} = xmask & (lbase + wlane + lne < rnumel{g})")
        o.line(f"wdelta_{k} = wx_{k} - wmean_{k}")
        # a lane that reads this element has read every one before it: its count is the same for
        # all of them, a scalar, and so is 1 / count (rounded once, as eager's division)
        o.line("wcount = (lbase // 128 + lne + 1) * 1.0")
        o.line(f"wmean1_{k} = tl.fma(wdelta_{k}, tl.div_rn(1.0, wcount), wmean_{k})")
        o.line(f"wm2_{k} = tl.where(ok_{k}, tl.fma(wdelta_{k}, wx_{k} - wmean1_{k}, wm2_{k}), wm2_{k})")
        o.line(f"wmean_{k} = tl.where(ok_{k}, wmean1_{k}, wmean_{k})")
        o.line(f"wn_{k} = tl.where(ok_{k}, wcount, wn_{k})")
        o.indent -= 2
        o.cse, p.stored, p.index.spaces["r"], p.rmask = outer_cse, outer_stored, space, "rmask"
        o.line(f"mean_{k}, m2_{k}, _ = tl.reduce((wmean_{k}, wm2_{k}, wn_{k}), 1, _k_ln_combine)")
        self.publish(p, f"mean_{k}[:, None]", f"m2_{k}[:, None]")

    def init(self, p) -> None:
        dtype = ops.tl_dtype(ops.compute_dtype(self.stmt.expr.dtype))
        for part in ("wmean", "wm2", "wn"):
            p.out.line(f"{part}_{self.key} = tl.full({FULL}, 0, {dtype})")

    def finish(self, p) -> None:
        k = self.key
        p.out.line(f"mean_{k}, m2_{k} = _k_rwelford(wmean_{k}, wm2_{k}, wn_{k})")
        self.publish(p, f"mean_{k}", f"m2_{k}")


# scan op -> (combine function for tl.associative_scan / tl.reduce, identity); Triton's own
# sum/prod combines are recognized (vectorized) by the interpreter.
SCANS = {
    "cumsum": ("tl.standard._sum_combine", lambda d: "0"),
    "cumprod": ("tl.standard._prod_combine", lambda d: "1"),
    "cummax": ("_k_maximum", _lowest),
    "cummin": ("_k_minimum", _highest),
    "logcumsumexp": ("_k_logaddexp", lambda d: 'float("-inf")'),
}
# How the carry (everything before a chunk) folds into a chunk's scan, elementwise.
SCAN_FOLD = {"cumsum": "({0} + {1})", "cumprod": "({0} * {1})", "cummax": "_k_maximum({0}, {1})",
             "cummin": "_k_minimum({0}, {1})", "logcumsumexp": "_k_logaddexp({0}, {1})"}


class ScanReducer(_Reducer):
    """An inclusive scan along the stage's (single) axis. Looped: each chunk is scanned, then
    combined with the carry (everything before the chunk), and the carry takes the chunk's total
    (the scan's last lane, read as a reduction of the masked chunk)."""

    def dtype(self) -> torch.dtype:
        return _acc_dtype("sum" if self.stmt.op in ("cumsum", "cumprod") else "max", self.stmt.expr.dtype)

    def update(self, p) -> None:
        combine, identity = SCANS[self.stmt.op]
        fold = SCAN_FOLD[self.stmt.op]
        ident = identity(self.dtype())
        k = self.key
        # Lanes past the row end hold the identity, so they never reach a real prefix.
        v = p.out.let(f"tl.where({_mask(p)}, {self.block(p.value(self.stmt.expr), self.dtype())}, {ident})")
        scan = f"tl.associative_scan({v}, 1, {combine})"
        if p.persistent:
            p.out.line(f"v_{k} = {scan}")
        else:
            p.out.line(f"v_{k} = {fold.format(f'carry_{k}', scan)}")
            p.out.line(f"carry_{k} = {fold.format(f'carry_{k}', f'tl.reduce({v}, 1, {combine})[:, None]')}")
        p.vars[self.stmt.name] = Value(f"v_{k}", frozenset("xr"), self.dtype())

    def init(self, p) -> None:
        _, identity = SCANS[self.stmt.op]
        p.out.line(f"carry_{self.key} = tl.full([XBLOCK, 1], {identity(self.dtype())}, {ops.tl_dtype(self.dtype())})")


def plan(stage: ir.Stage) -> list[_Reducer]:
    """One reducer per reduction/scan statement of `stage`; Welford halves of one expr share one."""
    out: list[_Reducer] = []
    welford: dict = {}
    for stmt in stage.body:
        if isinstance(stmt, ir.ScanAccumulate):
            if stmt.op not in SCANS:
                raise NotImplementedError(f"the Triton printer has no scan {stmt.op!r}; it prints {sorted(SCANS)}")
            out.append(ScanReducer(stmt, stage))
        elif isinstance(stmt, ir.Accumulate):
            if stmt.op in ("welford_mean", "welford_m2"):
                pair = welford.get(stmt.expr)
                if pair is None:
                    pair = welford[stmt.expr] = WelfordReducer(stmt, stage)
                    out.append(pair)
                setattr(pair, "mean" if stmt.op == "welford_mean" else "m2", stmt)
            elif stmt.op in ("argmax", "argmin"):
                out.append(ArgReducer(stmt, stage))
            elif stmt.op in SIMPLE:
                out.append(SimpleReducer(stmt, stage))
            else:
                raise NotImplementedError(f"the Triton printer has no reduction {stmt.op!r}; it prints "
                                          f"{sorted(SIMPLE) + ['argmax', 'argmin', 'welford_mean', 'welford_m2']}")
    return out
