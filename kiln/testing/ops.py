"""The op families the program generator draws from: `FAMILIES[name] = (weight, make)`.

`make(gen)` looks at the generator's current values (real tensors, so shapes and dtypes are
exact) and proposes one step: `(lines, reads)`, Python lines binding fresh names, or None when no
value fits. A proposal need not be valid: the generator runs it eagerly and drops what eager
rejects, so a family may try a shape and let eager judge.
"""
from __future__ import annotations

import math

import torch

UNARY_FLOAT = ["torch.sin({a})", "torch.cos({a})", "torch.tanh({a})", "torch.sigmoid({a})", "torch.relu({a})",
               "torch.exp({a}.clamp(-4, 4))", "{a}.abs()", "-{a}", "torch.sqrt({a}.abs() + 0.1)",
               "torch.log1p({a}.abs())", "F.gelu({a})", "F.silu({a})", "{a}.clamp(-0.5, 0.5)", "{a} * {a}",
               "{a} ** 2", "torch.rsqrt({a}.abs() + 1)", "F.softplus({a})", "F.leaky_relu({a}, 0.1)",
               "torch.erf({a})", "torch.floor({a})", "torch.sign({a})", "F.elu({a})", "F.hardtanh({a})",
               "torch.atan({a})", "1 / ({a}.abs() + 1)", "{a} + 0.5", "{a} * -2.0", "{a} - 3", "{a} ** 3",
               "torch.round({a} * 2)", "{a}.clamp(min=0.1)", "torch.nan_to_num({a})", "F.hardswish({a})",
               "torch.trunc({a})", "{a}.frac()", "torch.expm1({a}.clamp(max=3))", "F.mish({a})"]
UNARY_INT = ["{a} + 1", "{a} * 2", "-{a}", "{a}.abs()", "{a} // 2", "{a} % 3", "{a}.clamp(0, 3)",
             "{a}.float()", "{a} > 1", "{a} * 0.5", "{a}.sign()", "{a} ** 2", "torch.bitwise_not({a})"]
UNARY_BOOL = ["~{a}", "{a}.float()", "{a}.long()", "{a}.logical_not()", "{a} + 1", "{a} * 1.5"]
TO_OTHER = ["{a} > 0", "({a} * 3).long()", "{a}.round().bool()", "{a}.isnan()", "{a} <= 0.5",
            "{a}.to(torch.int64)"]
BINARY_FLOAT = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / ({b}.abs() + 1)", "torch.maximum({a}, {b})",
                "torch.minimum({a}, {b})", "torch.where({a} > {b}, {a}, {b})", "torch.lerp({a}, {b}, 0.3)",
                "torch.addcmul({a}, {b}, {b}, value=0.5)", "{a} < {b}", "torch.eq({a}, {b})", "{a}.ge({b})",
                "torch.atan2({a}, {b})", "{a} * {b} + {a}", "torch.hypot({a}, {b})", "F.mse_loss({a}, {b})",
                "torch.copysign({a}, {b})", "torch.fmod({a}, {b}.abs() + 1)"]
BINARY_INT = ["{a} + {b}", "{a} * {b}", "torch.maximum({a}, {b})", "{a} & {b}", "{a} | {b}", "{a} ^ {b}",
              "{a} == {b}", "{a} - {b}", "{a} >= {b}", "torch.where({a} > {b}, {a}, {b})",
              "{a} // ({b}.abs() + 1)"]
BINARY_BOOL = ["{a} & {b}", "{a} | {b}", "{a} ^ {b}", "torch.logical_and({a}, {b})", "{a} == {b}"]
MIXED = ["{a} + {i}", "{a} * {i}", "{a} * {m}", "torch.where({m}, {a}, {b})", "torch.where({m}, {a}, 0.0)",
         "{a}.masked_fill({m}, -1.0)", "{i} + {m}", "{i} * 0.25 + {a}", "torch.where({m}, {i}, -{i})",
         "{a} / ({i}.abs() + 1)"]
