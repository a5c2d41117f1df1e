"""Worker processes that fill Triton's on-disk cache with kernels' binaries, in parallel.

[Note: compile workers] Triton's front end (Python AST to TTIR) holds the GIL, so `precompile`'s
threads scale poorly: a cold resnet50 training compile on the H200 spent 8.9 s of wall time and
47 s of CPU on ~600 kernels. The parent already knows everything the first launch of a kernel
compiles: its source, its plan (function, config, size ints, numels, index dtype), its argument
dtypes and link options. A worker process is given those (a `CompileJob`), plus the GPU target as
(backend, arch, warp size), Triton's cache dir and every knob or variable Triton's cache key reads
(debug, instrumentation mode, the cache-invalidating environment), and runs the very `fn.warmup`
the parent would (`launcher.warm`) under a stub driver that reports that target and never touches
a GPU. The binary lands in Triton's cache under the key the parent's warmup computes; the parent
warms each kernel up as usual as soon as its worker reports (`filed`), so its cache hits (a few
ms each, under the GIL) overlap the workers' compiles; its warmup finds the binary and keeps the
`CompiledKernel` that [Note: warm binaries] records.

The pool only fills a cache, so it is never needed for correctness: a worker that raises, dies or
hangs costs at most one warning per process, and the parent's own warmup compiles whatever is
missing. It is used for CUDA compiles of at least `MIN_KERNELS` kernels, on machines of at least
4 cores, with min(cores - 1, 16) workers (`KILN_COMPILE_WORKERS=auto`, the default); `=N` asks
for N workers on any machine, and 0 turns the pool off. On the H200 (16 cores) it took cold
compiles of resnet50 training from 17.0 to 10.3 s and of GPT-2 training from 9.1 to 8.2 s
(bench/results/warm-start/20261202-2155_cuda_warm_start_workers_*.md). The workers are started when a
graph on a CUDA device misses the warm-start cache (`prestart`), before aot and lowering, so that
their interpreters' start (an import of torch each, about 1.5 s there) overlaps those stages
instead of delaying the first kernel; later compiles of the process reuse them. Workers are fresh interpreters (`python -c`, spawned: nothing is forked from a process
that may hold a CUDA context) rather than `multiprocessing` children, because 'spawn' and
'forkserver' re-import the user's `__main__` in each child, which runs a script without a
`__name__ == "__main__"` guard again, GPU work included. A worker talks to the parent through two
pipes (`multiprocessing.connection.Connection`) and exits when the parent closes them.

Hands on: `size() -> int`, `start(n_kernels) -> CompilePool | None`, `prestart()`, `CompileJob`,
`CompilePool.filed(jobs) -> Iterator[int]`.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import queue
import subprocess
import sys
import threading
import time
import warnings
from multiprocessing.connection import Connection
from typing import Iterator, Sequence

from kiln import log

MIN_KERNELS = 8          # fewer kernels compile as fast in the parent's threads as through the pool
MIN_CORES = 4
MAX_WORKERS = 16
DEFAULT = "auto"         # min(cores - 1, 16) on 4 or more cores
TIMEOUT_S = 300.0        # one reply (a worker's start plus a kernel's compile) past this: the pool is broken


@dataclasses.dataclass(frozen=True)
class CompileJob:
    """One kernel's first-launch compile, as plain data a worker can rebuild it from."""

    source: str
    interpret: bool
    function: str                      # the plan's function (`<name>` or `<name>_looped`)
    arg_dtypes: tuple[str, ...]        # `str(torch.dtype)` of the buffer arguments
    sizes: tuple[int, ...]             # the size ints of the launch compiled for (none: static sizes)
    numels: tuple[int, ...]
    grid: tuple[int, ...]
    config: object                     # the plan's `LaunchConfig`
    index_dtype: str                   # "int32" | "int64"
    link: dict                         # [Note: libdevice]
    target: tuple[str, int | str, int]  # (backend, arch, warp size) of the parent's GPU
    cache_dir: str                     # Triton's
    debug: bool                        # what the parent's JIT would pass (fn.debug or knobs.runtime.debug)
    instrumentation_mode: str
    env: dict                          # Triton's cache-invalidating environment, the parent's


def size() -> int:
    """How many workers this process would use: 0 when the pool is off (`KILN_COMPILE_WORKERS=0`,
    or fewer than `MIN_CORES` cores under the default `auto`)."""
    wanted = os.environ.get("KILN_COMPILE_WORKERS", DEFAULT).strip()
    if wanted != "auto":
        try:
            return max(0, int(wanted))
        except ValueError:
            log.emit("perf", f"KILN_COMPILE_WORKERS={wanted!r} is neither a number nor \"auto\": compile workers off")
            return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return min(cores - 1, MAX_WORKERS) if cores >= MIN_CORES else 0


