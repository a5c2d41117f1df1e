"""max-autotune's matrix products and convolutions, timed: for each the extern call or a template tiling,
whichever the device runs fastest, remembered on disk so a warm start times nothing.

[Note: matmul autotuning] `matmul_templates.candidates` lists the ways to compute one product:
the extern call (cuBLAS through ATen) and a template kernel per tiling of the printer's
`matmul_configs`. `tune_matmuls` times them on the product's device, on random inputs of the
product's real sizes, strides and dtypes, and keeps the fastest:

- the extern: the graph's own call (`torch.ops.aten.mm/addmm/bmm`, or the convolution prim, ATen's
  convolution: cuDNN on a GPU; its arguments as the host program passes them, views included);
- a template: the kernel the scheduler makes of it, epilogue included. The graph is scheduled
  once with every product a template (the first tiling); the kernel that begins with the product
  is that product's template with the pointwise consumers that join it ([Note: matmul template
  epilogues] in scheduler.py). Each tiling is that kernel with its `MatmulConfig` replaced, built
  alone and launched on random buffers.

The epilogue rule: a template stores the epilogue's result; the extern leaves its result in memory
for a separate kernel to read back. So when the template kernel has an epilogue (it fuses more than
the product), the extern's time is the extern call plus an estimate of that kernel: one pass
(`copy_`, one launch) over the bytes it would move, the product's result read once, plus every
buffer the fused kernel reads or writes other than the operands, the addmm bias and the product's
own result (both paths pay those). The estimate is timed on the device like the rest and recorded
under "epilogue pass". With no epilogue the extern's time is the call alone.

The choice is kept in `kiln.runtime.store` (kind "autotune", `matmul-<hash of the key>.json`),
keyed by the device's name, the product (op, batch, M, N, K, the operands' sizes, strides and
dtypes, the bias, the precision; a convolution's stride and padding besides, its M and N its
GEMM's: [Note: convolution templates]), the printed source of its template kernel (which holds the
epilogue), the tilings offered, and the torch, triton and kiln versions (kiln's source hash
included). A second compile of the same product, in this process or another, reads the choice and
benchmarks nothing (`MatmulDecision.benchmarked == 0`). A candidate that fails to build or launch
(a tiling that needs more shared memory than the device has) is skipped with a warning.

Without a timer (Triton's interpreter on CPU tensors neither times nor autotunes: [Note: the Triton
interpreter switch]) the first tiling is kept, as before the autotuner, and the decision says so.
Tests inject a deterministic timer by replacing `device_timer`.

Status (2026-12-07): exercised under the interpreter with an injected timer (tests/codegen/
test_matmul_autotune.py); its GPU path (kiln's timer, compiled tilings, the new large tilings and
unmasked loads) has not yet run on a GPU: `python bench/matmul_template_probe.py --autotune` and
tests/codegen/test_gpu_matmul_autotune.py are the first things to run there.

Hands on: `tune_matmuls(graph, configs_for, timer=None) -> (graph, [MatmulDecision])`,
`device_timer(device)`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from typing import Callable, Mapping, Sequence

import sympy
import torch

from kiln import log
from kiln.codegen import ir
from kiln.codegen.matmul_padding import extern_name
from kiln.codegen.matmul_templates import (BIAS_AT, ConfigsFor, ExternChoice, MatmulChoice, candidates,
                                           first_template, use_matmul_templates)
from kiln.runtime import store

Timer = Callable[[Callable[[], None]], float]
EXTERN, EPILOGUE = "extern", "epilogue pass"


@dataclasses.dataclass(frozen=True)
class Trial:
    """One thing to time: `label` is "extern", "epilogue pass" or a tiling (`str(MatmulConfig)`),
    so a test's timer can answer by label."""

    label: str
    run: Callable[[], None]

    def __call__(self) -> None:
        self.run()