REDUCE_FLOAT = ["{a}.sum({d}{k})", "{a}.mean({d}{k})", "{a}.amax({d}{k})", "{a}.amin({d}{k})",
                "torch.max({a}, {d}{k})[0]", "{a}.var({d}{k})", "{a}.std({d}{k})", "torch.logsumexp({a}, {d}{k})",
                "torch.softmax({a}, {d})", "torch.log_softmax({a}, {d})", "torch.cumsum({a}, {d})",
                "{a}.norm(dim={d}{k})", "{a}.sum()", "{a}.mean()", "{a}.prod({d}{k})", "{a}.argmax({d}{k})",
                "{a}.argmin()", "torch.sort({a}, {d})[0]", "{a}.amax()", "torch.var_mean({a}, {d}{k})[1]",
                "torch.cummax({a}, {d})[0]", "{a}.sum(dim=({d}, -1){k})", "torch.min({a}, {d}{k})[1]",
                "{a}.max()", "torch.special.entr({a}.abs())"]
REDUCE_INT = ["{a}.sum({d}{k})", "{a}.amax({d}{k})", "torch.cumsum({a}, {d})", "{a}.argmax({d}{k})",
              "{a}.sum()", "{a}.min()", "{a}.prod({d}{k})"]
REDUCE_BOOL = ["{a}.any({d}{k})", "{a}.all({d}{k})", "{a}.sum({d}{k})", "{a}.any()", "{a}.sum()"]


def _tensor(gen, kinds=("float", "int", "bool"), pred=lambda t: True):
    kinds = [k for k in kinds if gen.values(lambda t, k=k: _kind_of(t) == k and pred(t))]
    if not kinds:
        return None
    return gen.pick(gen.rng.choice(kinds), pred)


def _kind_of(t):
    from kiln.testing.programs import _kind
    return _kind(t)


def _step(gen, template: str, **names):
    out = gen.fresh()
    return [f"{out} = {template.format(**names)}"], list(names.values())


def unary(gen):
    a = _tensor(gen)
    if a is None:
        return None
    kind = _kind_of(gen.env[a])
    table = {"float": UNARY_FLOAT + TO_OTHER[: 2 + (gen.rng.random() < 0.3) * 4], "int": UNARY_INT,
             "bool": UNARY_BOOL}[kind]
    return _step(gen, gen.rng.choice(table), a=a)


def _partner(gen, a: str, kind: str) -> str:
    """A value broadcastable with `a`: an existing one, or a new input of a broadcasting shape."""
    shape = tuple(gen.env[a].shape)
    rng = gen.rng
    fits = gen.values(lambda t: _kind_of(t) == kind and _broadcasts(tuple(t.shape), shape))
    if fits and rng.random() < 0.7:
        return rng.choice(fits)
    new_shape = list(shape)
    for i in range(len(new_shape)):
        if rng.random() < 0.3:
            new_shape[i] = 1
    while new_shape and rng.random() < 0.3:
        new_shape.pop(0)
    dtype = {"float": _float_dtype(gen, a), "int": "int64", "bool": "bool"}[kind]
    return gen.new_input(tuple(new_shape), dtype)


def _float_dtype(gen, a: str) -> str:
    """The dtype of a new float input beside `a`: a's own under the GPU features (a `--half`
    program stays in half precision), else float32 ([Note: GPU features of the generator])."""
    t = gen.env[a]
    return str(t.dtype).removeprefix("torch.") if gen.gpu_features and t.is_floating_point() else "float32"


def _device(gen) -> str:
    """`, device=DEVICE` for a factory's call under the GPU features (the target's device)."""
    return ", device=DEVICE" if gen.gpu_features else ""


def _broadcasts(s1, s2) -> bool:
    try:
        torch.broadcast_shapes(s1, s2)
        return True
    except RuntimeError:
        return False


def binary(gen):
    a = _tensor(gen)
    if a is None:
        return None
    kind = _kind_of(gen.env[a])
    b = _partner(gen, a, kind)
    if gen.rng.random() < 0.5:
        a, b = b, a
    table = {"float": BINARY_FLOAT, "int": BINARY_INT, "bool": BINARY_BOOL}[kind]
    return _step(gen, gen.rng.choice(table), a=a, b=b)