_POOL: "CompilePool | None" = None
_BROKEN = False          # a pool failed once: this process compiles in-process from then on
_WARNED = False
_LOCK = threading.Lock()


def start(n_kernels: int) -> "CompilePool | None":
    """The process's pool, started now (without waiting for its workers) when `n_kernels`
    kernels are worth it; None when the pool is off, broken or not worth starting."""
    global _POOL
    if _BROKEN or n_kernels < MIN_KERNELS:
        return None
    n = size()
    if n <= 0:                     # read at each compile: KILN_COMPILE_WORKERS=0 also idles a started pool
        return None
    with _LOCK:
        if _POOL is None:
            try:
                _POOL = CompilePool(n)
            except Exception as e:           # no interpreter to spawn, too many processes: in-process
                _fail(f"could not start {n} compile workers ({type(e).__name__}: {e})")
                return None
        return _POOL


def prestart() -> None:
    """Start the pool now for a graph about to be lowered for a CUDA device: such a graph nearly
    always has `MIN_KERNELS` kernels or more, and the workers' start then overlaps aot and
    lowering ([Note: compile workers]). Returns at once; does nothing when the pool is off."""
    start(MIN_KERNELS)


def _fail(reason: str) -> None:
    """Give the pool up for this process, with one warning per process."""
    global _BROKEN, _WARNED, _POOL
    _BROKEN = True
    log.emit("perf", f"kiln compile workers: {reason}")
    pool, _POOL = _POOL, None
    if pool is not None:
        pool.close()
    if not _WARNED:
        _WARNED = True
        warnings.warn(f"kiln's compile workers failed ({reason}); Triton kernels compile in this process "
                      "instead. Set KILN_COMPILE_WORKERS=0 to silence this.", stacklevel=3)


def _worker_command() -> list[str]:
    return [sys.executable, "-c", "from kiln.codegen.triton.compile_pool import serve; serve()"]


def _kiln_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class _Worker:
    def __init__(self):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ, KILN_COMPILE_FDS=f"{to_child_r},{from_child_w}",
                   KILN_COMPILE_WORKERS="0",             # a worker never starts a pool of its own
                   CUDA_VISIBLE_DEVICES="",              # and never sees a GPU (a second guard to the stub driver)
                   PYTHONPATH=os.pathsep.join(p for p in (_kiln_root(), os.environ.get("PYTHONPATH")) if p))
        try:
            self.process = subprocess.Popen(_worker_command(), env=env, stdin=subprocess.DEVNULL,
                                            pass_fds=(to_child_r, from_child_w), close_fds=True)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.send = Connection(to_child_w, readable=False)
        self.recv = Connection(from_child_r, writable=False)

    def compile(self, job: CompileJob, timeout: float) -> tuple:
        """("ok", binary hash, launcher built) or ("error", what the worker raised); raises when the worker is gone
        (EOFError, OSError) or silent for `timeout` seconds (TimeoutError)."""
        self.send.send(job)
        if not self.recv.poll(timeout):
            raise TimeoutError(f"no reply in {timeout:.0f} s")
        return self.recv.recv()

    def close(self) -> None:
        for conn in (self.send, self.recv):
            try:
                conn.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class CompilePool:
    """`n` worker processes, started at once and kept until the process exits."""

    def __init__(self, n: int):
        self.workers: list[_Worker] = []
        try:
            for _ in range(n):
                self.workers.append(_Worker())
        except Exception:
            self.close()
            raise
        self.busy = threading.Lock()
        atexit.register(self.close)

    def filed(self, jobs: Sequence[CompileJob]) -> Iterator[int]:
        """Compile `jobs` in the workers into Triton's cache, largest sources first, yielding each
        job's index as its binary lands, so the parent warms it up while the workers go on. Any
        failure gives the pool up (`_fail`) and leaves the jobs not yielded to the parent."""
        if not self.busy.acquire(blocking=False):     # another thread is filling: it compiles in-process
            return
        try:
            yield from self._filed(sorted(range(len(jobs)), key=lambda i: -len(jobs[i].source)), jobs)
        finally:
            self.busy.release()

    def _filed(self, order: list[int], jobs: Sequence[CompileJob]) -> Iterator[int]:
        todo: queue.SimpleQueue = queue.SimpleQueue()
        for i in order:
            todo.put(i)
        landed: queue.SimpleQueue = queue.SimpleQueue()     # job indices, then one None per worker
        errors, stop = [], threading.Event()
        launchers = []                                      # one bool a compiled job: its launcher built too

        def drain(worker: _Worker) -> None:
            try:
                while not stop.is_set():
                    try:
                        i = todo.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        reply = worker.compile(jobs[i], TIMEOUT_S)
                    except Exception as e:   # dead or hung: the whole pool goes
                        errors.append(f"a worker {'hung' if isinstance(e, TimeoutError) else 'died'} "
                                      f"({type(e).__name__}: {e})")
                        stop.set()
                        return
                    if reply[0] == "ok":
                        launchers.append(reply[2])
                        landed.put(i)
                    else:
                        errors.append(f"{jobs[i].function}: {reply[1]}")
                        stop.set()
            finally:
                landed.put(None)

        started, n_done = time.perf_counter(), 0
        for w in self.workers:
            threading.Thread(target=drain, args=(w,), name="kiln-compile-worker", daemon=True).start()
        running = len(self.workers)
        while running:
            i = landed.get()
            if i is None:
                running -= 1
            else:
                n_done += 1
                yield i
        log.count("kernels compiled by workers", n_done)
        log.emit("perf", f"kiln compile workers: {n_done} of {len(jobs)} kernels ({sum(launchers)} launchers) in "
                         f"{time.perf_counter() - started:.2f} s on {len(self.workers)} workers")
        if errors:
            _fail(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))

    def close(self) -> None:
        workers, self.workers = self.workers, []
        for w in workers:
            w.close()


