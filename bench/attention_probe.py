"""Why decoding's attention does or does not become kiln's template kernel on this device ([Note:
decode attention] in kiln/codegen/attention_templates.py): two layers of dolly's and LLaMA-1.1B's real
widths, bf16, a static-cache generate(); for each SDPA extern the pass sees, its op, operand shapes
and whether `_candidate` and `_template` took it; then the kernels built and the tokens against eager.

    python bench/attention_probe.py [--device cuda]"""
import argparse
import warnings

import torch

import kiln
from kiln.bench.accuracy import same_greedy_decode
from kiln.bench.decoding import MODELS
from kiln.bench.suites import ensure_torchvision_importable
from kiln.codegen import attention_templates as at
from kiln.codegen.lowering import bind_arguments
from kiln.codegen.matmul_padding import extern_name
from kiln.codegen.matmul_templates import static_operand

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
a = p.parse_args()
warnings.simplefilter("ignore")
ensure_torchvision_importable()
import transformers

seen = []
candidate, template = at._candidate, at._template


def traced_candidate(ctx, node, configs_for):
    found = candidate(ctx, node, configs_for)
    if hasattr(node, "op") and "attention" in extern_name(node):
        args = bind_arguments(node.op, tuple(node.args), dict(node.kwargs))
        operands = [f"{n}={args[n]} (buffer {[str(s) for s in ctx.buffers[args[n].name].sizes]}"
                    f"{'' if static_operand(args[n], ctx.buffers) is not None else ', NOT static'})"
                    for n in ("query", "key", "value", "attn_mask", "attn_bias") if getattr(args.get(n), "name", None)]
        seen.append(f"  {extern_name(node)} {'; '.join(operands)} -> candidate {found is not None}")
    return found


def traced_template(ctx, att, readers_ok, configs_for):
    made = template(ctx, att, readers_ok, configs_for)
    seen.append(f"  template {'made' if made is not None else 'refused'}")
    return made


at._candidate, at._template = traced_candidate, traced_template
for name in ("dolly", "llama-1b"):
    cls, config_cls, config = MODELS[name]
    torch.manual_seed(0)
    with torch.device(a.device):
        model = getattr(transformers, cls)(getattr(transformers, config_cls)(**{**config, "num_hidden_layers": 2}))
    model = model.to(torch.bfloat16).eval()
    ids = torch.randint(1, 1000, (1, 8), device=a.device)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12, do_sample=False,
              pad_token_id=0, cache_implementation="static", return_dict_in_generate=True, output_logits=True)
    kiln.reset()
    seen.clear()
    options = {} if a.device == "cuda" else {"triton_interpret": True}
    with torch.no_grad():
        expected = model.generate(ids, **kw)
        got = kiln.compile(model, mode="reduce-overhead", options=options).generate(ids, **kw)
        plain = kiln.compile(model, options=options).generate(ids, **kw)
    for mode, out in (("reduce-overhead", got), ("default mode", plain)):
        verdict = same_greedy_decode(model, ids, expected, out)     # [Note: greedy decoding's near ties]
        print(f"{name}, {mode}: tokens {'pass' if verdict.ok else 'FAIL'}: {verdict.detail or 'eager' + chr(39) + 's tokens'}")
    print("\n".join(dict.fromkeys(seen)))
