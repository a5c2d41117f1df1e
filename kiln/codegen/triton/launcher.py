"""Printed Triton kernels to callables the host program launches.

`build(kernels, buffers)` prints each kernel, loads its source through the on-disk cache, and
returns `{kernel.name: TritonKernel}`. A `TritonKernel` is called as the loop IR's printer
interface says: `fn(*tensors_for(kernel.buffer_args), *ints_for(kernel.size_args))`. On the first
call with given size ints it makes a `_Plan`: `xnumel`/`rnumel`s from the sizes, a `LaunchConfig`
(the heuristic, or the autotuner's choice under max-autotune), the persistent or looped function,
the grid (`ceil(xnumel / XBLOCK)` programs) and the index dtype (int64 only when a buffer spans
2**31 elements); later calls with those sizes only look the plan up and launch.

CUDA kernels compile in parallel inside `build` (`precompile`, in worker processes when there are
many: [Note: compile workers] in compile_pool.py), for the sizes of the call being compiled: a
kernel of symbolic sizes for its `first_sizes`, the sizes that call binds its symbols to. Its size
arguments are unspecialized ([Note: symbolic sizes are not specialized] in printer.py), so that
binary serves every later size whose launch config is the same; a size that picks another config
compiles at its first launch. Triton caches the binaries on disk, and a warm start loads a static
kernel's binary from where kiln's cache entry says Triton filed it ([Note: warm binaries]).
"""
from __future__ import annotations

import contextlib

import concurrent.futures
import dataclasses
import functools
import operator
import os
import re
import time
import warnings
import weakref
from typing import Callable, Iterator, Mapping, Sequence

import sympy
import torch
import triton
import triton.language as tl

from kiln import log
from kiln.codegen import ir
from kiln.codegen.indexing import Max
from kiln.codegen.triton import binaries, compile_pool, heuristics
from kiln.codegen.triton.heuristics import LaunchConfig
from kiln.codegen.triton.libdevice import link_options
from kiln.codegen.triton.printer import KernelLayout, canonical, layout_of, print_canonical
from kiln.codegen.triton.source_cache import load_module


def _sizes_function(layout: KernelLayout, extent: sympy.Expr) -> Callable[..., tuple[int, ...]]:
    """A Python function from size ints to (xnumel, *rnumels, extent), printed once from sympy."""
    return _numels_function([s.name for s in layout.size_args], [_py(e) for e in (layout.xnumel, *layout.rnumels, extent)])


def _numels_function(args: Sequence[str], exprs: Sequence[str]) -> Callable[..., tuple[int, ...]]:
    text = f"def numels({', '.join(args)}):\n    return ({', '.join(exprs)},)\n"
    scope: dict = {}
    exec(compile(text, "<kiln numels>", "exec"), scope)
    return scope["numels"]


def _py(e) -> str:
    from kiln.codegen.host import py_index   # integer Python: floor(a/b) prints as a // b
    return py_index(e)


