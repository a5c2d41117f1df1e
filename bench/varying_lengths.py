"""Two of issue #17's checks of lengths that change, as users write them, in one process:

- GPT-2 training (`GPT2LMHeadModel`, loss and backward) over five sequence lengths, kiln's default
  `dynamic=None`: how many graphs it compiled, and each length's loss and gradients against eager
  by the benchmark's accuracy rule (RMSE against a float64 run);
- the seed's form `model = kiln.compile(model); model.generate(ids, max_length=...)` on a GPT-NeoX
  of dolly-v2-3b's shape (random weights, bf16, numerics="eager"), two prompt lengths times two
  max_lengths: the graphs compiled across the four, and whether each gives eager's tokens.

    python bench/varying_lengths.py [--device cuda] [--size full|tiny] [--json FILE]
"""
from __future__ import annotations

import argparse
import copy
import json

import torch

import kiln
from kiln import backends
from kiln.bench.accuracy import same, tolerance
from kiln.bench.suites import ensure_torchvision_importable
from kiln.config import Options

GPT2_LENGTHS = (128, 200, 256, 317, 384)
PROMPTS, MAX_LENGTHS = (16, 24), (48, 80)


def _counting(numerics: str = "fast"):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(backends.resolve("kiln", Options(numerics=numerics))(gm, example_inputs))
        return graphs[-1]
    return backend, graphs


def _loss_and_grads(model, ids) -> list:
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return [loss.detach()] + [p.grad for p in model.parameters()]


def gpt2_training(device: str, tiny: bool, batch: int) -> dict:
    import transformers
    torch.manual_seed(0)
    config = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0) if not tiny else \
        transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=512,
                                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).to(device)
    reference = copy.deepcopy(model).double()
    backend, graphs = _counting()
    compiled = kiln.compile(copy.deepcopy(model), backend=backend)
    rows = []
    for length in GPT2_LENGTHS:
        ids = torch.randint(0, config.vocab_size, (batch, length), device=device)
        verdict = same(_loss_and_grads(model, ids), _loss_and_grads(compiled, ids),
                       _loss_and_grads(reference, ids), tol=tolerance("hf", "train", "fp32"))
        rows.append({"length": length, "graphs": len(graphs), "accuracy": "pass" if verdict.ok else verdict.detail})
        print(f"  GPT-2 training, length {length}: graphs so far {len(graphs)}, "
              f"accuracy {'pass' if verdict.ok else 'FAIL ' + verdict.detail}")
    return {"check": "gpt2_training", "graphs": len(graphs), "rows": rows}


def dolly_generate(device: str, tiny: bool) -> dict:
    import transformers
    from bench.generate import SIZES
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SIZES["tiny" if tiny else "dolly"]))
    model = model.to(dtype).eval()
    backend, graphs = _counting(numerics="eager")
    compiled = kiln.compile(model, backend=backend)       # the seed's form: the module, then generate()
    rows = []
    for prompt in PROMPTS:
        ids = torch.randint(0, model.config.vocab_size, (1, prompt), device=device)
        for max_length in MAX_LENGTHS:
            with torch.no_grad():
                want = model.generate(ids, max_length=max_length, min_length=max_length, do_sample=False)
                got = compiled.generate(ids, max_length=max_length, min_length=max_length, do_sample=False)
            rows.append({"prompt": prompt, "max_length": max_length, "graphs": len(graphs),
                         "eager_tokens": bool(torch.equal(got, want))})
            print(f"  generate, prompt {prompt}, max_length {max_length}: graphs so far {len(graphs)}, "
                  f"eager's tokens {torch.equal(got, want)}")
    return {"check": "dolly_generate", "graphs": len(graphs), "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", default="full", choices=("full", "tiny"))
    p.add_argument("--batch", type=int, default=4, help="GPT-2 training batch")
    p.add_argument("--only", choices=("gpt2", "generate"), help="run one of the two checks")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    ensure_torchvision_importable()
    tiny = a.size == "tiny"
    results = ([gpt2_training(a.device, tiny, a.batch)] if a.only != "generate" else []) + \
        ([dolly_generate(a.device, tiny)] if a.only != "gpt2" else [])
    for r in results:
        if r["check"] == "gpt2_training":
            print(f"GPT-2 training over {len(GPT2_LENGTHS)} lengths: {r['graphs']} graphs (target <= 2), "
                  f"accuracy {'pass' if all(row['accuracy'] == 'pass' for row in r['rows']) else 'FAIL'}")
        else:
            print(f"generate() over prompts {PROMPTS} x max_length {MAX_LENGTHS}: {r['graphs']} graphs "
                  f"(target <= 2), eager's tokens {all(row['eager_tokens'] for row in r['rows'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "size": a.size, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
