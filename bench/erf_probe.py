"""Where does Triton's erf part from eager's CUDA erff? Compares torch.erf / F.gelu on the GPU with
Triton kernels built under variations (libdevice file, nvvm-reflect FTZ), and with jiterator (NVRTC).

    python bench/erf_probe.py [--out DIR]
"""
from __future__ import annotations

import ctypes
import glob
import os
import subprocess
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _erf(X, Y, n, GELU: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(X + i, mask=m).to(tl.float32)
    if GELU:
        y = x * 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
    else:
        y = tl.math.erf(x)
    tl.store(Y + i, y.to(Y.dtype.element_ty), mask=m)


def triton_fn(x, gelu):
    y = torch.empty_like(x)
    _erf[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), GELU=gelu, BLOCK=1024)
    return y


def inputs():
    g = torch.Generator(device="cuda").manual_seed(0)
    return torch.randn(1 << 22, device="cuda", generator=g) * 3


def child(label: str) -> None:
    if "noftz" in label:
        from triton._C.libtriton import llvm
        llvm.set_nvvm_reflect_ftz = lambda *a, **k: None
        import triton.backends.nvidia.compiler as c
        for name in dir(c):
            mod = getattr(c, name)
            if hasattr(mod, "set_nvvm_reflect_ftz"):
                try:
                    setattr(mod, "set_nvvm_reflect_ftz", lambda *a, **k: None)
                except Exception:
                    pass
    x = inputs()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        for gelu in (False, True):
            want = torch.nn.functional.gelu(xd) if gelu else torch.erf(xd)
            got = triton_fn(xd, gelu)
            rows.append(f"{'gelu' if gelu else 'erf'} {str(dtype)[6:]}: {int((want != got).sum())}")
    print(f"{label:60s} " + "  ".join(rows), flush=True)


def nvrtc_ptx(out: str) -> None:
    libs = sorted(set(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libnvrtc.so*"))
                      + glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libnvrtc*.so*"))))
    print("nvrtc libraries:", libs)
    for path in libs:
        if "builtins" in path:
            continue
        try:
            nv = ctypes.CDLL(path)
        except OSError as e:
            print("  cannot load", path, e)
            continue
        major, minor = ctypes.c_int(), ctypes.c_int()
        nv.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        src = b'extern "C" __global__ void k(const float* x, float* y) { y[threadIdx.x] = erff(x[threadIdx.x]); }'
        prog = ctypes.c_void_p()
        nv.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None)
        opts = (ctypes.c_char_p * 1)(b"--gpu-architecture=compute_90")
        rc = nv.nvrtcCompileProgram(prog, 1, opts)
        size = ctypes.c_size_t()
        nv.nvrtcGetPTXSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        nv.nvrtcGetPTX(prog, buf)
        ptx = buf.value.decode()
        name = os.path.join(out, f"nvrtc_{major.value}.{minor.value}_erff.ptx")
        with open(name, "w") as f:
            f.write(ptx)
        print(f"  nvrtc {major.value}.{minor.value}: rc {rc}, {ptx.count(chr(10))} PTX lines, branches "
              f"{ptx.count('bra')}, ex2 {ptx.count('ex2')}, fma {ptx.count('fma')} -> {name}")


def main() -> None:
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    os.makedirs(out, exist_ok=True)
    print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
    found = sorted(set(glob.glob("/usr/**/libdevice*.bc", recursive=True)
                       + glob.glob(os.path.join(sys.prefix, "**", "libdevice*.bc"), recursive=True)
                       + glob.glob(os.path.join(os.path.dirname(triton.__file__), "**", "libdevice*.bc"), recursive=True)
                       + glob.glob("/opt/**/libdevice*.bc", recursive=True)))
    for f in found:
        print("libdevice:", f, os.path.getsize(f))
    env = dict(os.environ)
    me = os.path.abspath(__file__)
    variants = [("default", {}), ("noftz", {})] + [(f"libdevice {f}", {"TRITON_LIBDEVICE_PATH": f}) for f in found]
    variants += [(f"noftz libdevice {f}", {"TRITON_LIBDEVICE_PATH": f}) for f in found]
    for label, extra in variants:
        cache = os.path.join("/tmp", "tcache_" + str(abs(hash(label))))
        r = subprocess.run([sys.executable, me, "--child", label], env={**env, **extra, "TRITON_CACHE_DIR": cache},
                           capture_output=True, text=True, timeout=120)
        print((r.stdout.strip() or r.stderr.strip()[-600:]), flush=True)
    x = inputs()
    try:
        f = torch.cuda.jiterator._create_jit_fn("template <typename T> T kerf(T x) { return erff(x); }")
        print("jiterator erff fp32 differing:", int((f(x) != torch.erf(x)).sum()))
        g = torch.cuda.jiterator._create_jit_fn(
            "template <typename T> T kgelu(T x) { return x * T(0.5) * (T(1) + erff(x * T(0.70710678118654752440))); }")
        print("jiterator gelu fp32 differing:", int((g(x) != torch.nn.functional.gelu(x)).sum()))
    except Exception as e:
        print("jiterator failed:", repr(e)[:300])
    nvrtc_ptx(out)
    ptx_dir = os.path.join(out, "triton_ptx")
    os.makedirs(ptx_dir, exist_ok=True)
    k = _erf.warmup(torch.empty(8, device="cuda"), torch.empty(8, device="cuda"), 8, GELU=False, BLOCK=1024, grid=(1,))
    with open(os.path.join(ptx_dir, "erf.ptx"), "w") as fh:
        fh.write(k.asm["ptx"])
    print("triton erf PTX lines", k.asm["ptx"].count("\n"), "ex2", k.asm["ptx"].count("ex2"))


if __name__ == "__main__":
    if "--child" in sys.argv:
        child(sys.argv[sys.argv.index("--child") + 1])
    else:
        main()