@dataclasses.dataclass
class MatmulDecision:
    """What the autotuner chose for one product, and why."""

    product: str                  # the product's buffer
    op: str                       # mm | addmm | bmm | convolution
    shape: str                    # "MxNxK", "BxMxNxK" for bmm, "NxCinxHxW * CoutxCinxKHxKW stride S padding P" for a convolution
    dtype: str
    epilogue: tuple[str, ...]     # the nodes fused after the product into its template kernel
    choice: str                   # "extern" or a tiling (`str(MatmulConfig)`)
    benchmarked: int              # candidates timed by this compile (0: the choice came from the cache)
    timings: dict                 # label -> ms (the extern's without the epilogue pass)
    how: str                      # "timed" | "cache" | "not timed: <why>" | "no template: <why>" (a convolution)

    def __str__(self):
        epi = f", epilogue {'+'.join(self.epilogue)}" if self.epilogue else ", no epilogue"
        head = (f"{self.product} = {self.op} {self.shape} {self.dtype}{epi}: "
                f"{'extern' if self.choice == EXTERN else 'template ' + self.choice} "
                f"({self.how}; {self.benchmarked} configurations benchmarked)")
        if not self.timings:
            return head
        extern = self.timings.get(EXTERN)
        parts = []
        if extern is not None:
            total = extern + self.timings.get(EPILOGUE, 0.0)
            parts.append(f"extern {extern:.4f} ms" + (f" + epilogue pass {self.timings[EPILOGUE]:.4f} = {total:.4f} ms"
                                                       if EPILOGUE in self.timings else ""))
        parts += [f"{label}: {ms:.4f} ms" for label, ms in self.timings.items() if label not in (EXTERN, EPILOGUE)]
        return head + "\n    " + "\n    ".join(parts)

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


def device_timer(device: str) -> Timer | None:
    """The timer for products on `device`: kiln's GPU timer on CUDA, none elsewhere."""
    if str(device).startswith("cuda"):
        from kiln.codegen.triton.autotune import gpu_timer
        return gpu_timer
    return None


def tune_matmuls(graph: ir.Graph, configs_for: ConfigsFor, timer: Timer | None = None
                 ) -> tuple[ir.Graph, list[MatmulDecision]]:
    """`graph` with each product the fastest of its candidates ([Note: matmul autotuning])."""
    buffers = graph.buffer_map()
    products = {}
    refused = []           # convolutions no template may compute, and why
    for node in graph.nodes:
        if isinstance(node, ir.ExternKernel) and extern_name(node) in BIAS_AT:
            choices = candidates(node, buffers, configs_for)
            if len(choices) > 1:
                products[node.outputs[0]] = choices
            elif extern_name(node) == "convolution":
                refused.append(_refused_convolution(node, buffers))
    if not products:
        if refused and log.enabled("kernels"):
            log.emit("kernels", "matmul autotune", "\n".join(map(str, refused)))
        return graph, refused
    from kiln.codegen.scheduler import schedule
    templated = use_matmul_templates(graph, configs_for)
    kernels = {k.origins[0]: k for k in schedule(templated).steps
               if isinstance(k, ir.Kernel) and k.template is not None}
    picked: dict[str, MatmulChoice] = {}
    decisions = []
    for out, choices in products.items():
        device = buffers[out].device
        decision, picked[out] = _decide(out, choices, kernels.get(out), buffers,
                                        timer if timer is not None else device_timer(device))
        decisions.append(decision)
    decisions += refused
    log.count("matmul configurations benchmarked", sum(d.benchmarked for d in decisions))
    if log.enabled("kernels"):
        log.emit("kernels", "matmul autotune", "\n".join(map(str, decisions)))

    def choose(choices: Sequence[MatmulChoice]) -> MatmulChoice:
        return picked.get(choices[0].node.outputs[0]) or first_template(choices)
    return use_matmul_templates(graph, configs_for, choose), decisions


def _refused_convolution(node: ir.ExternKernel, buffers: Mapping[str, ir.Buffer]) -> MatmulDecision:
    """The decision for a convolution no template may compute: the extern, and why ([Note:
    convolution templates] lists what is refused)."""
    from kiln.codegen.conv_templates import refusal

    def sizes(arg) -> str:
        view = arg if isinstance(arg, ir.ViewArg) else buffers[arg.name]
        return "x".join(map(str, view.sizes))
    out = node.outputs[0]
    why = refusal(node, buffers) or "the printer offers no tiling of its product"
    shape = f"{sizes(node.args[0])} * {sizes(node.args[1])}" if len(node.args) > 1 else ""
    return MatmulDecision(out, "convolution", shape, str(buffers[out].dtype).replace("torch.", ""), (), EXTERN, 0, {},
                          f"no template: {why}")


def _bias(node: ir.ExternKernel) -> ir.BufferArg | ir.ViewArg | None:
    """The extern's bias operand (addmm's, a convolution's), or None."""
    at = BIAS_AT[extern_name(node)]
    bias = node.args[at] if at is not None else None
    return bias if isinstance(bias, (ir.BufferArg, ir.ViewArg)) else None