def mixed(gen):
    a = _tensor(gen, ("float",))
    if a is None:
        return None
    i, m, b = _partner(gen, a, "int"), _partner(gen, a, "bool"), _partner(gen, a, "float")
    template = gen.rng.choice(MIXED)
    used = {k: v for k, v in dict(a=a, i=i, m=m, b=b).items() if "{" + k + "}" in template}
    return _step(gen, template, **used)


def reduction(gen):
    a = _tensor(gen, pred=lambda t: t.dim() > 0)
    if a is None:
        return None
    t = gen.env[a]
    table = {"float": REDUCE_FLOAT, "int": REDUCE_INT, "bool": REDUCE_BOOL}[_kind_of(t)]
    d = gen.rng.randrange(-t.dim(), t.dim())
    k = ", keepdim=True" if gen.rng.random() < 0.4 else ""
    return _step(gen, gen.rng.choice(table), a=a, d=str(d), k=k)


def _factor(n: int, parts: int, rng) -> list[int]:
    dims = [1] * parts
    for p in _prime_factors(n):
        dims[rng.randrange(parts)] *= p
    return dims


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def view(gen):
    a = _tensor(gen)
    if a is None:
        return None
    t, rng = gen.env[a], gen.rng
    n, dims = t.dim(), list(t.shape)
    d = rng.randrange(n) if n else 0
    options = [f"{a}.reshape({tuple(_factor(t.numel(), rng.randint(1, 4), rng))})",
               f"{a}.view({tuple(_factor(t.numel(), rng.randint(1, 3), rng))})", f"{a}.flatten()",
               f"{a}.unsqueeze({rng.randint(-n - 1, n)})", f"{a}[None]", f"{a}.clone()", f"{a}.contiguous()"]
    if n:
        s = dims[d]
        start, step = rng.randint(0, max(0, s - 1)), rng.choice([1, 1, 2, 3])
        options += [f"{a}.transpose({d}, {rng.randrange(n)})", f"{a}.permute({tuple(rng.sample(range(n), n))})",
                    f"{a}.flip({d})", f"{a}.roll({rng.randint(1, 3)}, {d})", f"{a}.narrow({d}, {start}, {s - start})",
                    f"{a}[{':, ' * d}{start}::{step}]", f"{a}[{':, ' * d}:0]", f"{a}.select({d}, {start})",
                    f"{a}.chunk(2, {d})[-1]", f"{a}.split(2, {d})[0]", f"torch.cat([{a}, {a}.flip({d})], {d})",
                    f"torch.stack([{a}, {a} * 2], {rng.randint(0, n)})", f"{a}.repeat({(2,) + (1,) * (n - 1)})",
                    f"{a}.movedim({d}, 0)", f"{a}.unflatten({d}, {tuple(_factor(s, 2, rng))})",
                    f"F.pad({a}, (1, 2))" if t.is_floating_point() else f"{a}.flip(0)",
                    f"{a}.unfold({d}, {min(2, s)}, 1)"]
        if 1 in dims:
            i = dims.index(1)
            big = list(dims)
            big[i] = rng.choice([2, 3, 4])
            options += [f"{a}.squeeze({i})", f"{a}.expand({tuple(big)})", f"{a}.expand({tuple(big)}) + 0"]
        options.append(f"{a}.expand({(rng.choice([2, 3]),) + tuple(dims)})")
    if n == 2:
        options += [f"{a}.t()", f"{a}.diagonal()", f"{a}.tril()", f"torch.triu({a}, 1)", f"{a}.mT"]
    if n >= 2:
        options.append(f"{a}.transpose(0, 1).reshape(-1)")
    if t.is_floating_point():
        options += [f"torch.zeros_like({a})", f"torch.ones({tuple(dims)}{_device(gen)}) * {a}.sum()", f"{a}.new_zeros((2, 3))"]
    return _step(gen, rng.choice(options).replace("{", "{{").replace("}", "}}"))


def _index_for(gen, n: int, shape) -> str:
    """An int64 index expression of `shape`, in [0, n): derived from a value, or an arange."""
    rng = gen.rng
    source = gen.values(lambda t: tuple(t.shape) == tuple(shape) and not t.is_floating_point())
    numel = math.prod(shape)
    if source and rng.random() < 0.5:
        return f"({rng.choice(source)}.long().abs() % {max(n, 1)})"
    return f"((torch.arange({numel}{_device(gen)}) * {rng.choice([1, 3, 7])} + {rng.randint(0, 5)}) % {max(n, 1)}).reshape({tuple(shape)})"


