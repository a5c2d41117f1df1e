"""Extern prims: ops a backend runs by calling the ATen kernel, never by generating code.

Matrix multiply, convolution, attention, sorting, linear algebra, FFTs and ops whose output size
depends on the data. Each extern mirrors one ATen overload: same schema, same meaning, reference =
the ATen kernel, meta rule = ATen's meta kernel (the ATen op applied to meta tensors). Keeping them
as prims (not bare ATen ops) lets a graph be checked to hold only `kiln_prims` ops, and a backend
finds every extern by `Category.EXTERN`.
"""
from __future__ import annotations

import torch

from kiln.prims import indexing  # noqa: F401  (defines index_put_, named in ATEN_OF_PRIM)
from kiln.prims.prim import Category, define
from kiln.symbolic.fake import alias_rule

aten = torch.ops.aten

# ATen overload: one-line doc. Names: the ATen name, plus `_<overload>` when not `.default`.
EXTERNS = {
    aten.mm.default: "matrix multiply (cuBLAS / MKL)",
    aten.bmm.default: "batched matrix multiply",
    aten.addmm.default: "beta * input + alpha * (m1 @ m2), rounded once as cuBLAS's / MKL's epilogue does",
    aten.baddbmm.default: "batched addmm, rounded once",
    aten.convolution.default: "N-d convolution, transposed or not, with groups",
    aten.convolution_backward.default: "gradients of convolution for input, weight and bias",
    aten._scaled_dot_product_flash_attention_for_cpu.default: "fused attention (CPU flash kernel)",
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: "gradient of CPU flash attention",
    aten._scaled_dot_product_flash_attention.default: "fused attention (CUDA flash kernel)",
    aten._scaled_dot_product_flash_attention_backward.default: "gradient of CUDA flash attention",
    aten._scaled_dot_product_efficient_attention.default: "fused attention (memory-efficient kernel)",
    aten._scaled_dot_product_efficient_attention_backward.default: "gradient of memory-efficient attention",
    aten._scaled_dot_product_cudnn_attention.default: "fused attention (cuDNN kernel)",
    aten._scaled_dot_product_cudnn_attention_backward.default: "gradient of cuDNN attention",
    aten.sort.default: "sort along a dim, with the permutation",
    aten.sort.stable: "stable sort along a dim, with the permutation",
    aten.topk.default: "k largest or smallest along a dim, with positions",
    aten.kthvalue.default: "k-th smallest along a dim, with its position",
    aten.mode.default: "most frequent value along a dim, with a position",
    aten.nonzero.default: "indices of non-zero elements (data-dependent size)",
    aten.masked_select.default: "elements where mask is true, flattened (data-dependent size)",
    aten._unique2.default: "unique elements, inverse and counts (data-dependent size)",
    aten.unique_consecutive.default: "collapse consecutive equal elements (data-dependent size)",
    aten.unique_dim.default: "unique slices along a dim, inverse and counts (data-dependent size)",
    aten.repeat_interleave.Tensor: "indices repeated by counts (data-dependent size)",
    aten.searchsorted.Tensor: "insertion positions into a sorted sequence",
    aten.histc.default: "histogram with equal-width bins",
    aten.bincount.default: "count of each non-negative integer (data-dependent size)",
    aten.multinomial.default: "sample indices from categorical distributions",
    aten._fft_r2c.default: "real-to-complex FFT",
    aten._fft_c2r.default: "complex-to-real FFT",
    aten._fft_c2c.default: "complex-to-complex FFT",
    aten._linalg_svd.default: "singular value decomposition",
    aten._linalg_eigh.default: "eigendecomposition of a Hermitian matrix",
    aten.linalg_eig.default: "eigendecomposition of a general matrix",
    aten.linalg_cholesky_ex.default: "Cholesky factorization",
    aten.linalg_lu_factor_ex.default: "LU factorization with pivots",
    aten.linalg_lu.default: "LU factorization into P, L, U",
    aten.linalg_lu_solve.default: "solve with an LU factorization",
    aten.lu_unpack.default: "unpack an LU factorization into P, L, U",
    aten._linalg_solve_ex.default: "solve a linear system",
    aten.linalg_inv_ex.default: "matrix inverse",
    aten._linalg_det.default: "determinant",
    aten._linalg_slogdet.default: "sign and log of the absolute determinant",
    aten.linalg_qr.default: "QR factorization",
    aten.geqrf.default: "QR factorization in Householder form",
    aten.ormqr.default: "multiply by Q of a Householder QR",
    aten.linalg_householder_product.default: "Q from Householder reflectors",
    aten.linalg_solve_triangular.default: "solve a triangular system",
    aten.triangular_solve.default: "solve a triangular system (legacy form)",
    aten.cholesky_solve.default: "solve with a Cholesky factor",
    aten.cholesky_inverse.default: "inverse from a Cholesky factor",
    aten.linalg_ldl_factor_ex.default: "LDL factorization",
    aten.linalg_ldl_solve.default: "solve with an LDL factorization",
    aten.linalg_lstsq.default: "least-squares solution",
    aten.linalg_matrix_exp.default: "matrix exponential",
    aten.view_as_real.default: "a complex tensor viewed as (..., 2) reals",
    aten.view_as_complex.default: "a (..., 2) real tensor viewed as complex",
    aten.nonzero_static.default: "indices of non-zero elements, padded to a static size",
    aten.cholesky.default: "Cholesky factorization (legacy form)",
    aten.linalg_pinv.atol_rtol_tensor: "pseudo-inverse",
    aten.histogram.bin_ct: "histogram with a bin count (data-dependent edges)",
    aten._histogramdd_bin_edges.default: "bin edges of a multi-dimensional histogram",
    aten._histogramdd_from_bin_cts.default: "multi-dimensional histogram from bin counts",
    aten._embedding_bag.default: "embedding bags with sum, mean or max pooling over offsets",
    aten._embedding_bag_forward_only.default: "embedding bags, inference form",
    aten._embedding_bag_backward.default: "gradient of embedding bags",
    aten._embedding_bag_per_sample_weights_backward.default: "gradient of embedding-bag sample weights",
    aten._ctc_loss.default: "connectionist temporal classification loss",
    aten._ctc_loss_backward.default: "gradient of the CTC loss",
}

