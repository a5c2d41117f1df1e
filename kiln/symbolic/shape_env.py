"""The shape environment: symbols for dynamic sizes, what is known about them, and the guards.

A `ShapeEnv` owns
  * one sympy symbol per dynamic size (`create_symint`, or `FakeTensorMode.from_real` with
    `dynamic_dims`), each with its `Source` (which input, which dim) and its hint (the value seen
    while tracing). Sizes 0 and 1 are never symbols: they are specialized to plain ints, because
    so much code branches on them; every symbol is therefore known to be >= 2;
  * the facts: lower/upper bounds and replacements (s1 -> s0 after a guard `s0 == s1`), learnt
    from the guards and used to simplify expressions and to answer questions statically;
  * the guards: every time traced code branched on a symbolic value whose answer was not already
    known, a `Guard` records the assumption (a sympy boolean), the sources of its symbols and
    where it was raised (the user's line, and the kernel's line when C++ or a Python meta kernel
    asked).
It hands on `guard_function(*input_names)`: one generated Python function over the real inputs
that says whether a trace made under these guards may be reused for them.

[Note: unbacked sizes] Some sizes are known only when the program runs: the number of nonzero
elements (`nonzero`, `masked_select`, `x[mask]`), of distinct values (`unique`), a sum of repeats
(`repeat_interleave`), a number read from a tensor (`t.item()` used as a size; a bool read so is
`Eq(u, 1)` over a u in [0, 1]), the residuals of a least-squares solve that exist only for a
full-rank matrix (`linalg.lstsq`). For each such value `create_unbacked` makes a symbol named
u0, u1, ... (backed symbols are s0, s1, ...) with no hint and no source: no input holds it, so the
guard function can neither read nor check it, and a guard on it would pin the compiled program to
one count, a recompile per value. So the ShapeEnv never guards on an unbacked symbol:
  * a question the facts decide (u0 >= 0, u0 * 2 != -1) is answered as for any symbol, no guard;
  * torch's `guard_or_false` / `guard_or_true` (its meta kernels ask those where either answer is
    correct, e.g. "is this dim 1, so broadcast?") get their fallback: the general case;
  * `guard_size_oblivious` decides as if the size were >= 2 (a size 0 or 1 takes the general path);
  * `expect_true` (torch._check: a condition the op requires, u0 == s0 for `x[m] + y[m']`) is
    assumed: learnt as a fact (u1 -> s0 replacement) and kept in `runtime_asserts`, not a guard;
    a user's `torch._check(n >= 2)` / `torch._check_is_size(n)` is assumed so too, and capture puts
    the check in the graph to raise at run time ([Note: run-time checks] in kiln/capture);
  * anything else (`if n > 0:` on an unbacked n) raises `DataDependentGuard`, which capture turns
    into a graph break at the user's line.
The symbol is bound when the program runs: the op that made it is an extern of the generated host
program, which reads the symbol off its output's size (or takes the number itself), and later
kernels take it as a size argument like any other symbol (kiln/codegen/host.py). One compiled
program serves every count; a count of 0 or 1 is no special case.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import sys
import weakref
from typing import Any, Callable, Iterator, Sequence

import sympy
import torch

from kiln.errors import KilnError
from kiln.symbolic import sympy_ops as S
from kiln.symbolic.node import SymNode
from kiln.symbolic.torch_protocol import TorchHelperProtocol


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a symbol's value comes from: an int input, or a size/stride of a tensor input.

    `name` is the input's name as the caller knows it (capture passes its own source text, e.g.
    "L['x']"); `kind` is "int", "size" or "stride"; `dim` is the tensor dimension.
    """

    name: str
    kind: str = "int"
    dim: int | None = None

    def __str__(self) -> str:
        if self.kind == "int":
            return self.name
        return f"{self.name}.{self.kind}()[{self.dim}]"


@dataclasses.dataclass(frozen=True)
class Guard:
    """An assumption the trace made: `expr` (a sympy boolean) held for the traced inputs."""

    expr: sympy.Basic
    sources: tuple[Source, ...]
    user_location: str | None      # "file:line" in the user's program, when known
    kernel_location: str | None    # "file:line" of the kernel (C++ or Python) that branched

    def __str__(self) -> str:
        where = " ".join(x for x in (
            f"at {self.user_location}" if self.user_location else "",
            f"(kernel {self.kernel_location})" if self.kernel_location else "") if x)
        names = ", ".join(str(s) for s in self.sources)
        return f"{self.expr}  [{names}] {where}".rstrip()