def _gemm(product, sizes: list[int]) -> tuple[int, int, int]:
    """(batch, M, N) of the product whose result has `sizes`: a convolution's GEMM is N*Hout*Wout
    rows by Cout columns ([Note: convolution templates])."""
    if isinstance(product, ir.ConvProduct):
        batch, cout, hout, wout = sizes
        return 1, batch * hout * wout, cout
    *batch, m, n = sizes
    return (batch[0] if batch else 1), m, n


def _shape(product, sizes: list[int]) -> str:
    """The product's shape for the decision: "MxNxK", "BxMxNxK", or a convolution's operands."""
    if isinstance(product, ir.ConvProduct):
        image, weight = ("x".join(str(int(s)) for s in v.sizes) for v in (product.a, product.b))
        return f"{image} * {weight} stride {list(product.stride)} padding {list(product.padding)}"
    return "x".join(map(str, sizes[:-2] + sizes[-2:] + [int(product.k)]))


def _label(choice: MatmulChoice) -> str:
    return EXTERN if isinstance(choice, ExternChoice) else str(choice.product.config)


def _decide(out: str, choices: Sequence[MatmulChoice], kernel: ir.Kernel | None, buffers: Mapping[str, ir.Buffer],
            timer: Timer | None) -> tuple[MatmulDecision, MatmulChoice]:
    extern, templates = choices[0], list(choices[1:])
    node = extern.node
    op = extern_name(node)
    product = templates[0].product
    shape = _shape(product, [int(s) for s in buffers[out].sizes])
    epilogue = tuple(kernel.origins[1:]) if kernel is not None else ()
    decision = MatmulDecision(out, op, shape, str(buffers[out].dtype).replace("torch.", ""), epilogue,
                              _label(templates[0]), 0, {}, "")
    by_label = {_label(c): c for c in choices}
    if kernel is None:
        decision.how = "not timed: its template kernel was not found in the schedule"
        return decision, templates[0]
    key = _key(node, product, templates, kernel, buffers)
    name = "matmul-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32] + ".json"
    entry = store.read_json("autotune", name)
    if entry is not None and entry.get("key") == key and entry.get("choice") in by_label:
        decision.choice, decision.timings, decision.how = entry["choice"], entry.get("timings", {}), "cache"
        return decision, by_label[decision.choice]
    if timer is None:
        decision.how = f"not timed: no timer for {buffers[out].device} (Triton's interpreter neither times nor autotunes)"
        return decision, templates[0]
    if kernel.size_args:
        decision.how = "not timed: its epilogue has symbolic sizes"
        return decision, templates[0]
    timings = _time(node, templates, kernel, buffers, timer)
    decision.benchmarked = sum(1 for label in timings if label != EPILOGUE)
    decision.timings = timings
    totals = {label: ms + (timings.get(EPILOGUE, 0.0) if label == EXTERN else 0.0)
              for label, ms in timings.items() if label != EPILOGUE}
    if not totals:
        decision.choice, decision.how = EXTERN, "every candidate failed to run: the extern kept"
        return decision, extern
    decision.choice = min(totals, key=totals.get)     # ties: the extern (listed first)
    decision.how = "timed"
    store.write_json("autotune", name, {"key": key, "choice": decision.choice, "timings": timings})
    return decision, by_label[decision.choice]


def _key(node: ir.ExternKernel, product: ir.MatmulProduct, templates: Sequence[ir.MatmulTemplate],
         kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer]) -> dict:
    """The cache key ([Note: matmul autotuning]): JSON data, readable in the entry."""
    import triton
    from kiln.codegen.triton.launcher import KernelSpec
    from kiln.runtime.cache import versions
    out = buffers[kernel.origins[0]]
    device = str(out.device)
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else f"{device} (interpreter)"
    bias = _bias(node)

    def view(v) -> list:
        if isinstance(v, ir.BufferArg):
            b = buffers[v.name]
            v = ir.ViewArg(v.name, b.sizes, b.strides, b.offset)
        return [[int(s) for s in v.sizes], [int(s) for s in v.strides], str(buffers[v.name].dtype)]
    batch, m, n = _gemm(product, [int(s) for s in out.sizes])
    conv = {"stride": list(product.stride), "padding": list(product.padding)} if isinstance(product, ir.ConvProduct) else {}
    return {"device": name, "op": extern_name(node), "batch": batch, "M": m, "N": n,
            "K": int(product.k), "a": view(product.a), "b": view(product.b), **conv,
            "bias": view(bias) if bias is not None else None,
            "out": str(out.dtype), "precision": product.precision,
            "kernel": hashlib.sha256(KernelSpec.of(kernel, buffers).source.encode()).hexdigest()[:32],
            "tilings": [str(t.product.config) for t in templates],
            "versions": f"{versions()} triton={triton.__version__}"}