def indexing(gen):
    a = _tensor(gen, ("float",), lambda t: t.dim() > 0 and t.numel() > 0)
    if a is None:
        return None
    t, rng = gen.env[a], gen.rng
    n = t.dim()
    d = rng.randrange(n)
    s = t.shape[d]
    k = rng.randint(1, 5)
    idx1 = _index_for(gen, s, (k,))
    perm_src = f"{a}.detach()" if rng.random() < 0.5 else a
    options = [f"torch.index_select({a}, {d}, {idx1})", f"{a}[{idx1}]", f"{a}[{':, ' * d}{idx1}]",
               f"torch.gather({a}, {d}, {_index_for(gen, s, tuple(t.shape))})",
               f"{a}.scatter_add({d}, {_index_for(gen, s, tuple(t.shape))}, {a} * 2)",
               f"{a}.scatter({d}, torch.argsort({perm_src}, dim={d}, stable=True), {a} + 1)",
               f"{a}.index_add({d}, {idx1}, {a}.narrow({d}, 0, 1).expand({tuple(t.shape[:d]) + (k,) + tuple(t.shape[d + 1:])}))",
               f"{a}.index_put(({idx1},), {a}[0] * 0 + 1.0, accumulate=True)",
               f"{a}.masked_fill({a} > 0.5, 0.0)", f"{a}.take({_index_for(gen, t.numel(), (k,))})",
               f"torch.take_along_dim({a}, torch.argsort({perm_src}, dim={d}), {d})",
               f"F.embedding({_index_for(gen, s, (k, 2))}, {a}.reshape({s}, -1))" if d == 0 else f"{a}.flip({d})",
               f"{a}.scatter_reduce({d}, {_index_for(gen, s, tuple(t.shape))}, {a}, 'amax')",
               f"{a}.index_fill({d}, {idx1}, -2.0)"]
    return _step(gen, rng.choice(options).replace("{", "{{").replace("}", "}}"))


def matmul(gen):
    rng = gen.rng
    a = _tensor(gen, ("float",), lambda t: 1 <= t.dim() <= 4 and t.numel() > 0)
    if a is None:
        return None
    t, fd = gen.env[a], _float_dtype(gen, a)
    k = t.shape[-1]
    m = rng.choice([1, 2, 3, 4, 5])
    choice = rng.randrange(7 if t.dim() >= 2 else 3)
    if choice == 0:
        w = gen.new_input((k, m), fd)
        return _step(gen, "{a} @ {w}", a=a, w=w)
    if choice == 1:
        w, b = gen.new_input((m, k), fd), gen.new_input((m,), fd)
        return _step(gen, "F.linear({a}, {w}, {b})", a=a, w=w, b=b)
    if choice == 2:
        w = gen.new_input((m, k), fd)
        return _step(gen, "torch.matmul({a}, {w}.t())", a=a, w=w)
    if choice == 3 and t.dim() == 2:
        w, b = gen.new_input((k, m), fd), gen.new_input((m,), fd)
        return _step(gen, "torch.addmm({b}, {a}, {w}, beta=0.5)", a=a, w=w, b=b)
    if choice == 4:
        return _step(gen, "{a} @ {a}.transpose(-1, -2)", a=a)
    if choice == 5 and t.dim() == 3:
        w = gen.new_input((t.shape[0], k, m), fd)
        return _step(gen, "torch.bmm({a}, {w})", a=a, w=w)
    if t.dim() == 2:
        w = gen.new_input((k, m), fd)
        return _step(gen, "torch.einsum('ij,jk->ki', {a}, {w})", a=a, w=w)
    return None