class DataDependentGuard(KilnError):
    """Traced code branched on a value known only at run time ([Note: unbacked sizes])."""

    def __init__(self, expr: sympy.Basic, where: str | None = None):
        self.expr = expr
        super().__init__(
            f"the traced program branches on {expr}, which depends on the values in a tensor (a "
            f"count of nonzero elements, distinct values, or a number read with .item()); kiln "
            f"compiles one program for every such value, so it cannot take one branch"
            f"{f' (at {where})' if where else ''}. Capture breaks the graph here; to keep one "
            f"graph, write the condition without Python control flow (torch.where, torch._check).")


class GuardSourceError(KilnError):
    """guard_function was not given an input that one of the guards' symbols comes from."""


@dataclasses.dataclass(frozen=True)
class TensorInput:
    """The symbolic metadata of one tensor input, as `from_real` made it."""

    sizes: tuple[sympy.Basic, ...]
    strides: tuple[sympy.Basic, ...]
    storage_offset: sympy.Basic


_TORCH_DIR = os.path.dirname(torch.__file__)
_SYMBOLIC_DIR = os.path.dirname(__file__)
_KILN_DIR = os.path.dirname(_SYMBOLIC_DIR)
_SYM_WRAPPERS = (os.path.join("torch", "__init__.py"), "sym_node.py", "symbolic_shapes.py")


def _locate() -> tuple[str | None, str | None]:
    """(user's line, innermost Python kernel line in torch) from the current Python stack."""
    try:
        frame = sys._getframe(2)
    except ValueError:     # no Python frames that deep: autograd's device thread (a CUDA backward)
        frame = None
    kernel = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if frame.f_code.co_name == "__torch_dispatch__":   # a dispatch mode's frame: machinery
            frame = frame.f_back
            continue
        if filename.startswith("<eval_with_key>"):
            # an FX GraphModule's forward (a later stage tracing a captured graph): the node being
            # run says where in the user's program its op came from, when it kept a stack trace
            user = fx_node_location(frame)
            if user is not None:
                return user, kernel
        if filename.startswith(_TORCH_DIR):
            # torch's SymInt wrappers (torch/__init__.py, sym_node.py) only forward the question.
            if kernel is None and not filename.endswith(_SYM_WRAPPERS):
                kernel = f"{filename[len(_TORCH_DIR) - 5:]}:{frame.f_lineno}"
        elif not filename.startswith(_KILN_DIR) and "<frozen" not in filename:
            return f"{filename}:{frame.f_lineno}", kernel
        frame = frame.f_back
    return None, kernel


# generated forward code -> its GraphModule: reading `frame.f_locals` copies every local of the
# frame (a graph's forward has one per node), so a graph's module is read from its frame once
_MODULE_OF_CODE: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def fx_node_location(frame) -> str | None:
    """"file:line" from the `stack_trace` of the FX node whose generated line `frame` runs."""
    gm = _MODULE_OF_CODE.get(frame.f_code)
    if gm is None:
        gm = frame.f_locals.get("self")
        try:
            _MODULE_OF_CODE[frame.f_code] = gm
        except TypeError:      # not weakly referable: no module, or not one
            pass
    lines = getattr(gm, "_lineno_map", None)
    # the map counts lines from the prologue (`def forward(...)`), after the generated imports
    line = frame.f_lineno - getattr(gm, "_prologue_start", 0)
    if not lines or lines.get(line) is None:
        return None
    # the graph's nodes as a list, kept with the line map they index (a recompile makes a new map):
    # listing them on every lookup made a 32-layer model's trace quadratic (4 s of its compile)
    cached = gm.__dict__.get("_kiln_nodes_for_lines")
    if cached is None or cached[0] is not lines:
        cached = gm.__dict__["_kiln_nodes_for_lines"] = (lines, list(gm.graph.nodes))
    try:
        node = cached[1][lines[line]]
    except IndexError:
        return None
    trace = node.meta.get("stack_trace") or ""
    found = re.findall(r'File "(.+)", line (\d+), in (.+)', trace)
    # the innermost frame outside torch and kiln: the user's call of `nn.Embedding`, not its forward
    users = [f for f in found if not f[0].startswith((_TORCH_DIR, _KILN_DIR))] or found
    return f"{users[-1][0]}:{users[-1][1]} in {users[-1][2]}" if users else None


