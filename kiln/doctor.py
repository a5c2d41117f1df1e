"""`kiln doctor`: is this machine ready for kiln? (the role of PyTorch's verify_dynamo.py)

Prints the versions kiln depends on (Python, torch, Triton, g++, CUDA), then compiles a tiny
function, forward and backward, on every device this torch sees, through that device's printer (C++
kernels on the CPU, Triton kernels on CUDA), and compares it with eager. Each failure says what to
install or set. Exit status 0 when every check passed, 1 otherwise.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess
import sys
import traceback
from typing import Callable

import torch

MIN_PYTHON = (3, 11)


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""          # what to install or set, for a failed check


def _python() -> Check:
    version = platform.python_version()
    ok = sys.version_info[:2] >= MIN_PYTHON
    return Check("python", ok, version, "" if ok else f"kiln needs Python {'.'.join(map(str, MIN_PYTHON))} or newer")


def _torch() -> Check:
    return Check("torch", True, f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})")


def _gxx() -> Check:
    cxx = os.environ.get("CXX", "g++")
    path = shutil.which(cxx)
    if path is None:
        return Check("g++", False, f"{cxx} not found on PATH",
                     "install a C++ compiler (Debian/Ubuntu: apt-get install g++), or set CXX to one")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    return Check("g++", True, f"{path}: {out.splitlines()[0] if out else '?'}")


def _triton() -> Check:
    try:
        import triton
    except ImportError:
        needed = torch.cuda.is_available()
        return Check("triton", not needed, "not installed",
                     "pip install triton (the release matching your torch)" if needed else "")
    return Check("triton", True, triton.__version__)


def _cuda() -> Check:
    if not torch.cuda.is_available():
        detail = "no CUDA device" + ("" if torch.version.cuda else " (this torch is a CPU build)")
        return Check("cuda", True, detail + ": only the CPU is checked")
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return Check("cuda", True, f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s): {names}")


def tiny(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A pointwise chain, a reduction and a matmul: one fused kernel of each kind, and an extern."""
    h = torch.relu(x @ w + 1.0) * torch.sigmoid(x.sum(dim=1, keepdim=True))
    return torch.softmax(h, dim=-1).mean()


def compile_check(device: str, printer: str) -> Check:
    """kiln.compile of `tiny` on `device`, forward and backward, against eager."""
    import kiln
    name = f"compile on {device} ({printer})"
    try:
        kiln.reset()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(8, 16, generator=g).to(device).requires_grad_()
        w = torch.randn(16, 16, generator=g).to(device).requires_grad_()
        expected = tiny(x, w)
        expected_grads = torch.autograd.grad(expected, (x, w))
        got = kiln.compile(tiny, fullgraph=True)(x, w)
        grads = torch.autograd.grad(got, (x, w))
        for a, b in zip((expected, *expected_grads), (got, *grads)):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    except Exception as e:  # the check reports it with a fix
        traceback.print_exc()
        text = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if isinstance(e, AssertionError):    # it compiled and ran, and computed something else
            fix = "kiln's result differs from eager's: a kiln bug; report it with the output of KILN_LOG=graphs,kernels"
        elif device == "cpu":
            fix = "check that g++ runs and that the kiln cache (KILN_CACHE_DIR, default .kiln_cache) is writable"
        else:
            fix = "check that triton is the release this torch pins (pip install triton==...) and the CUDA driver"
        return Check(name, False, text[:300], fix)
    finally:
        kiln.reset()
    return Check(name, True, "forward and backward match eager")


def checks(compile_on: Callable[[str, str], Check] = compile_check) -> list[Check]:
    found = [_python(), _torch(), _triton(), _gxx(), _cuda()]
    found.append(compile_on("cpu", "C++") if found[3].ok else
                 Check("compile on cpu (C++)", False, "skipped: no g++", found[3].fix))
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        found.append(compile_on(f"cuda:{i}", "Triton") if found[2].ok else
                     Check(f"compile on cuda:{i} (Triton)", False, "skipped: no triton", found[2].fix))
    return found


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    results = checks()
    width = max(len(c.name) for c in results)
    for c in results:
        print(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:{width}s}  {c.detail}")
        if not c.ok and c.fix:
            print(f"      {'':{width}s}  fix: {c.fix}")
    failed = [c for c in results if not c.ok]
    print(f"\nkiln doctor: {len(results) - len(failed)} of {len(results)} checks passed"
          + ("" if not failed else f"; failed: {', '.join(c.name for c in failed)}"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