class _RandomBuffers:
    """Each buffer as one flat tensor of random values on its device, from its storage's start
    (views index into it with their own offsets, as a kernel does)."""

    def __init__(self, buffers: Mapping[str, ir.Buffer]):
        self.buffers, self.flat = buffers, {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.flat:
            b = self.buffers[name]
            extent = int(b.offset) + sum((int(s) - 1) * int(st) for s, st in zip(b.sizes, b.strides)) + 1
            g = torch.Generator(device=b.device).manual_seed(0)
            if b.dtype.is_floating_point:
                t = torch.randn(extent, generator=g, device=b.device).to(b.dtype)
            else:
                t = torch.zeros(extent, dtype=b.dtype, device=b.device)
            self.flat[name] = t
        return self.flat[name]

    def view(self, arg) -> torch.Tensor:
        b = self.buffers[arg.name]
        if isinstance(arg, ir.BufferArg):
            return self[arg.name].as_strided([int(s) for s in b.sizes], [int(s) for s in b.strides], int(b.offset))
        return self[arg.name].as_strided([int(s) for s in arg.sizes], [int(s) for s in arg.strides],
                                         int(b.offset) + int(arg.offset))

    def literal(self, v):
        if isinstance(v, (ir.BufferArg, ir.ViewArg)):
            return self.view(v)
        if isinstance(v, (list, tuple)):
            return type(v)(self.literal(x) for x in v)
        return v


def _time(node: ir.ExternKernel, templates: Sequence[ir.MatmulTemplate], kernel: ir.Kernel,
          buffers: Mapping[str, ir.Buffer], timer: Timer) -> dict[str, float]:
    """ms by label: the extern, the epilogue pass (when the template kernel has an epilogue), each tiling."""
    from kiln.codegen.triton import launcher
    data = _RandomBuffers(buffers)
    args = [data.literal(a) for a in node.args]
    kwargs = {k: data.literal(v) for k, v in node.kwargs}

    def extern() -> None:
        with torch.no_grad():
            node.op(*args, **kwargs)
    trials = [Trial(EXTERN, extern)]
    if len(kernel.origins) > 1:
        trials.append(Trial(EPILOGUE, _epilogue_pass(node, kernel, buffers)))
    variants = [dataclasses.replace(kernel, name=f"{kernel.name}_tiling{i}",
                                    template=dataclasses.replace(kernel.template, config=t.product.config))
                for i, t in enumerate(templates)]
    try:
        built = launcher.build(variants, buffers)       # compiled in parallel
    except Exception:  # noqa: BLE001 - one tiling's failure is found again below, alone
        built = {}
    for variant, template in zip(variants, templates):
        def run(variant=variant) -> None:
            fn = built.get(variant.name) or launcher.build([variant], buffers)[variant.name]
            built[variant.name] = fn
            fn(*(data[b] for b in variant.buffer_args))
        trials.append(Trial(str(template.product.config), run))
    timings = {}
    for trial in trials:
        try:
            timings[trial.label] = float(timer(trial))
        except Exception as e:  # noqa: BLE001 - a tiling that does not fit the device
            warnings.warn(f"kiln matmul autotune: {node.outputs[0]} ({trial.label}) failed "
                          f"({type(e).__name__}: {str(e)[:200]}); the other candidates are compared")
    return timings


def _epilogue_pass(node: ir.ExternKernel, kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer]) -> Callable[[], None]:
    """A stand-in for the epilogue kernel the extern would leave ([Note: matmul autotuning]): one
    copy moving the bytes that kernel would move."""
    product = kernel.template
    shared = {product.a.name, product.b.name, kernel.origins[0]}
    if _bias(node) is not None:
        shared.add(_bias(node).name)

    def nbytes(b: ir.Buffer) -> int:
        return int(sympy.Mul(*b.sizes)) * b.dtype.itemsize
    moved = nbytes(buffers[kernel.origins[0]]) + sum(nbytes(buffers[b]) for b in kernel.buffer_args if b not in shared)
    device = buffers[kernel.origins[0]].device
    src = torch.empty(max(1, moved // 2), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)