class ShapeEnv(TorchHelperProtocol):
    """Symbols for dynamic sizes, the facts known about them and the guards recorded on them."""

    def __init__(self) -> None:
        self.sources: dict[sympy.Symbol, Source] = {}
        self.hints: dict[sympy.Symbol, int] = {}
        self.lower: dict[sympy.Symbol, int] = {}
        self.upper: dict[sympy.Symbol, float] = {}
        self.replacements: dict[sympy.Symbol, sympy.Basic] = {}
        self._simplified: dict[sympy.Basic, sympy.Basic] = {}   # simplify's answers under these replacements
        self.divisors: dict[sympy.Symbol, int] = {}     # s -> d: guards say d divides s
        self.guards: list[Guard] = []
        self.unbacked: set[sympy.Symbol] = set()        # [Note: unbacked sizes]
        self.runtime_asserts: list[sympy.Basic] = []     # facts assumed of unbacked symbols
        self._oblivious = 0                              # inside `oblivious()`
        self.inputs: dict[str, TensorInput | sympy.Basic] = {}
        self._known: dict[sympy.Basic, bool] = {}
        self._static_cache: dict[sympy.Basic, Any] = {}
        self._user_location: list[str] = []
        # who is tracing may say where in the user's program it is (capture interprets bytecode,
        # so the Python stack shows kiln, not the user's line): () -> "file:line" | None
        self.locate: Callable[[], str | None] | None = None

    # --- symbols --------------------------------------------------------------------------
    def create_symbol(self, hint: int, source: Source) -> sympy.Basic:
        """A fresh symbol for a dynamic size seen as `hint`; 0 and 1 come back as constants."""
        if not isinstance(hint, int) or isinstance(hint, bool):
            raise TypeError(f"a symbolic size needs an int hint, got {hint!r} for {source}")
        if hint in (0, 1) or hint < 0:
            return sympy.Integer(hint)
        symbol = sympy.Symbol(f"s{len(self.sources)}", integer=True, positive=True)
        self.sources[symbol] = source
        self.hints[symbol] = hint
        self.lower[symbol] = 2
        self.upper[symbol] = math.inf
        return symbol

    def create_unbacked(self, size: bool = True, upper: int | float = math.inf) -> sympy.Symbol:
        """A fresh symbol for a value known only at run time ([Note: unbacked sizes]): no hint,
        no source. A size is >= 0 (not >= 2: a count may be 0 or 1), at most `upper` when the op
        bounds it (nonzero of n elements); a number read from a tensor (`size=False`) may be any int."""
        name = f"u{len(self.unbacked)}"
        symbol = sympy.Symbol(name, integer=True, nonnegative=True) if size else \
            sympy.Symbol(name, integer=True)
        self.unbacked.add(symbol)
        self.lower[symbol] = 0 if size else -math.inf
        self.upper[symbol] = upper
        return symbol

    def unbacked_symint(self, size: bool = True, upper: int | float = math.inf) -> torch.SymInt:
        return torch.SymInt(SymNode(self.create_unbacked(size, upper), self, int, None))

    def unbacked_symbool(self) -> torch.SymBool:
        """A bool read from a tensor: `Eq(u, 1)` over a fresh unbacked u in [0, 1]."""
        symbol = self.create_unbacked(size=False, upper=1)
        self.lower[symbol] = 0
        return torch.SymBool(SymNode(sympy.Eq(symbol, 1), self, bool, None))

    def has_unbacked(self, expr: sympy.Basic) -> bool:
        return bool(self.unbacked) and any(s in self.unbacked for s in sympy.sympify(expr).free_symbols)

    def create_symint(self, hint: int, source: str) -> torch.SymInt | int:
        """A SymInt for an int input named `source` (0 and 1 give plain ints)."""
        expr = self.create_symbol(hint, Source(source))
        self.inputs[source] = expr
        return self.to_symint(expr, hint)

    def to_symint(self, expr: sympy.Basic, hint: int | None) -> torch.SymInt | int:
        if expr.is_Integer:
            return int(expr)
        return torch.SymInt(SymNode(expr, self, int, hint))

    def symbol_of(self, value: torch.SymInt | int) -> sympy.Basic:
        """The expression of a SymInt made by this environment (an Integer for a plain int)."""
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.simplify(value.node.expr)
        return sympy.Integer(value)

    def hint_of(self, expr: sympy.Basic) -> Any:
        """The value of `expr` for the traced inputs; an unbacked symbol has none (raises)."""
        if self.has_unbacked(self.simplify(sympy.sympify(expr))):
            raise DataDependentGuard(expr)
        value = sympy.sympify(sympy.sympify(expr).xreplace(self.hints))
        if value is sympy.true or value is sympy.false:
            return bool(value)
        return int(value) if value.is_Integer else float(value)

    # --- simplification and static answers -----------------------------------------------
    def simplify(self, expr: sympy.Basic) -> sympy.Basic:
        """`expr` under the replacements learnt so far. Every new SymNode passes here (several per
        fake tensor made: its numel and contiguity), over a few hundred distinct expressions per
        graph, so answers are kept until the replacements change."""
        if not self.replacements:
            return expr
        done = self._simplified.get(expr)
        if done is None:
            done = expr if expr.is_number else expr.xreplace(self.replacements)
            self._simplified[expr] = done
        return done

    def static_value(self, expr: sympy.Basic) -> Any:
        """The value of `expr` if the facts decide it for every accepted input, else None."""
        expr = self.simplify(expr)
        if expr is sympy.true or expr is sympy.false:
            return bool(expr)
        if expr.is_Number:
            return int(expr) if expr.is_Integer else float(expr)
        if expr in self._known:
            return self._known[expr]
        if expr not in self._static_cache:
            self._static_cache[expr] = self._decide(expr)
        return self._static_cache[expr]

    def _shift(self, expr: sympy.Basic) -> sympy.Basic:
        """Write each symbol s as lower(s) + t with t >= 0, so sympy's sign rules see the bound;
        a symbol known divisible by d is written d * (ceil(lower / d) + t), so Mod and FloorDiv
        by d simplify too."""
        mapping = {}
        for symbol in expr.free_symbols:
            if symbol in self.lower and self.lower[symbol] != -math.inf:
                t = sympy.Symbol(f"t_{symbol}", integer=True, nonnegative=True)
                d = self.divisors.get(symbol, 1)
                mapping[symbol] = d * (-(-self.lower[symbol] // d) + t)
        return expr.xreplace(mapping)

    def _sign(self, difference: sympy.Basic) -> str | None:
        linear = self._linear_sign(difference)
        if linear is not None:
            return linear
        d = sympy.expand(self._shift(difference))
        if d.is_zero:
            return "zero"
        if d.is_positive:
            return "pos"
        if d.is_negative:
            return "neg"
        if d.is_nonnegative:
            return "nonneg"
        if d.is_nonpositive:
            return "nonpos"
        return None

    def _linear_sign(self, difference: sympy.Basic) -> str | None:
        """Sign of k*s + c over s's whole known range [lower, upper] (uses the upper bound)."""
        d = sympy.expand(difference)
        if len(d.free_symbols) != 1:
            return None
        (symbol,) = d.free_symbols
        if not d.is_polynomial(symbol) or sympy.degree(d, symbol) != 1:
            return None
        k, c = d.coeff(symbol), d.subs(symbol, 0)
        if not (k.is_Integer and c.is_Integer):
            return None
        ends = [int(k) * self.lower[symbol] + int(c), int(k) * self.upper[symbol] + int(c)]
        low, high = min(ends), max(ends)
        if low > 0:
            return "pos"
        if high < 0:
            return "neg"
        if low == high == 0:
            return "zero"
        if low == 0:
            return "nonneg"
        if high == 0:
            return "nonpos"
        return None

    def _decide(self, expr: sympy.Basic) -> Any:
        rule = _DECIDERS.get(type(expr))
        if rule is not None:
            return rule(self, expr)
        if isinstance(expr, sympy.Basic) and expr.free_symbols:
            # Rebuilding with shifted symbols lets sympy's constructors fold what the bounds
            # decide; no sympy.simplify, which can take seconds on a large expression.
            shifted = self._shift(expr)
            if shifted is sympy.true or shifted is sympy.false:
                return bool(shifted)
        return None

    # --- guards ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def user_location(self, where: str) -> Iterator[None]:
        """Attribute guards raised inside this block to the user's `where` ("file:line").

        Capture uses this: it interprets the user's bytecode, so the Python stack shows kiln.
        """
        self._user_location.append(where)
        try:
            yield
        finally:
            self._user_location.pop()

    def evaluate(self, node: SymNode, file: str = "", line: int = 0, fallback: Any = None) -> Any:
        """The value of `node` for the traced inputs; records a guard unless already known.
        On an unbacked symbol ([Note: unbacked sizes]) no guard: `fallback` if given, else
        DataDependentGuard."""
        expr = self.simplify(node.expr)
        value = self.static_value(expr)
        if value is not None:
            return value
        if node.hint is None or self.has_unbacked(expr):
            if fallback is not None:
                return fallback
            value = self._static_oblivious(expr) if self._oblivious else None
            if value is not None:
                return value
            raise DataDependentGuard(expr, self._where())
        if node.pytype is bool:
            fact = expr if node.hint else sympy.Not(expr)
        else:
            fact = sympy.Eq(expr, node.hint)
        self.add_guard(fact, f"{file}:{line}" if file else None)
        return node.hint

    def size_oblivious(self, node: SymNode) -> Any:
        """`guard_size_oblivious`: decided with every unbacked size taken as >= 2, so a count of 0
        or 1 follows the general path ([Note: unbacked sizes]); a guard where no symbol is unbacked."""
        value = self._static_oblivious(self.simplify(node.expr))
        return value if value is not None else self.evaluate(node)

    def _static_oblivious(self, expr: sympy.Basic) -> Any:
        """static_value with every unbacked size taken as >= 2."""
        unbacked = [s for s in expr.free_symbols if s in self.unbacked and self.lower[s] >= 0]
        if not unbacked:
            return self.static_value(expr)
        saved = {s: self.lower[s] for s in unbacked}
        self.lower.update({s: max(2, low) for s, low in saved.items()})
        self._static_cache.clear()
        try:
            return self.static_value(expr)
        finally:
            self.lower.update(saved)
            self._static_cache.clear()

    @contextlib.contextmanager
    def oblivious(self) -> Iterator[None]:
        """Answer questions on unbacked sizes as if each were >= 2, instead of raising.

        For code generation, after tracing: its questions are about layout and indexing ("is this
        buffer dense?", "is this stride 1?"), where a dim of size 0 or 1 is never read along, so the
        answer for sizes >= 2 holds for every size. Tracing never runs under it: there, a branch
        on a count is the user's, and must see every value."""
        self._oblivious += 1
        try:
            yield
        finally:
            self._oblivious -= 1

    def expect_true(self, node: SymNode) -> bool:
        """torch._check(cond): a condition the op requires. Over unbacked symbols it is assumed
        (learnt, listed in `runtime_asserts`); eager raises where it fails. Else a guard."""
        expr = self.simplify(node.expr)
        if self.static_value(expr) is None and self.has_unbacked(expr):
            self.runtime_asserts.append(expr)
            self._learn(expr)
            return True
        return bool(self.evaluate(node))

    def _where(self) -> str | None:
        user, _ = _locate()
        if self._user_location:
            return self._user_location[-1]
        if self.locate is not None:
            return self.locate() or user
        return user

    def add_guard(self, fact: sympy.Basic, kernel_location: str | None = None) -> None:
        """Record that `fact` must hold for the trace to be reused, and learn from it."""
        user, python_kernel = _locate()
        if self._user_location:
            user = self._user_location[-1]
        elif self.locate is not None:
            user = self.locate() or user
        sources = tuple(self.sources[s] for s in sorted(fact.free_symbols, key=_index))
        self.guards.append(Guard(fact, sources, user, kernel_location or python_kernel))
        self._learn(fact)

    def _learn(self, fact: sympy.Basic) -> None:
        self._static_cache.clear()
        self._known[fact] = True
        negation = sympy.Not(fact)
        self._known[negation] = False
        if isinstance(fact, sympy.And):
            for part in fact.args:
                self._learn(part)
            return
        if isinstance(fact, sympy.Eq):
            self._learn_divisor(fact)
            self._learn_equality(fact.lhs - fact.rhs)
        elif isinstance(fact, (sympy.Ge, sympy.Gt, sympy.Le, sympy.Lt)):
            self._learn_bound(fact)

    def _learn_divisor(self, fact: sympy.Eq) -> None:
        """From `s % d == 0` (s a symbol, d an int), remember that d divides s."""
        lhs, rhs = (fact.lhs, fact.rhs) if fact.rhs == 0 else (fact.rhs, fact.lhs)
        if rhs == 0 and isinstance(lhs, sympy.Mod):
            base, d = lhs.args
            if isinstance(base, sympy.Symbol) and d.is_Integer and d > 1:
                self.divisors[base] = math.lcm(self.divisors.get(base, 1), int(d))

    def _learn_equality(self, difference: sympy.Basic) -> None:
        """From `difference == 0`, replace the newest symbol it solves for (s1 -> s0, s0 -> 4);
        an unbacked one first (u0 -> s0): a backed symbol must stay readable from the inputs."""
        difference = sympy.expand(difference)
        order = sorted(difference.free_symbols, key=lambda s: (s in self.unbacked, _index(s)), reverse=True)
        for symbol in order:
            coefficient = difference.coeff(symbol)
            rest = difference - coefficient * symbol
            if coefficient in (1, -1) and symbol not in rest.free_symbols:
                value = sympy.expand(-rest / coefficient)
                self.replacements = {k: v.xreplace({symbol: value})
                                     for k, v in self.replacements.items()}
                self.replacements[symbol] = value
                self._simplified.clear()
                return

    def _learn_bound(self, fact: sympy.Basic) -> None:
        d = sympy.expand(fact.lhs - fact.rhs)       # fact says d REL 0
        if len(d.free_symbols) != 1:
            return
        (symbol,) = d.free_symbols
        if not d.is_polynomial(symbol) or sympy.degree(d, symbol) != 1:
            return
        k, c = d.coeff(symbol), d.subs(symbol, 0)
        if not (k.is_Integer and c.is_Integer):
            return
        strict = isinstance(fact, (sympy.Gt, sympy.Lt))
        greater = isinstance(fact, (sympy.Ge, sympy.Gt))
        if (k < 0):
            greater = not greater
        bound = -c / k                                 # symbol REL bound
        if greater:
            low = math.floor(bound) + 1 if strict else math.ceil(bound)
            self.lower[symbol] = max(self.lower[symbol], int(low))
        else:
            high = math.ceil(bound) - 1 if strict else math.floor(bound)
            self.upper[symbol] = min(self.upper[symbol], int(high))

    def format_guards(self) -> str:
        return "\n".join(str(g) for g in self.guards)

    # --- the guard function ---------------------------------------------------------------
    def guard_function(self, *names: str, checked=None) -> Callable[..., bool]:
        """One Python function `guard(*inputs) -> bool` over the real inputs named `names`.

        Tensor inputs (made by `from_real` with that source) are passed as tensors, int inputs
        (made by `create_symint`) as ints, in the order of `names`. It checks each tensor's rank,
        static sizes, strides and storage offset, binds every symbol from its source, and checks
        every recorded guard and every symbol's range. dtype, device and requires_grad are not
        shape facts: capture guards them. `checked` (name -> (sizes, strides)) names inputs whose
        static sizes and strides the caller compares already; those are not compared again. The
        generated source is the function's `.source`.
        """
        from kiln.symbolic.guard_codegen import build_guard_function

        return build_guard_function(self, names, checked)


def _index(symbol: sympy.Symbol) -> int:
    return int(symbol.name[1:])


def _relation(sign_ok: dict[str, bool]) -> Callable:
    """Decide a relation lhs REL rhs from the sign of lhs - rhs."""

    def decide(env: ShapeEnv, expr: sympy.Basic) -> bool | None:
        sign = env._sign(expr.lhs - expr.rhs)
        return sign_ok.get(sign) if sign is not None else None

    return decide


def _decide_and(env: ShapeEnv, expr) -> bool | None:
    values = [env.static_value(a) for a in expr.args]
    if False in values:
        return False
    return True if all(v is True for v in values) else None


def _decide_or(env: ShapeEnv, expr) -> bool | None:
    values = [env.static_value(a) for a in expr.args]
    if True in values:
        return True
    return False if all(v is False for v in values) else None


def _decide_not(env: ShapeEnv, expr) -> bool | None:
    value = env.static_value(expr.args[0])
    return None if value is None else not value


# Each relation is decided by the sign of lhs - rhs; a sign missing from a row leaves it open.
_DECIDERS: dict[type, Callable] = {
    sympy.Eq: _relation({"zero": True, "pos": False, "neg": False}),
    sympy.Ne: _relation({"zero": False, "pos": True, "neg": True}),
    sympy.Gt: _relation({"pos": True, "zero": False, "neg": False, "nonpos": False}),
    sympy.Ge: _relation({"pos": True, "zero": True, "nonneg": True, "neg": False}),
    sympy.Lt: _relation({"neg": True, "zero": False, "pos": False, "nonneg": False}),
    sympy.Le: _relation({"neg": True, "zero": True, "nonpos": True, "pos": False}),
    sympy.And: _decide_and,
    sympy.Or: _decide_or,
    sympy.Not: _decide_not,
}