EXTERN_OF_ATEN: dict = {}


def extern_name(overload) -> str:
    packet, overload_name = overload._schema.name.split("::")[1], overload._overloadname
    return packet if overload_name == "default" else f"{packet}_{overload_name}"


def _define_extern(overload, doc: str):
    name = extern_name(overload)
    schema = str(overload._schema)
    # "aten::sort.stable(Tensor self, ...)" -> "sort_stable(Tensor self, ...)"
    schema = name + schema[schema.index("("):]
    # ATen's kernel is both the reference (real tensors) and the meta rule (meta tensors).
    return define(schema, Category.EXTERN, doc, overload, overload)


for _overload, _doc in EXTERNS.items():
    EXTERN_OF_ATEN[_overload] = _define_extern(_overload, _doc)
    # an output size known only at run time: on fakes, the ATen overload's unbacked-size rule
    alias_rule(EXTERN_OF_ATEN[_overload], _overload)

# prim -> the ATen overload a host program calls for it, skipping the custom op's Python dispatch
# (tens of microseconds a call): every extern, and index_put_, which is ATen's in-place index_put
# on the indices kiln's prims take (where codegen's scatter kernel does not take it: lowering_scatter.py)
ATEN_OF_PRIM: dict = {prim: overload for overload, prim in EXTERN_OF_ATEN.items()}
ATEN_OF_PRIM[torch.ops.kiln_prims.index_put_.default] = aten.index_put_.default
