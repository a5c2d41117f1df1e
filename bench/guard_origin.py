"""Where a shape guard that pins a size comes from (issue #17): captures HF BERT-tiny with
`dynamic=True` (or GPT-2 training, `--model gpt2-train`, kiln's default `dynamic=None` over three
lengths) on the given device and, for each guard `Eq(symbol, value)` the ShapeEnv records,
prints the Python stack (the innermost frames) and the ATen op being dispatched to kiln's fakes.
A guard raised inside a C++ kernel shows the Python frame that called into it.

    python bench/guard_origin.py [--device cuda] [--precision bf16|fp32] [--model bert|gpt2-train]
"""
from __future__ import annotations

import argparse
import traceback

import sympy
import torch

import kiln
from kiln.bench.suites import ensure_torchvision_importable
from kiln.symbolic import fake, node, shape_env


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--model", default="bert", choices=("bert", "gpt2-train"))
    args = parser.parse_args()
    ensure_torchvision_importable()
    import transformers
    dispatching: list = []
    run = fake.FakeTensorMode.run

    def traced_run(self, func, a, k):
        dispatching.append(func)
        try:
            return run(self, func, a, k)
        finally:
            dispatching.pop()
    fake.FakeTensorMode.run = traced_run
    add_guard = shape_env.ShapeEnv.add_guard
    seen = set()

    def traced_add_guard(self, fact, kernel_location=None):
        pins = [a for a in sympy.preorder_traversal(fact) if isinstance(a, sympy.Eq)
                and any(isinstance(x, sympy.Symbol) for x in a.args) and any(x.is_Integer for x in a.args)]
        if pins and str(fact) not in seen:
            seen.add(str(fact))
            print(f"=== guard {fact} (kernel {kernel_location}); dispatching {dispatching[-3:]}")
            print("".join(traceback.format_stack(limit=8)[:-1]))
        return add_guard(self, fact, kernel_location)
    shape_env.ShapeEnv.add_guard = traced_add_guard
    dense = node.SymNode.is_non_overlapping_and_dense

    def traced_dense(self, sizes, strides):
        out = dense(self, sizes, strides)
        if not out.hint:
            print(f"--- is_non_overlapping_and_dense False at sizes {[s.hint for s in sizes]} strides "
                  f"{[s.hint for s in strides]} -> {out.expr}; dispatching {dispatching[-3:]}")
        return out
    node.SymNode.is_non_overlapping_and_dense = traced_dense

    from kiln.capture import examples as capture_examples
    run_example = capture_examples.Examples.run

    def traced_run_example(self, fn, a, k):
        if fn is torch.nn.functional.scaled_dot_product_attention:
            print(f"+++ sdpa args {[(type(x).__name__, getattr(x, 'shape', x), getattr(x, 'device', None)) for x in a]}"
                  f" kwargs {[(n, type(x).__name__, x if not isinstance(x, torch.Tensor) else x.shape) for n, x in k.items()]}")
        return run_example(self, fn, a, k)
    capture_examples.Examples.run = traced_run_example
    index = torch.SymInt.__index__

    def traced_index(self):
        print(f"*** SymInt.__index__ on {self}; Python caller:")
        print("".join(traceback.format_stack(limit=4)[:-1]))
        return index(self)
    torch.SymInt.__index__ = traced_index
    torch.manual_seed(0)
    if args.model == "gpt2-train":
        config = transformers.GPT2Config(n_layer=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(config).to(args.device)
        fast = kiln.compile(model, backend="eager")
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            for length in (128, 200, 256):
                ids = torch.randint(0, config.vocab_size, (4, length), device=args.device)
                fast(input_ids=ids, labels=ids).loss.backward()
        print("guards pinning a size:", len(seen))
        return
    config = transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=512, max_position_embeddings=512)
    model = transformers.BertForMaskedLM(config).to(args.device).eval()
    fast = kiln.compile(model, backend="eager", dynamic=True)
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    with torch.no_grad(), autocast:
        for length in (128, 200):
            fast(input_ids=torch.randint(0, 1000, (16, length), device=args.device))
    print("guards pinning a size:", len(seen))


if __name__ == "__main__":
    main()