def _extent(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer]) -> sympy.Expr:
    """One past the largest element offset any buffer of the kernel can reach."""
    ends = []
    for name in kernel.buffer_args:
        buf = buffers.get(name)
        if buf is None:
            continue
        end = ir.as_expr(buf.offset) + 1
        for size, stride in zip(buf.sizes, buf.strides):
            end = end + (ir.as_expr(size) - 1) * sympy.Abs(ir.as_expr(stride))
        # A size the kernel is not passed cannot be evaluated at launch; such a buffer is reached
        # only through indices of passed sizes or loaded values (gathers), so it is left out.
        if end.free_symbols <= set(kernel.size_args):
            ends.append(end)
    # kiln's Max: sympy's ordered these symbolic extents pairwise at ~3 ms a comparison (2 s of
    # printing a decode step's kernels on the H200); it is evaluated at launch anyway
    return Max(*ends) if len(ends) > 1 else (ends[0] if ends else sympy.Integer(1))   # [Note: clamps that do not compare]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything a call with given sizes needs, computed on the first call with those sizes."""

    numels: tuple[int, ...]
    config: LaunchConfig
    fn: object
    grid: tuple[int]
    index_dtype: object
    sizes: tuple[int, ...] = ()        # the size ints it is for (passed before the numels)


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """What launching one printed kernel needs, as plain data: the warm-start cache keeps it as JSON
    (`saved`), so a second process launches it without lowering anything or deserializing objects."""

    name: str = dataclasses.field(compare=False)   # the layout's name (logs, bandwidth reports)
    function: str                  # the printed function (`<function>_looped`: the looped form)
    source: str
    interpret: bool
    kind: str                      # "pointwise" | "reduction" | "scan"
    rows_contiguous: bool
    size_args: tuple[str, ...]
    numels: tuple[str, ...]        # Python over size_args: xnumel, *rnumels, extent
    arg_dtypes: tuple[str, ...]    # of the buffer arguments, as `str(torch.dtype)`
    written: tuple[int, ...]       # buffer arguments the kernel stores to (autotune clones them)

    @staticmethod
    def of(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer]) -> "KernelSpec":
        interpret = interpret_for(kernel, buffers)
        printed, printed_buffers = canonical(kernel, buffers)
        layout = layout_of(kernel)
        stored = {s.buffer for stage in kernel.stages for s in stage.body if isinstance(s, ir.Store)}
        return KernelSpec(
            name=layout.name, function=printed.name, source=print_canonical(printed, printed_buffers, interpret),
            interpret=interpret, kind=layout.kind, rows_contiguous=layout.rows_contiguous,
            size_args=tuple(s.name for s in layout.size_args),
            numels=tuple(_py(e) for e in (layout.xnumel, *layout.rnumels, _extent(kernel, buffers))),
            arg_dtypes=tuple(str(buffers[b].dtype if b in buffers else torch.float32) for b in kernel.buffer_args),
            written=tuple(i for i, b in enumerate(kernel.buffer_args) if b in stored))

    @staticmethod
    def from_json(value: dict) -> "KernelSpec":
        return KernelSpec(**{f.name: tuple(value[f.name]) if isinstance(value[f.name], list) else value[f.name]
                             for f in dataclasses.fields(KernelSpec)})


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


# Every kernel built in this process, for diagnostics (`bandwidth` lists their launch configs).
BUILT: "weakref.WeakSet[TritonKernel]" = weakref.WeakSet()


