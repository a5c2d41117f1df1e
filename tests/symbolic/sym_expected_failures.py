"""The op_db entries whose fake run disagrees with eager (symbolic area), each with its reason.

One file, read by test_sym_op_sweep.py (CI subset: an expected failure that starts passing is an
error, so this list stays true) and checked against the committed full sweep
(results/op_sweep.md, made by sym_op_sweep.py).
"""

_NO_META_CHECK = ("torch's meta kernel does not check {what}, so the fake run records no guard "
                  "for it; at the grown size the guard accepts and eager raises")
_SYMBOLIC_ASSERT = ("the op's kernel cannot take symbolic sizes on meta tensors: torch raises an "
                    "internal assert (dispatch_on_subclass) from C++; static sizes work")

EXPECTED_FAILURES: dict[str, str] = {
    "nn.functional.conv_transpose1d": _NO_META_CHECK.format(what="input channels vs weight"),
    "nn.functional.conv_transpose2d": _NO_META_CHECK.format(what="input channels vs weight"),
    "nn.functional.conv_transpose3d": _NO_META_CHECK.format(what="input channels vs weight"),
    "select_scatter": _NO_META_CHECK.format(what="src size vs the selected slice"),
    "index_add": _NO_META_CHECK.format(what="source shape vs self outside `dim`"),
    "index_reduce.mean": _NO_META_CHECK.format(what="source shape vs self outside `dim`"),
    "index_reduce.prod": _NO_META_CHECK.format(what="source shape vs self outside `dim`"),
    "index_reduce.amin": _NO_META_CHECK.format(what="source shape vs self outside `dim`"),
    "index_reduce.amax": _NO_META_CHECK.format(what="source shape vs self outside `dim`"),
    "_segment_reduce.lengths": ("the valid data size depends on the values of `lengths` "
                                "(data-dependent), which no shape guard can express"),
    "nn.functional.fractional_max_pool3d": _SYMBOLIC_ASSERT,
    "hash_tensor": _SYMBOLIC_ASSERT,
    "nn.functional.ctc_loss": _SYMBOLIC_ASSERT,
    "svd_lowrank": ("torch's meta kernel for linalg_qr/svd gives a column-major (Fortran) stride "
                    "where CPU LAPACK returns row-major for this output; sizes and dtypes agree"),
    "pca_lowrank": ("same as svd_lowrank (built on it): meta strides differ from CPU LAPACK's "
                    "for the third output"),
    "linalg.eig": ("torch's meta kernel for linalg_eig gives the eigenvectors row-major strides; "
                   "CPU LAPACK returns them column-major"),
    "resize_": ("with a symbolic size, torch's resize_ kernel sets the sizes of its argument "
                "directly, which a wrapper subclass refuses; static sizes work (growing ones too)"),
}
