"""What the static-cache decoding graphs of a small GPT-NeoX hold on the GPU: each captured graph's
inputs and the lines that move or advance the cache's length, and kiln's warnings. A probe for #36."""
import os, warnings
os.environ["KILN_LOG"] = "graphs"
import torch
import kiln
from kiln.bench.decoding import build

warnings.simplefilter("always")
model = build("tiny-neox", "cuda", torch.bfloat16)
ids = torch.randint(1, 1000, (1, 8), device="cuda")
kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0,
          cache_implementation="static")
with torch.no_grad():
    expected = model.generate(ids, **kw)
    got = kiln.compile(model, mode="reduce-overhead").generate(ids, **kw)
print("same tokens", torch.equal(got, expected))
from kiln.runtime.cudagraphs import CudaGraphed
import gc
for g in (o for o in gc.get_objects() if isinstance(o, CudaGraphed)):
    print(f"CUDA-graphed program: {g.recordings} recordings made, {g.replays} replays, disabled: {g.disabled}")