def convolution(gen):
    rng = gen.rng
    a = _tensor(gen, ("float",), lambda t: t.dim() in (3, 4) and t.numel() > 0)
    if a is None:
        return None
    t, fd = gen.env[a], _float_dtype(gen, a)
    c, o = t.shape[1], rng.choice([1, 2, 3])
    ksz = rng.choice([1, 2, 3])
    pad, stride = rng.choice([0, 1]), rng.choice([1, 2])
    if t.dim() == 3:
        w = gen.new_input((o, c, ksz), fd)
        b = gen.new_input((o,), fd)
        options = [f"F.conv1d({{a}}, {{w}}, {{b}}, stride={stride}, padding={pad})",
                   f"F.max_pool1d({{a}}, {min(2, t.shape[-1])})", "F.avg_pool1d({a}, 1)"]
    else:
        w = gen.new_input((o, c, ksz, ksz), fd)
        b = gen.new_input((o,), fd)
        options = [f"F.conv2d({{a}}, {{w}}, {{b}}, stride={stride}, padding={pad})",
                   f"F.conv2d({{a}}, {{w}}, padding={pad})",
                   f"F.max_pool2d({{a}}, {min(2, t.shape[-1], t.shape[-2])})",
                   "F.avg_pool2d({a}, 1)", "F.adaptive_avg_pool2d({a}, 1)"]
    template = rng.choice(options)
    used = {kk: v for kk, v in dict(a=a, w=w, b=b).items() if "{" + kk + "}" in template}
    return _step(gen, template, **used)


def normalization(gen):
    rng = gen.rng
    a = _tensor(gen, ("float",), lambda t: t.dim() >= 1 and t.numel() > 0)
    if a is None:
        return None
    t = gen.env[a]
    last = t.shape[-1]
    choice = rng.randrange(5)
    if choice == 0:
        w, b = gen.new_input((last,), "float32"), gen.new_input((last,), "float32")
        return _step(gen, "F.layer_norm({a}, ({n},), {w}, {b})".replace("{n}", str(last)), a=a, w=w, b=b)
    if choice == 1:
        return _step(gen, f"F.normalize({{a}}, dim={rng.randrange(t.dim())})", a=a)
    if choice == 2 and t.dim() >= 2:
        c = t.shape[1]
        w, b = gen.new_input((c,), "float32"), gen.new_input((c,), "float32")
        rm = gen.new_input((c,), "float32", role="buffer", requires_grad=False, layout="contiguous")
        rv = gen.new_input((c,), "float32", role="buffer", requires_grad=False, layout="contiguous")
        out = gen.fresh()
        return ([f"{out} = F.batch_norm({a}, {rm}, {rv}.abs() + 0.5, {w}, {b}, training=True)"] if rng.random() < 0.3
                else [f"{out} = F.batch_norm({a}, {rm}, {rv}, {w}, {b}, training={rng.random() < 0.7})"]), [a, rm, rv, w, b]
    if choice == 3 and t.dim() >= 2:
        return _step(gen, "F.group_norm({a}, 1)", a=a)
    return _step(gen, f"F.rms_norm({{a}}, ({last},))", a=a)


def inplace(gen):
    """In-place ops and writes through views, on a fresh clone (safe for autograd) or on any
    value (left to eager to accept), or on an input that needs no grad (an input mutation)."""
    rng = gen.rng
    a = _tensor(gen, ("float", "int"), lambda t: t.numel() > 0)
    if a is None:
        return None
    t = gen.env[a]
    n = t.dim()
    float_ = t.is_floating_point()
    mode = rng.random()
    lines, reads = [], [a]
    if mode < 0.6:
        target = gen.fresh()
        lines.append(f"{target} = {a}.clone()")
    elif _overlaps(t):   # a write through a view whose elements share memory: undefined in eager
        return None
    else:
        target = a
    ops = [f"{target}.add_(1)", f"{target}.mul_(2)", f"{target}.clamp_(-1, 1)",
           f"{target}[{':, ' * (n - 1)}0] = 0" if n else f"{target}.fill_(3)",
           f"{target}.view(-1)[0:1].add_(5)" if n else f"{target}.add_(5)"]
    if float_:
        ops += [f"{target}.relu_()", f"{target}.sigmoid_()", f"{target}.mul_({target})",
                f"{target}.masked_fill_({target} > 0, 0.25)", f"{target}.zero_()"]
    if n >= 2:
        ops += [f"{target}.transpose(0, 1)[0].mul_(-1)", f"{target}[1:].copy_({target}[:-1].clone())"]
    if n:
        ops.append(f"{target}.select({rng.randrange(n)}, 0).fill_(7)")
    b = _partner(gen, a, "float" if float_ else "int")
    reads.append(b)
    ops += [f"{target}.add_({b})", f"{target}.copy_({b})" if tuple(gen.env[b].shape) == tuple(t.shape) else f"{target}.sub_({b})"]
    lines.append(rng.choice(ops))
    if rng.random() < 0.5:   # an alias that outlives the write
        alias = gen.fresh()
        lines.append(f"{alias} = {target}.view(-1)" if rng.random() < 0.5 else f"{alias} = {target} + 0")
    return lines, reads