# ---- the worker's side ----------------------------------------------------------------------

class _StubDriver:
    """Triton's JIT without a GPU: device 0, stream 0, and the parent's target."""

    def __init__(self, target):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget(*target)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


_FILED_UNDER: tuple | None = None     # the cache dir and environment the worker's loaded kernels compiled for


def run_job(job: CompileJob) -> tuple[str, bool]:
    """`job`'s binary compiled into Triton's cache as the parent's warmup would file it: its hash,
    and whether its launcher was filed too (`file_launcher`)."""
    global _FILED_UNDER
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime import driver

    from kiln.codegen.triton import launcher, source_cache

    # A loaded kernel's JIT answers a warmup from memory, filing nothing: under another cache dir
    # or environment than before (the parent changed them), load the kernels anew.
    if _FILED_UNDER != (job.cache_dir, sorted(job.env.items())):
        _FILED_UNDER = (job.cache_dir, sorted(job.env.items()))
        source_cache._LOADED.clear()
    for name in set(get_cache_invalidating_env_vars()) - set(job.env):
        os.environ.pop(name, None)
    os.environ.update(job.env)
    if not isinstance(driver._active, _StubDriver) or driver._active.target != _StubDriver(job.target).target:
        driver.set_active(_StubDriver(job.target))
    knobs = triton.knobs
    knobs.cache.dir = job.cache_dir
    knobs.runtime.debug = job.debug
    knobs.compilation.instrumentation_mode = job.instrumentation_mode
    fn = getattr(source_cache.load_module(job.source, job.interpret), job.function)
    plan = launcher._Plan(job.numels, job.config, fn, job.grid, getattr(triton.language, job.index_dtype), job.sizes)
    compiled = launcher.warm(plan, [launcher._dtype(d) for d in job.arg_dtypes], job.link)
    return compiled.hash, job.target[0] == "cuda" and file_launcher(compiled)


def file_launcher(compiled) -> bool:
    """Build the C launcher the first launch of `compiled` needs into Triton's cache, where that
    launch finds it: Triton compiles one per distinct signature with gcc at a binary's first
    launch (0.1-0.3 s each, in the launching thread: about 5 s of a dolly-shaped generate()'s
    first call on the H200, before the workers built them). Best effort: a machine without
    libcuda (CI) builds none, and the parent's first launch builds what is missing. Whether it
    was built."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher
        CudaLauncher(compiled.src, compiled.metadata)
        return True
    except Exception:
        return False


def serve() -> None:
    """A worker's loop: a job in, ("ok", hash) or ("error", why) out, until the parent hangs up."""
    read_fd, write_fd = (int(fd) for fd in os.environ.pop("KILN_COMPILE_FDS").split(","))
    jobs, replies = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    # What every job needs, imported while the parent still traces (prestart), not at the first job.
    import triton.compiler  # noqa: F401
    from kiln.codegen.triton import launcher, source_cache  # noqa: F401
    try:
        from triton.backends.nvidia.driver import CudaLauncher  # noqa: F401
    except ImportError:
        pass
    while True:
        try:
            job = jobs.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", *run_job(job))
        except Exception as e:
            reply = ("error", f"{type(e).__name__}: {e}")
        try:
            replies.send(reply)
        except OSError:
            return
