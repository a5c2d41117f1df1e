"""Which part of kiln's static-cache decoding faults on the GPU: the in-place cache write (default
mode) or the CUDA-graph replay (reduce-overhead). A probe for issue #36; prints one line a form."""
import sys, traceback, warnings
import torch
import kiln
from kiln.bench.decoding import build

warnings.simplefilter("ignore")
model = build(sys.argv[1] if len(sys.argv) > 1 else "llama-1b", "cuda", torch.bfloat16)
ids = torch.randint(1, 1000, (1, 8), device="cuda")
kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0,
          cache_implementation="static")
with torch.no_grad():
    expected = model.generate(ids, **kw)
    for mode in (None, "reduce-overhead"):
        fast = kiln.compile(model, mode=mode)
        try:
            for call in range(3):
                got = fast.generate(ids, **kw)
                torch.cuda.synchronize()
                print(f"mode={mode} call {call}: same tokens {torch.equal(got, expected)}", flush=True)
        except Exception as e:
            print(f"mode={mode} call {call}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
            print("".join(traceback.format_exception(e)[-12:]), flush=True)
            break