class TritonKernel:
    """One printed kernel, callable as `kernel(*tensors, *size_ints)`."""

    def __init__(self, spec: KernelSpec, autotune: bool = False, first_sizes: Sequence[int] | None = None):
        self.spec = spec
        self.layout = spec                  # name, kind, rows_contiguous, size_args
        self.source = spec.source
        self.interpret = spec.interpret
        module = load_module(spec.source, spec.interpret)
        self.path = module.__file__
        self.function = spec.function
        self.persistent_fn = getattr(module, self.function)
        self.looped_fn = getattr(module, f"{self.function}_looped", None)
        self.row_threads = getattr(module, "ROW_THREADS", None)
        self.template = getattr(module, "MATMUL_CONFIG", None)   # a template kernel's tiling
        self.attention = getattr(module, "ATTENTION_CONFIG", None)   # an attention template's
        self.sizes_to_numels = _numels_function(spec.size_args, spec.numels)
        self.link = {} if spec.interpret else link_options()   # [Note: libdevice]
        self.n_buffers = len(spec.arg_dtypes)
        self.arg_dtypes = [_dtype(d) for d in spec.arg_dtypes]
        self.autotune = autotune
        self.configs: dict[tuple, LaunchConfig] = {}     # numels -> config (autotune or heuristic)
        self.plans: dict[tuple, _Plan | None] = {}        # size ints -> plan (None: nothing to do)
        self.direct: dict[tuple, _DirectLaunch] = {}      # size ints -> [Note: direct launch]
        self.warmed = None        # what `warmup` got from Triton (a CompiledKernel, or its future)
        self.prebuilt = None      # the static plan's CompiledKernel from a record ([Note: warm binaries])
        # the size ints of the launch `precompile` compiles for: none for static sizes, the compiling
        # call's for symbolic ones (None: not known, as for an unbacked size; compiled at launch)
        self.first_sizes = () if not spec.size_args else (tuple(first_sizes) if first_sizes is not None else None)
        BUILT.add(self)

    def __repr__(self):
        return f"TritonKernel({self.layout.name}, {self.layout.kind}, source={self.path})"

    def numels(self, *sizes: int) -> tuple[int, ...]:
        """(xnumel, *rnumels) for these size ints."""
        return tuple(self.sizes_to_numels(*sizes)[:-1])

    def config_for(self, numels: tuple[int, ...], args: Sequence) -> LaunchConfig:
        config = self.configs.get(numels)
        if config is None:
            xnumel, rnumel = numels[0], max(numels[1:], default=1)
            if self.template is not None:     # [Note: a template launches as a kernel of its programs]
                config = heuristics.template_launch(self.template)
            elif self.attention is not None:
                from kiln.codegen.triton.attention import launch
                config = launch(self.attention)
            elif self.autotune and not self.interpret:
                from kiln.codegen.triton.autotune import tune
                config = tune(self, numels, args)
            else:
                config = heuristics.choose(self.layout.kind, xnumel, rnumel, self.layout.rows_contiguous)
            config = heuristics.pin_row_threads(config, rnumel, self.row_threads)
            self.configs[numels] = config
        return config

    def plan(self, sizes: tuple, args: Sequence) -> _Plan | None:
        *numels, extent = self.sizes_to_numels(*sizes)
        numels = tuple(numels)
        if numels[0] == 0:
            return None         # no outputs; a reduction over nothing still runs (identities)
        config = self.config_for(numels, args)
        rnumel = max(numels[1:], default=1)
        persistent = self.looped_fn is None or (config.persistent and config.RBLOCK >= rnumel)
        big = extent >= 2 ** 31 or numels[0] + config.XBLOCK >= 2 ** 31
        return _Plan(numels, config, self.persistent_fn if persistent else self.looped_fn,
                     ((numels[0] + config.XBLOCK - 1) // config.XBLOCK,), tl.int64 if big else tl.int32, tuple(sizes))

    def launch(self, config: LaunchConfig, args: Sequence, numels: tuple[int, ...]) -> None:
        """One launch with an explicit config (autotune's timing, tests)."""
        rnumel = max(numels[1:], default=1)
        persistent = self.looped_fn is None or (config.persistent and config.RBLOCK >= rnumel)
        fn = self.persistent_fn if persistent else self.looped_fn
        grid = ((numels[0] + config.XBLOCK - 1) // config.XBLOCK,)
        fn[grid](*args, *numels, XBLOCK=config.XBLOCK, RBLOCK=config.RBLOCK, INDEX_DTYPE=tl.int32,
                 num_warps=config.num_warps, num_stages=config.num_stages, **self.link)

    @property
    def static(self) -> bool:
        """A CUDA kernel whose sizes are all static, whose binary a warm start loads ([Note: warm binaries])."""
        return not self.interpret and not self.layout.size_args and not self.autotune

    @property
    def precompiled(self) -> bool:
        """A CUDA kernel whose first launch's sizes are known, compiled before that launch."""
        return not self.interpret and not self.autotune and self.first_sizes is not None

    def first_plan(self) -> _Plan | None:
        """The plan of the first launch (`first_sizes`), made now and kept for that launch."""
        plan = self.plans[self.first_sizes] = self.plan(self.first_sizes, ())
        return plan

    def warmup(self) -> None:
        """Compile the first launch's binary (`first_sizes`), without launching."""
        plan = self.first_plan()
        if plan is not None:
            self.warmed = warm(plan, self.arg_dtypes, self.link)

    def compile_job(self) -> "compile_pool.CompileJob | None":
        """What a compile worker needs to file `warmup`'s binary where `warmup` will look for it
        ([Note: compile workers]); None when there is nothing to launch."""
        from triton.runtime import driver
        plan = self.first_plan()
        if plan is None:
            return None
        target = driver.active.get_current_target()
        return compile_pool.CompileJob(
            source=self.source, interpret=self.interpret, function=plan.fn.__name__,
            arg_dtypes=tuple(str(d) for d in self.arg_dtypes), sizes=plan.sizes, numels=tuple(plan.numels),
            grid=tuple(plan.grid),
            config=plan.config, index_dtype=plan.index_dtype.name, link=dict(self.link),
            target=(target.backend, target.arch, target.warp_size), cache_dir=triton.knobs.cache.dir,
            debug=bool(plan.fn.debug or triton.knobs.runtime.debug),
            instrumentation_mode=triton.knobs.compilation.instrumentation_mode, env=binaries._env())

    def load_binary(self, record: dict) -> bool:
        """Take the first launch's binary from `record` (`binary_record`'s, in an earlier process)
        instead of `warmup`: whether it could ([Note: warm binaries])."""
        plan = self.plans[()] = self.plan((), ())
        if plan is not None:
            c = plan.config
            self.prebuilt = binaries.load(record, plan.fn, dict(num_warps=c.num_warps, num_stages=c.num_stages,
                                                                **self.link))
        return self.prebuilt is not None

    def binary_record(self) -> dict | None:
        """Where Triton filed the first launch's binary (`binaries.record`), once warmed up."""
        compiled = self.warmed.result(ignore_errors=True) if hasattr(self.warmed, "result") else self.warmed
        return binaries.record(compiled) if compiled is not None else None

    def __call__(self, *args):
        sizes = args[self.n_buffers:]
        direct = self.direct.get(sizes)
        if direct is None and self.prebuilt is not None and not sizes:
            direct = self._prebuilt_launch(args)
            if direct is not None:
                try:
                    if direct.launch(args):
                        return
                except TypeError as e:
                    # Triton's launcher parses every argument before it launches anything: a
                    # refusal here ran nothing, and the JIT path below launches instead. (On the
                    # H200 a record whose signature had lost its order was refused so; each
                    # refusal is counted and named under KILN_LOG=perf.)
                    log.count("cached binaries refused at launch", 1)
                    log.emit("perf", f"kernel {self.layout.name}: its cached binary's launcher refused the "
                                     f"arguments ({e}); signature {dict(direct.signature)}")
                    self.direct.pop((), None)
                    direct = None
        if direct is not None and direct.launch(args):
            return
        plan = self.plans.get(sizes, False)
        if plan is False:
            plan = self.plans[sizes] = self.plan(sizes, args)
        if plan is None:
            return
        if self.interpret or sizes in self.direct:
            self._launch(plan, sizes, args)
        else:
            self._first_launch(plan, sizes, args)

    def _launch(self, plan: _Plan, sizes: tuple, args: Sequence):
        if self.interpret and "tl.device_assert(" in self.source:
            with _interpreter_asserts():
                return self._launch_now(plan, sizes, args)
        return self._launch_now(plan, sizes, args)

    def _launch_now(self, plan: _Plan, sizes: tuple, args: Sequence):
        c = plan.config
        compiled = plan.fn[plan.grid](*args, *plan.numels, XBLOCK=c.XBLOCK, RBLOCK=c.RBLOCK,
                                      INDEX_DTYPE=plan.index_dtype, num_warps=c.num_warps,
                                      num_stages=c.num_stages, **self.link)
        if not self.interpret and sizes not in self.direct and hasattr(compiled, "packed_metadata"):
            self.direct[sizes] = _DirectLaunch(compiled, plan, args[:self.n_buffers])

    def _first_launch(self, plan: _Plan, sizes: tuple, args: Sequence) -> None:
        """The first launch of a plan, timed as the stage "first launch" ([Note: compile stages]):
        it loads the binary into the GPU and builds Triton's launcher for it, and a binary
        `precompile` did not make compiles here, on the launching thread, which `KILN_LOG=perf`
        names (a size whose launch config no earlier call had)."""
        cache = _jit_cache(plan.fn)
        before = len(cache)
        with log.stage("first launch") as timed:
            self._launch(plan, sizes, args)
        if len(cache) > before:
            log.emit("perf", f"kernel {self.layout.name}: compiled at its first launch with sizes {sizes}, "
                             f"{plan.config.describe()} ({time.perf_counter() - timed.start:.2f} s)")

    def _prebuilt_launch(self, args: Sequence) -> "_DirectLaunch | None":
        """The direct launch of the binary `load_binary` found, built at the first call (it loads the
        binary into the GPU), for 16-byte aligned pointers as it was compiled; None when it cannot
        run here, and then the JIT path finds or compiles one."""
        compiled, self.prebuilt = self.prebuilt, None
        try:
            if binaries.runs_here(compiled):
                direct = _DirectLaunch(compiled, self.plans[()], args[:self.n_buffers], aligned=True)
                self.direct[()] = direct
                return direct
        except Exception as e:     # out of resources, a launcher that would not build: the JIT path says why
            log.emit("perf", f"kernel {self.layout.name}: its cached binary did not load ({type(e).__name__}: {e})")
        return None


@contextlib.contextmanager
def _interpreter_asserts():
    """Triton's interpreter drops `tl.device_assert` unless its (process-wide) builder runs with
    debug on, as a GPU build does unless the function is compiled with `debug=True`: on for the
    launch of a kernel that checks its indices ([Note: index bounds checks] in lowering_reduce),
    whose failed assert is raised as the IndexError eager raises."""
    from triton.runtime.interpreter import interpreter_builder
    before = interpreter_builder.options
    interpreter_builder.options = dataclasses.replace(before, debug=True)
    try:
        yield
    except Exception as e:      # the interpreter's InterpreterError holding the AssertionError
        # the assert's message is the check's (`ir.IndexCheck.message`): its op gives eager's type
        found = re.search(r"index out of range in (\w*).*?outside a dim of size [^\s')]+", str(e))
        if isinstance(e, (IndexError, RuntimeError)) or found is None:
            raise
        cls = ir.IndexCheck.error_type(found.group(1))
        raise cls(f"{found.group(0)} (Triton kernel's device_assert); eager raises {cls.__name__} here too") from e
    finally:
        interpreter_builder.options = before


def _jit_cache(fn) -> dict:
    """The binaries Triton's JIT holds for `fn` on the current device (a launch that compiled adds one)."""
    from triton.runtime import driver
    return fn.device_caches[driver.active.get_current_device()][0]


def warm(plan: _Plan, arg_dtypes: Sequence[torch.dtype], link: dict):
    """Triton's compile of `plan`'s first launch, without launching: its `CompiledKernel` (or the
    future of one under `AsyncCompileMode`). The one warmup call of the parent and of the compile
    workers, so both compute the same cache key ([Note: compile workers])."""
    c = plan.config
    return plan.fn.warmup(*arg_dtypes, *plan.sizes, *plan.numels, grid=plan.grid, XBLOCK=c.XBLOCK, RBLOCK=c.RBLOCK,
                          INDEX_DTYPE=plan.index_dtype, num_warps=c.num_warps, num_stages=c.num_stages, **link)


class _DirectLaunch:
    """A compiled binary launched straight through its launcher.

    [Note: direct launch] `fn[grid](...)` binds every argument, computes the specialization key and
    looks the binary up on each call: tens of microseconds, more than many kernels run. A plan's
    size ints are fixed, so the only thing that can change the binary between calls with the same
    sizes is the pointers' alignment; a call whose pointers align as the first one's did launches
    the same binary directly, any other goes the JIT path. The launch itself calls the C function
    of Triton's launcher with the tensors' addresses as ints: its Python wrapper (which allocates
    scratch memory these kernels never ask for) and its per-argument `data_ptr()` call and driver
    pointer query cost more than the launch (12 us a launch of three tensors on the H200, against
    7 through the wrapper with ints). Launch hooks (profilers) are honoured by taking the JIT path
    while one is set."""

    def __init__(self, compiled, plan: _Plan, tensors: Sequence[torch.Tensor], aligned: bool = False):
        """`compiled` was built for the pointers of `tensors`, or for 16-byte aligned ones (`aligned`)."""
        from triton.runtime import driver
        c = plan.config
        self.n_buffers = len(tensors)
        self.aligned = (True,) * len(tensors) if aligned else _alignment([t.data_ptr() for t in tensors])
        self.all_aligned = all(self.aligned)
        device = tensors[0].device.index if tensors else driver.active.get_current_device()
        self.stream = functools.partial(driver.active.get_current_stream, device)
        self.knobs = triton.knobs.runtime
        tail = (*plan.numels, c.XBLOCK, c.RBLOCK, plan.index_dtype)
        launcher = compiled.run
        if _plain_launcher(launcher):     # no scratch memory, no tensor descriptors: the C function
            head = (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
                    compiled.packed_metadata, None, None, None)
            self.call = launcher.launch
        else:
            head = (compiled.function, compiled.packed_metadata, None, None, None)
            self.call = launcher
        self.grid = plan.grid[0]
        self.head, self.tail = head, tail
        self.signature = getattr(compiled.src, "signature", {})

    def launch(self, args: Sequence) -> bool:
        """Launch if this call's pointers align as the first call's did and no hook is set."""
        hook = self.knobs.launch_enter_hook      # a HookChain, or None / a function in older Triton
        if getattr(hook, "calls", hook):
            return False
        pointers = [t.data_ptr() for t in args[:self.n_buffers]]
        if self.all_aligned:
            if functools.reduce(operator.or_, pointers, 0) & 15:
                return False
        elif _alignment(pointers) != self.aligned:
            return False
        self.call(self.grid, 1, 1, self.stream(), *self.head, *pointers, *args[self.n_buffers:], *self.tail)
        return True


def _alignment(pointers: Sequence[int]) -> tuple[bool, ...]:
    """What Triton specializes a binary on for pointer arguments: 16-byte alignment."""
    return tuple(p % 16 == 0 for p in pointers)


def _plain_launcher(launcher) -> bool:
    """Whether Triton's launcher object only forwards to its C function: it allocates no scratch
    memory and wraps no tensor descriptors (the attributes are Triton 3.4-3.6's `CudaLauncher`)."""
    try:
        return (launcher.global_scratch_size == 0 and launcher.profile_scratch_size == 0
                and getattr(launcher.launch, "__name__", "") == "launch")
    except AttributeError:
        return False


def precompile(kernels: Sequence[TritonKernel], workers: int) -> list[str]:
    """Compile CUDA kernels for their first launch's sizes, in parallel, before that launch.

    Each kernel's first-launch plan is made now and warmed up through Triton's `AsyncCompileMode`
    (a thread pool; Triton 3.4+), which compiles with the specialization a launch with 16-byte
    aligned tensors would get and files each binary where that launch looks first. Kernels whose
    first sizes are not known or under autotune compile at their first launch as usual. Many kernels are
    first compiled into Triton's cache by worker processes, which the GIL does not serialize, so
    the warmup here finds their binaries ([Note: compile workers]). A failure here is
    not an error (the launch compiles again and reports it): the names of failed kernels are
    returned and logged.
    """
    ready = [k for k in kernels if k.precompiled and k.prebuilt is None]
    if not ready:
        return []
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:             # older Triton: each kernel compiles at its first launch
        return []
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        try:
            with AsyncCompileMode(pool, ignore_errors=True):
                for kernel in _warmup_order(ready):
                    try:
                        kernel.warmup()
                    except Exception as e:
                        failed.append(f"{kernel.layout.name}: {type(e).__name__}: {e}")
        except Exception as e:
            failed.append(f"parallel compile: {type(e).__name__}: {e}")
    if failed:
        warnings.warn("kiln could not precompile Triton kernels (they compile at first launch instead): "
                      + "; ".join(failed))
    return failed


def _warmup_order(kernels: Sequence[TritonKernel]) -> Iterator[TritonKernel]:
    """`kernels`, each as soon as a compile worker has filed its binary in Triton's cache, then the
    ones no worker filed ([Note: compile workers]); all at once when the workers are not worth it."""
    pool = compile_pool.start(len(kernels)) if binaries._plain_cache() else None   # else no warmup looks
    jobs = []
    if pool is not None:
        try:
            jobs = [(k, job) for k in kernels if (job := k.compile_job()) is not None]
        except Exception as e:               # a plan or target the warmup will report itself
            log.emit("perf", f"kiln compile workers: no jobs ({type(e).__name__}: {e})")
            jobs = []
    waiting = {id(k): k for k in kernels}
    if jobs:
        for i in pool.filed([job for _, job in jobs]):
            yield waiting.pop(id(jobs[i][0]))
    yield from waiting.values()


def interpret_for(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer]) -> bool:
    """CPU buffers run under Triton's interpreter; CUDA buffers compile for the GPU."""
    return not any(str(buffers[b].device).startswith("cuda") for b in kernel.buffer_args if b in buffers)


def saved(kernels: Sequence[ir.Kernel], buffers: Mapping[str, ir.Buffer], hints: Mapping[str, int] | None = None) -> dict:
    """What the warm-start cache keeps of built kernels (JSON): each kernel's `KernelSpec` (its
    source and how to launch it) under the name the host program calls it by, and the size ints
    of symbolic kernels' first launch (`first_sizes`, from `hints`: symbol name -> the compiling
    call's value); `restore` loads them again, and Triton's own cache has their binaries: `restore`
    adds where (`binaries`)."""
    return {"kernels": {k.name: dataclasses.asdict(KernelSpec.of(k, buffers)) for k in kernels},
            "first_sizes": first_sizes(kernels, hints or {})}


def first_sizes(kernels: Sequence[ir.Kernel], hints: Mapping[str, int]) -> dict[str, list[int]]:
    """Each symbolic kernel's size ints in the call `hints` describes, where every one is known."""
    return {k.name: [hints[s.name] for s in k.size_args] for k in kernels
            if k.size_args and all(s.name in hints for s in k.size_args)}


def restore(entry: dict, workers: int | None = None, autotune: bool = False) -> dict[str, "TritonKernel"]:
    """`build`'s result again from what `saved` kept. A static kernel whose binary `entry["binaries"]`
    names loads it without Triton's JIT; the others precompile, and `entry["binaries"]` then names
    theirs, for the cache entry the caller stores ([Note: warm binaries])."""
    return _load({name: KernelSpec.from_json(v) for name, v in entry["kernels"].items()}, autotune, workers,
                 entry.setdefault("binaries", {}), entry.get("first_sizes", {}))


def build(kernels: Sequence[ir.Kernel], buffers: Mapping[str, ir.Buffer], autotune: bool = False,
          workers: int | None = None, hints: Mapping[str, int] | None = None) -> dict[str, TritonKernel]:
    """Print and load every kernel, then compile the CUDA ones in parallel (`workers` threads;
    default: the machine's cores, at most 16), those of symbolic sizes for the sizes `hints` gives
    (symbol name -> int). The printer interface of `kiln.codegen.ir`."""
    return _load({k.name: KernelSpec.of(k, buffers) for k in kernels}, autotune, workers,
                 first_sizes=first_sizes(kernels, hints or {}))


def _load(specs: Mapping[str, KernelSpec], autotune: bool, workers: int | None,
          records: dict | None = None, first_sizes: Mapping[str, Sequence[int]] | None = None) -> dict[str, TritonKernel]:
    """One `TritonKernel` per distinct spec (a kernel repeated in every layer loads and compiles
    once), its binary loaded from `records` (name -> `binary_record`) or precompiled in parallel,
    for `first_sizes` (name -> the compiling call's size ints) where its sizes are symbolic;
    `records` then names every static kernel's binary."""
    workers = workers or min(16, os.cpu_count() or 1)
    first_sizes = first_sizes or {}
    unique: dict[KernelSpec, TritonKernel] = {}
    # The workers start now, and boot while the kernels load ([Note: compile workers]).
    compile_pool.start(len({spec for name, spec in specs.items() if not spec.interpret and not autotune
                            and (name in first_sizes if spec.size_args else name not in (records or {}))}))
    with log.stage("load"):                  # [Note: compile stages]
        for name, spec in specs.items():
            if spec not in unique:
                unique[spec] = TritonKernel(spec, autotune, first_sizes.get(name))
    fns = {name: unique[spec] for name, spec in specs.items()}
    with log.stage("compile"):
        if records:
            found = [fn for name, fn in fns.items() if name in records and fn.static and fn.prebuilt is None
                     and fn.load_binary(records[name])]
            log.count("binaries from the cache", len(found))
        precompile(list(unique.values()), workers)
    if records is not None:
        for name, fn in fns.items():
            if fn.warmed is not None and fn.static:       # precompiled now: where Triton filed it
                records.pop(name, None)
                if (record := fn.binary_record()) is not None:
                    records[name] = record
    return fns
