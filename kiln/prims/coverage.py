"""The coverage report: which ATen ops decompose into prims, which stay extern, which are missing.

    python -m kiln.prims.coverage

Measured against three lists: PyTorch's core ATen opset (every overload tagged `core`), the ATen
ops the models kiln targets are known to use (MODEL_OPS), and, when present, the op sweep's
results file (ops that reached the evaluator undecomposed).
"""
from __future__ import annotations

import collections
import json
import os
import sys

import torch

from kiln.prims import DECOMPOSITIONS, PRIMS, Category
from kiln.prims.externs import EXTERN_OF_ATEN

aten = torch.ops.aten

# ATen ops in the forward and backward traces of transformer LMs (GPT-2, BERT, T5, LLaMA,
# GPT-NeoX) and timm/torchvision CNNs and ViTs, fp32 and bf16 autocast, after CompositeImplicit
# decomposition (what a dispatch mode sees), on CPU and on CUDA (cuDNN batch norm).
MODEL_OPS = [
    aten.native_layer_norm.default, aten.native_layer_norm_backward.default, aten.gelu.default,
    aten.gelu_backward.default, aten.embedding.default, aten.embedding_dense_backward.default,
    aten._softmax.default, aten._softmax_backward_data.default, aten._log_softmax.default,
    aten._log_softmax_backward_data.default, aten.nll_loss_forward.default, aten.nll_loss_backward.default,
    aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit_no_training.default, aten._native_batch_norm_legit_functional.default,
    aten.native_batch_norm_backward.default, aten._batch_norm_with_update.default,
    aten.batch_norm_backward.default, aten.cudnn_batch_norm.default, aten.cudnn_batch_norm_backward.default,
    aten.convolution.default, aten.convolution_backward.default,
    aten.addmm.default, aten.mm.default, aten.bmm.default, aten.baddbmm.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_flash_attention_backward.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten.silu.default, aten.silu_backward.default, aten.hardswish.default, aten.hardswish_backward.default,
    aten.hardsigmoid.default, aten.hardsigmoid_backward.default, aten.relu.default, aten.threshold_backward.default,
    aten.tanh.default, aten.tanh_backward.default, aten.sigmoid.default, aten.sigmoid_backward.default,
    aten.avg_pool2d.default, aten.avg_pool2d_backward.default, aten.max_pool2d_with_indices.default,
    aten.max_pool2d_with_indices_backward.default, aten._adaptive_avg_pool2d.default,
    aten._adaptive_avg_pool2d_backward.default, aten.mean.dim, aten.var.correction, aten.var_mean.correction,
    aten.sum.dim_IntList, aten.sum.default, aten.where.self, aten.masked_fill.Scalar, aten.masked_fill.Tensor,
    aten.index.Tensor, aten.index_put.default, aten.index_select.default, aten.gather.default,
    aten.scatter.src, aten.scatter_add.default, aten.cat.default, aten.split.Tensor,
    aten.split_with_sizes.default, aten.slice_scatter.default, aten.select_scatter.default,
    aten.slice.Tensor, aten.select.int, aten.view.default, aten._unsafe_view.default, aten.permute.default,
    aten.transpose.int, aten.t.default, aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.clone.default, aten._to_copy.default, aten.native_dropout.default, aten.native_dropout_backward.default,
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.pow.Tensor_Scalar, aten.rsqrt.default,
    aten.sqrt.default, aten.neg.default, aten.exp.default, aten.log.default, aten.erf.default, aten.cos.default,
    aten.sin.default, aten.mean.default, aten.amax.default, aten.arange.start, aten.arange.default,
    aten.full.default, aten.zeros.default, aten.ones.default, aten.eq.Scalar, aten.lt.Tensor, aten.ge.Scalar,
    aten.bitwise_not.default, aten.logical_not.default, aten.tril.default, aten.triu.default, aten.rsub.Scalar,
    aten.cumsum.default, aten.native_group_norm.default, aten.native_group_norm_backward.default,
    aten.constant_pad_nd.default, aten.clamp.default, aten.clamp_min.default, aten.minimum.default,
    aten.new_zeros.default, aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
    aten.empty.memory_format, aten.alias.default, aten.detach.default, aten.copy.default, aten.bernoulli.p,
    aten.abs.default, aten.log1p.default, aten.lift_fresh.default, aten.sigmoid.default, aten.mish.default,
]


def core_aten_ops() -> list:
    """Every ATen overload tagged `core` (PyTorch's core ATen opset)."""
    ops = []
    for name in dir(aten):
        packet = getattr(aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags and not overload.endswith("out"):
                ops.append(op)
    return ops


def report(sweep_results: str | None = None) -> dict:
    extern_rows = [op for op in DECOMPOSITIONS if op in EXTERN_OF_ATEN]
    decomposed = [op for op in DECOMPOSITIONS if op not in EXTERN_OF_ATEN]
    core = core_aten_ops()
    core_missing = sorted(str(op) for op in core if op not in DECOMPOSITIONS)
    model_missing = sorted(str(op) for op in MODEL_OPS if op not in DECOMPOSITIONS)
    sweep_missing = collections.Counter()
    if sweep_results and os.path.exists(sweep_results):
        with open(sweep_results) as f:
            for r in json.load(f)["results"]:
                for reason in r["reasons"]:
                    if "undecomposed: " in reason:
                        sweep_missing[reason.split("undecomposed: ")[1].split()[0]] += 1
    by_category = collections.Counter(p.category.value for p in PRIMS.values())
    return {
        "prims": len(PRIMS), "prims_by_category": dict(by_category),
        "aten_ops_decomposed": len(decomposed), "aten_ops_extern": len(extern_rows),
        "core_aten_ops": len(core), "core_aten_missing": core_missing,
        "model_ops": len(MODEL_OPS), "model_ops_missing": model_missing,
        "sweep_undecomposed": dict(sweep_missing.most_common()),
    }


def main(argv=None) -> int:
    default = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "prims", "sweep_results.json")
    r = report(os.path.normpath(default))
    print(f"kiln prims: {r['prims']} prims " +
          ", ".join(f"{c}: {n}" for c, n in sorted(r["prims_by_category"].items())))
    print(f"ATen ops decomposed into prims: {r['aten_ops_decomposed']}")
    print(f"ATen ops run as extern prims:   {r['aten_ops_extern']}")
    print(f"core ATen opset: {r['core_aten_ops'] - len(r['core_aten_missing'])}/{r['core_aten_ops']} covered")
    for op in r["core_aten_missing"]:
        print(f"  missing (core): {op}")
    print(f"model ops: {r['model_ops'] - len(r['model_ops_missing'])}/{r['model_ops']} covered")
    for op in r["model_ops_missing"]:
        print(f"  missing (models): {op}")
    if r["sweep_undecomposed"]:
        print("undecomposed in the op sweep (op: OpInfo samples that reached it):")
        for op, n in r["sweep_undecomposed"].items():
            print(f"  missing (sweep): {op}  x{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
