"""Block sizes and warp counts for kiln's Triton kernels, chosen per launch from the real sizes.

A kernel's source is printed once for every size of a symbolic dim; only its `tl.constexpr`
block sizes (and so the binary Triton compiles) depend on the sizes of a call. This module maps
(kind, xnumel, rnumel) to a `LaunchConfig`, and lists the few alternatives max-autotune tries.

[Note: persistent and looped reductions]
A reduction row that fits in registers is loaded once and kept there (a *persistent* reduction):
softmax and layer_norm then read their input once and write once, which is what reaching copy
bandwidth needs. Past `PERSISTENT_MAX` elements a row would spill, so the kernel instead walks the
row in `RBLOCK` chunks, once per reduction it computes (a *looped* reduction). The printer emits
both bodies into one source; the launcher picks one per call with `persistent`.
"""
from __future__ import annotations

import dataclasses

# Elements of one row kept in registers at most (32 fp32 values per thread at 16 warps).
PERSISTENT_MAX = 16384
# Elements a pointwise program handles: 8 per thread at 4 warps, so fp32 loads are 128-bit wide.
POINTWISE_BLOCK = 1024
LOOPED_RBLOCK = 2048
MAX_WARPS = 16
# Programs a wide-in-x reduction should launch at least: about four a streaming multiprocessor
# (the H200 has 132). See `reduction`.
MIN_WIDE_PROGRAMS = 512


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """The compile-time parameters of one launch; `RBLOCK` is 1 for pointwise kernels."""

    XBLOCK: int
    RBLOCK: int = 1
    num_warps: int = 4
    num_stages: int = 1
    persistent: bool = True

    template: str = ""        # a template kernel's tiling (`ir.MatmulConfig`), fixed in its source

    def constexprs(self) -> dict[str, int]:
        return {"XBLOCK": self.XBLOCK, "RBLOCK": self.RBLOCK}

    def describe(self) -> str:
        if self.template:
            return f"{self.template} (a template: one tile a program)"
        body = "persistent" if self.persistent else "looped"
        return f"XBLOCK={self.XBLOCK} RBLOCK={self.RBLOCK} warps={self.num_warps} {body}"


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _warps_for(elements: int, per_thread: int) -> int:
    return max(1, min(MAX_WARPS, next_power_of_2(elements // (32 * per_thread))))


# A row too long for registers: one a program, in chunks of LOOPED_RBLOCK.
LOOPED = LaunchConfig(XBLOCK=1, RBLOCK=LOOPED_RBLOCK, num_warps=8, persistent=False)


def pointwise(xnumel: int, rnumel: int = 1, rows_contiguous: bool = False) -> LaunchConfig:
    block = max(16, min(POINTWISE_BLOCK, next_power_of_2(xnumel)))
    return LaunchConfig(XBLOCK=block, num_warps=_warps_for(block, 8))


def reduction(xnumel: int, rnumel: int, rows_contiguous: bool = False) -> LaunchConfig:
    """`rows_contiguous`: neighbouring output elements are neighbours in memory and the reduced
    dim is strided (a reduction over an outer dim), so programs should be wide in x."""
    if rows_contiguous and rnumel > 1:
        # 64 outputs a program, fewer when that leaves too few programs to keep the GPU's memory
        # system busy (ResNet-50's batch norm gradients over its first stage, 8192 outputs of 12544
        # each: 128 programs of 16 warps, one a multiprocessor, ran at a third of copy bandwidth),
        # but never under 16 (32 bytes of bfloat16 a row: a whole memory sector).
        xblock = 64
        while xblock > 16 and xnumel // xblock < MIN_WIDE_PROGRAMS:
            xblock //= 2
        xblock = max(1, min(xblock, next_power_of_2(xnumel)))
        rblock = max(1, min(next_power_of_2(rnumel), 4096 // xblock))
        return LaunchConfig(XBLOCK=xblock, RBLOCK=rblock, num_warps=_warps_for(xblock * rblock, 8),
                            persistent=rblock >= rnumel)
    if rnumel <= PERSISTENT_MAX:
        rblock = next_power_of_2(rnumel)
        # Short rows: several rows per program, so a program still moves a few KB.
        xblock = max(1, min(next_power_of_2(xnumel), 2048 // rblock))
        per_thread = 16 if rblock >= 4096 else 8
        return LaunchConfig(XBLOCK=xblock, RBLOCK=rblock,
                            num_warps=_warps_for(xblock * rblock, per_thread), persistent=True)
    return LOOPED


def scan(xnumel: int, rnumel: int, rows_contiguous: bool = False) -> LaunchConfig:
    # A scan carries its running value across chunks, so one row per program.
    if rnumel <= PERSISTENT_MAX:
        rblock = next_power_of_2(rnumel)
        return LaunchConfig(XBLOCK=1, RBLOCK=rblock, num_warps=_warps_for(rblock, 8), persistent=True)
    return LOOPED


# The longest row a persistent kernel pinned to 128 threads holds in registers: sm_90 ptxas gives
# layer_norm over 8192 float32 164 registers and no spills, over 12288 (RBLOCK 16384) 236 bytes of spills.
ROW_THREADS_MAX_RNUMEL = 8192


def pin_row_threads(config: LaunchConfig, rnumel: int, row_threads: int | None) -> LaunchConfig:
    """A persistent kernel whose reduction fixes its threads a row (the printed `ROW_THREADS`: eager's
    layer_norm order) runs one row a program on exactly those threads; a row too long for that takes
    the looped form, which is free to choose."""
    if not row_threads or not (config.persistent and config.RBLOCK >= rnumel):
        return config
    if rnumel > ROW_THREADS_MAX_RNUMEL:
        return LOOPED
    return dataclasses.replace(config, XBLOCK=1, num_warps=row_threads // 32)


HEURISTICS = {"pointwise": pointwise, "reduction": reduction, "scan": scan}


def choose(kind: str, xnumel: int, rnumel: int = 1, rows_contiguous: bool = False) -> LaunchConfig:
    return HEURISTICS[kind](xnumel, rnumel, rows_contiguous)


def autotune_candidates(kind: str, xnumel: int, rnumel: int = 1,
                        rows_contiguous: bool = False) -> list[LaunchConfig]:
    """The heuristic's choice first, then a few neighbours for max-autotune to time."""
    base = choose(kind, xnumel, rnumel, rows_contiguous)
    found = [base]

    def add(config: LaunchConfig) -> None:
        if config not in found:
            found.append(config)

    if kind == "pointwise":
        for block, warps in ((512, 4), (1024, 8), (2048, 8), (4096, 16)):
            add(LaunchConfig(XBLOCK=min(block, max(16, next_power_of_2(xnumel))), num_warps=warps))
    elif kind == "reduction" and base.persistent:
        for warps in (base.num_warps // 2, base.num_warps * 2):
            if 1 <= warps <= 32:
                add(dataclasses.replace(base, num_warps=warps))
        if base.XBLOCK > 1:
            add(dataclasses.replace(base, XBLOCK=base.XBLOCK // 2))
        if rnumel > 1024:
            add(LaunchConfig(XBLOCK=1, RBLOCK=1024, num_warps=8, persistent=False))
    else:
        # Looped bodies: other chunk lengths (a looped body is correct for any RBLOCK).
        for rblock in (1024, 4096):
            if rblock < rnumel:
                add(dataclasses.replace(base, RBLOCK=rblock, persistent=False))
    return found


# ---------------------------------------------------------------------------- matmul templates

# Tilings of a product (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). The first is the one
# used where nothing is timed (Triton's interpreter): square 64 x 64 tiles, K in steps of 32, a
# 3-stage pipeline. Then larger tiles, and narrower ones for skinny products; then the tilings of
# large products (issue #40: with only 128 x 128 x 32 the template reached half of cuBLAS at
# 4096^3 on an H100): 128 x 128, 128 x 256 and 256 x 128 tiles with K in steps of 64, 8 warps and 3
# or 4 stages, as Inductor's and Triton's tutorials' H100 configs. Programs walk the tiles in
# groups of `MatmulConfig.GROUP_M` row tiles (8: the grouped, "swizzled" order), so a group's
# programs share tiles of A and B in L2. `max-autotune` times every one ([Note: matmul autotuning]).
MATMUL_TILINGS = ((64, 64, 32, 4, 3), (128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
                  (32, 64, 64, 4, 4), (64, 32, 64, 4, 4), (16, 64, 128, 4, 4),
                  (128, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
                  (128, 256, 64, 8, 4), (128, 256, 32, 8, 4))
# tl.dot takes no block dim under 16
MIN_DOT_BLOCK = 16
# The shared memory a tiling's pipeline may take: its stages' tiles of A and B, (BLOCK_M + BLOCK_N)
# x BLOCK_K elements each. An H100 gives a block 227 KiB; the rest is left to the epilogue's
# layout conversions. A tiling over it would fail to launch (float32's 128 x 256 x 64 tiles).
MATMUL_SHARED_MEMORY = 200 * 1024


def matmul_configs(m: int, n: int, k: int, dtype) -> list:
    """The tilings the Triton matmul template offers for an `[M, K] @ [K, N]` product, the one to
    use first: `MATMUL_TILINGS` with each block no larger than its dim needs (a product of 20 rows
    gets 32-row tiles), distinct, within `MATMUL_SHARED_MEMORY` for the operands' dtype; for a
    product of a few rows, the GEMV form's tilings first (`gemv_configs`)."""
    from kiln.codegen.ir import MatmulConfig
    itemsize = getattr(dtype, "itemsize", 4)
    found = gemv_configs(m, n, k, dtype)
    for block_m, block_n, block_k, warps, stages in MATMUL_TILINGS:
        config = MatmulConfig(BLOCK_M=_fit(block_m, m), BLOCK_N=_fit(block_n, n), BLOCK_K=_fit(block_k, k),
                              num_warps=warps, num_stages=stages)
        smem = (config.BLOCK_M + config.BLOCK_N) * config.BLOCK_K * itemsize * config.num_stages
        if config not in found and smem <= MATMUL_SHARED_MEMORY:
            found.append(config)
    return found


def _fit(block: int, size: int) -> int:
    return max(MIN_DOT_BLOCK, min(block, next_power_of_2(size)))


# ---------------------------------------------------------------------------- the GEMV form

# [Note: GEMV by default] A product of a few rows (decoding at batch 1: M = 1 token) reads its
# weight and little else; bench/gemv_probe.py measured on an H100 (bench/results/diagnostics/
# 20261207-1630_cuda_gemv_probe.txt) that a plain Triton GEMV ([Note: the GEMV form] in matmul.py)
# reads the weights of dolly-v2-3b's layers at M = 1 in 139 us where cuBLAS takes 156 (the
# copy-bandwidth floor: 140), and LLaMA-1.1B's in 76 us against 88: faster on all ten layer shapes
# but one tie (dolly fc2, 23.0 vs 23.1 us), taking 5-34% less time (each shape at its best of 16
# tilings; the rule below picks that tiling for 6 of the 10 shapes, and one the probe also ran for
# the others). So the Triton printer uses the GEMV form without max-autotune and without timing
# anything (`default_matmul_configs`) where that measurement speaks for it, and keeps cuBLAS
# elsewhere:
#
# - M <= GEMV_DEFAULT_ROWS (4). Measured at M = 1 only (where the printed kernel is the probe's
#   loop). The form loads each weight tile once and multiplies it by each row of A from registers,
#   so its memory traffic does not grow with M; its arithmetic does: M fused multiply-adds per
#   weight element, at 3.35 TB/s of bf16 weight about 1.7e12 M FMA/s, 20% of the H100's float32
#   rate at M = 4 and 40% at 8, besides each row's cross-warp row sum every K step (sm_90 text:
#   7 barriers an iteration at M = 1, 28 at 4). So 4, a guess to confirm on the GPU
#   (`python bench/gemv_probe.py --kiln --tokens 1,2,3,4`); up to GEMV_MAX_ROWS (8) the form is
#   only offered to max-autotune, which times it against cuBLAS. At M = 16 the probe's
#   tensor-core GEMV was no faster than cuBLAS (154 vs 157 us for dolly), so the form stops below
#   16. (On CUDA a product of 2^27 multiply-adds or more is padded to aligned sizes before this
#   rule sees it, [Note: aligned matmuls]: dolly's head at 3 or 4 rows becomes an 8-row product and
#   keeps cuBLAS; at one token no decoding product here is that large.)
# - the weight B is `GEMV_MIN_WEIGHT_BYTES` (1 MiB) or more, with N / 4 >= `GEMV_MIN_COLUMN_BLOCKS`
#   (132, an H100's SMs) column blocks: the probe's shapes are 8-100 MiB with N >= 2048; smaller
#   products are launch-bound, narrow ones leave SMs idle where cuBLAS splits K.
# - B contiguous along K (`F.linear`'s weight, read as `w.t()`), which `candidates` checks.
# - float16, bfloat16 or float32, one dtype (any template's rule); the probe ran bfloat16.
#
# The tiling is the probe's best ones, as a rule: BLOCK_N the widest of 16, 8, 4 that still makes
# `MIN_WIDE_PROGRAMS` (512, four a SM) programs, else 4 (the probe: 4 for N = 2048-2560, 8 for 7680,
# 16 for 10240-11264 and LLaMA's head; it preferred 4 for dolly's head, where 16 is the rule's);
# BLOCK_K 1 KiB of weight row a step when a row is longer than 4 KiB (512 bf16 elements for
# K = 2560-10240), else 512 B (256 for K = 2048), as 8 of the probe's 10 winners; 4 warps (8 won
# twice: LLaMA's down projection and head). Whether the four shapes off the rule lose much by it
# is for the GPU to say (`python bench/gemv_probe.py --kiln`).
#
# Products of one A are first offered to `default_sibling_gemv_config` as a group (the same rule on
# the group as a whole: [Note: sibling GEMVs] in kiln/codegen/matmul_templates.py); what is left
# comes here one product at a time.
GEMV_DEFAULT_ROWS = 4
GEMV_MAX_ROWS = 8
GEMV_MIN_WEIGHT_BYTES = 1 << 20
GEMV_MIN_COLUMN_BLOCKS = 132
GEMV_BLOCK_N = (16, 8, 4)
# (BLOCK_N, BLOCK_K, num_warps) max-autotune times besides the rule's: the probe's winners
GEMV_TILINGS = ((4, 256, 4), (4, 512, 4), (8, 512, 4), (16, 256, 4), (16, 512, 4), (4, 512, 8), (16, 512, 8))


def gemv_config(m: int, n: int, k: int, dtype, block_n: int | None = None, block_k: int | None = None,
                num_warps: int = 4):
    """The GEMV form's tiling for an `[M, K] @ [K, N]` product ([Note: GEMV by default]), or the one
    with the blocks given, each no larger than its dim needs."""
    from kiln.codegen.ir import MatmulConfig
    itemsize = getattr(dtype, "itemsize", 4)
    if block_n is None:
        block_n = next((b for b in GEMV_BLOCK_N if -(-n // b) >= MIN_WIDE_PROGRAMS), GEMV_BLOCK_N[-1])
    if block_k is None:
        block_k = (1024 if k * itemsize > 4096 else 512) // itemsize
    return MatmulConfig(BLOCK_M=next_power_of_2(m), BLOCK_N=min(block_n, next_power_of_2(n)),
                        BLOCK_K=min(block_k, next_power_of_2(k)), GROUP_M=1, num_warps=num_warps,
                        num_stages=3, form="gemv")     # 3: Triton's default, under which the probe ran


def gemv_configs(m: int, n: int, k: int, dtype) -> list:
    """The GEMV tilings max-autotune times for a product of `GEMV_MAX_ROWS` rows or fewer: the rule's
    first, then the probe's winners."""
    if m > GEMV_MAX_ROWS:
        return []
    found = [gemv_config(m, n, k, dtype)]
    for block_n, block_k, warps in GEMV_TILINGS:
        config = gemv_config(m, n, k, dtype, block_n, block_k, warps)
        if config not in found:
            found.append(config)
    return found


def default_matmul_configs(m: int, n: int, k: int, dtype) -> list:
    """The tilings used without max-autotune, untimed: the GEMV form's where it is confidently
    faster than cuBLAS ([Note: GEMV by default]), else none (the extern call)."""
    itemsize = getattr(dtype, "itemsize", 4)
    if (m > GEMV_DEFAULT_ROWS or k * n * itemsize < GEMV_MIN_WEIGHT_BYTES
            or -(-n // GEMV_BLOCK_N[-1]) < GEMV_MIN_COLUMN_BLOCKS):
        return []
    return [gemv_config(m, n, k, dtype)]


def default_sibling_gemv_config(m: int, ns, k: int, dtype):
    """The GEMV tiling of products of one `[M, K]` A and Bs of `ns` columns computed by one kernel
    ([Note: sibling GEMVs] in kiln/codegen/matmul_templates.py), or None where the group as a whole
    fails [Note: GEMV by default]'s rule: more than GEMV_DEFAULT_ROWS rows, under
    GEMV_MIN_WEIGHT_BYTES of weights together, or under GEMV_MIN_COLUMN_BLOCKS column blocks of 4
    together. BLOCK_N is the rule's (the widest of 16, 8, 4 still giving MIN_WIDE_PROGRAMS
    programs), counted over the kernel's programs: a block of one N covers every member of that N
    (gate and up: 2 x 5632 columns at 8, 704 programs of 16 weight rows each, as the rule tiles
    their concatenation, 11264 columns at 16), and the programs of the distinct Ns are stacked."""
    itemsize = getattr(dtype, "itemsize", 4)
    blocks = sum(-(-n // GEMV_BLOCK_N[-1]) for n in ns)
    if m > GEMV_DEFAULT_ROWS or k * sum(ns) * itemsize < GEMV_MIN_WEIGHT_BYTES or blocks < GEMV_MIN_COLUMN_BLOCKS:
        return None
    distinct = list(dict.fromkeys(ns))
    block_n = next((b for b in GEMV_BLOCK_N if sum(-(-n // b) for n in distinct) >= MIN_WIDE_PROGRAMS),
                   GEMV_BLOCK_N[-1])
    return gemv_config(m, max(distinct), k, dtype, block_n=block_n)


def template_launch(config: dict) -> LaunchConfig:
    """The launch of a template kernel whose source fixed its tiling (`MATMUL_CONFIG`, the fields of
    an `ir.MatmulConfig`): one tile a program ([Note: a template launches as a kernel of its programs])."""
    from kiln.codegen.ir import MatmulConfig
    tiling = MatmulConfig(**config)
    return LaunchConfig(XBLOCK=1, num_warps=tiling.num_warps, num_stages=tiling.num_stages, template=str(tiling))