def _overlaps(t: torch.Tensor) -> bool:
    from kiln.aot.trace import _overlaps as overlaps
    return overlaps(t)


def input_mutation(gen):
    cands = [i.name for i in gen.inputs if not i.requires_grad and i.layout != "expanded" and i.dtype != "bool"]
    if not cands:
        return None
    x = gen.rng.choice(cands)
    t = gen.env[x]
    ops = [f"{x}.add_(1)", f"{x}.mul_(2)", f"{x}.fill_(1)" if t.dim() == 0 else f"{x}[0] = 3"]
    out = gen.fresh()
    return [gen.rng.choice(ops), f"{out} = {x} * 2"], [x]


FAMILIES = {
    "unary": (10, unary), "binary": (10, binary), "mixed": (3, mixed), "reduction": (7, reduction),
    "view": (10, view), "indexing": (4, indexing), "matmul": (3, matmul), "convolution": (1.5, convolution),
    "normalization": (2, normalization), "inplace": (4, inplace), "input_mutation": (1, input_mutation),
}


def autocast(gen):
    """A matmul (and what follows it) in an autocast region of the target's device, in float16 or
    bfloat16, read back in float32 after it: the mixed-precision shape of a training step."""
    rng = gen.rng
    a = _tensor(gen, ("float",), lambda t: 1 <= t.dim() <= 3 and t.numel() > 0 and t.dtype == torch.float32)
    if a is None:
        return None
    k, m = gen.env[a].shape[-1], rng.choice([2, 3, 5, 7])
    w = gen.new_input((m, k), "float32", role="param" if gen.module else None)
    h, out = gen.fresh(), gen.fresh()
    dtype = rng.choice(["torch.bfloat16", "torch.float16"])
    after = rng.choice(["torch.relu({h}) + 1", "torch.softmax({h}, -1)", "F.gelu({h}) * {h}", "{h}.sum(-1)",
                        "F.layer_norm({h}, ({m},))".replace("{m}", str(m)), "{h} @ {h}.transpose(-1, -2)"])
    return ([f"with torch.autocast(DEVICE, dtype={dtype}):", f"    {h} = F.linear({a}, {w})",
             f"    {out} = {after.format(h=h)}", f"{gen.fresh()} = {out}.float() * 2"], [a, w])


def big_reduction(gen):
    """A reduction of at least 2**18 elements into few outputs: the GPU path splits it in two
    kernels ([Note: split reductions]); its input is new (no other step may grow that large)."""
    rng = gen.rng
    rows, cols = rng.choice([1024, 2048, 4096]), rng.choice([3, 17, 64, 129, 300])
    rows = max(rows, -(-(1 << 18) // cols) + rng.choice([0, 0, 1, 5]))
    dtype = rng.choice([d for d in gen.dtypes if d.startswith("float")])
    shape, dim = ((rows, cols), 0) if rng.random() < 0.5 else ((cols, rows), 1)
    a = gen.new_input(shape, dtype)
    template = rng.choice(["{a}.sum({d})", "{a}.mean({d})", "{a}.amax({d})", "({a} * {a}).sum({d})",
                           "{a}.abs().amin({d}, keepdim=True)", "({a} > 0).any({d})", "{a}.sum()",
                           "torch.relu({a}).sum({d}) / {n}".replace("{n}", str(rows))])
    return _step(gen, template, a=a, d=str(dim))


# Drawn only with `gpu_features` ([Note: GPU features of the generator]).
GPU_FAMILIES = {"autocast": (1.5, autocast), "big_reduction": (1, big_reduction)}
