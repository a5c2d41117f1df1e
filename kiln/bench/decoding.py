"""The decoding benchmark: `generate()` at batch 1 and 16, short and long prompts, through eager,
torch.compile's recipes and kiln's, timed in one process against the memory-bandwidth floor of the
same card.

    python -m kiln.bench.decoding --device cuda --models dolly,llama-1b --cases 1x8+50,16x8+50,1x512+256 \\
        [--forms eager,inductor-static,kiln-static,kiln-dynamic] [--rounds 3] [--out DIR]

A case `BxP+N` is batch B, a prompt of P random tokens, N new tokens (greedy, `min_new_tokens=N`).
The forms, each a way a user decodes:

| form | what runs |
|---|---|
| `eager` | `model.generate(ids)`: transformers' default DynamicCache |
| `inductor-static` | `model.generate(ids, cache_implementation="static")`: transformers compiles the decoding step with torch.compile itself (its CompileConfig: Inductor, reduce-overhead): torch.compile's best recipe |
| `inductor-default` | `model.forward = torch.compile(model.forward)`, default cache |
| `kiln` | `kiln.compile(model).generate(ids)` |
| `kiln-static` | `kiln.compile(model, mode="reduce-overhead").generate(ids, cache_implementation="static")` |
| `kiln-dynamic` | `kiln.compile(model, mode="reduce-overhead").generate(ids)`: the default cache (kiln decodes it with a static one: [Note: reduce-overhead decodes with a static cache] in kiln/api.py) |

[Note: decoding figures] Every form of a case runs on the same model (one set of random weights),
first once untimed (its compiles: `first_call_s` is that call's seconds), then in rounds, the forms
interleaved so a drift of the card hits each alike. A logits processor records a CUDA event after
each step's logits (no synchronization, so transformers' deferred stop check still lets the host
run ahead), so one generate() gives both the time to the first token (from before the call to the
first step's event) and the decoding rate ((last - first) / (N - 1)); medians over rounds. The
floor of a step is the bytes it must read over the card's copy bandwidth, measured in the same run
(a device-to-device copy of 1 GiB, bytes read plus written over its time): every parameter once
(dolly-v2-3b's 5.55 GB: the issue's own count) plus the keys and values cached so far, averaged over
the N steps. `fraction` is the floor over the measured step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable

import torch

from kiln.bench.suites import ensure_torchvision_importable

MODELS = {   # (transformers class, config class, config): dolly-v2-3b's config.json; a LLaMA of 1.1B
    "dolly": ("GPTNeoXForCausalLM", "GPTNeoXConfig",
              dict(vocab_size=50280, hidden_size=2560, num_hidden_layers=32, num_attention_heads=32,
                   intermediate_size=10240, max_position_embeddings=2048, rotary_pct=0.25, use_parallel_residual=True)),
    "llama-1b": ("LlamaForCausalLM", "LlamaConfig",
                 dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                      num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)),
    # dolly's and LLaMA-1.1B's layers and structure at a width where a CPU runs the kernels in no
    # time: a decode step's host time (guards, kiln's runtime, generate()'s loop) as the full models'
    "narrow-dolly": ("GPTNeoXForCausalLM", "GPTNeoXConfig",
                     dict(vocab_size=1000, hidden_size=128, num_hidden_layers=32, num_attention_heads=4,
                          intermediate_size=512, max_position_embeddings=2048, rotary_pct=0.25, use_parallel_residual=True)),
    "narrow-llama": ("LlamaForCausalLM", "LlamaConfig",
                     dict(hidden_size=128, intermediate_size=352, num_hidden_layers=22, num_attention_heads=8,
                          num_key_value_heads=2, vocab_size=1000, max_position_embeddings=2048)),
    "tiny-neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig",     # for a CPU check of the script
                  dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=256, max_position_embeddings=1024, rotary_pct=0.25)),
}
FORMS = ("eager", "inductor-static", "inductor-default", "kiln", "kiln-static", "kiln-dynamic")


def parse_case(text: str) -> tuple[int, int, int]:
    batch, rest = text.split("x")
    prompt, new = rest.split("+")
    return int(batch), int(prompt), int(new)


def build(name: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    ensure_torchvision_importable()
    import transformers
    cls, config_cls, config = MODELS[name]
    torch.manual_seed(0)
    with torch.device(device):
        return getattr(transformers, cls)(getattr(transformers, config_cls)(**config)).to(dtype).eval()


class StepClock:
    """A logits processor that marks when each step's logits exist (see [Note: decoding figures])."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.marks: list = []

    def start(self):
        self.marks = [self._mark()]

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def __call__(self, input_ids, scores):
        self.marks.append(self._mark())
        return scores

    def seconds(self) -> list[float]:
        """Seconds from the start to each step's mark."""
        if not self.cuda:
            return [m - self.marks[0] for m in self.marks[1:]]
        torch.cuda.synchronize()
        return [self.marks[0].elapsed_time(m) / 1e3 for m in self.marks[1:]]


def forms(model: torch.nn.Module, names: list[str]) -> dict[str, Callable]:
    """name -> generate(ids, **kwargs) for that form, all on `model`'s weights."""
    import kiln
    made: dict[str, Callable] = {}
    for name in names:
        if name == "eager":
            made[name] = model.generate
        elif name == "inductor-static":
            made[name] = lambda ids, **kw: model.generate(ids, cache_implementation="static", **kw)
        elif name == "inductor-default":
            compiled = torch.compile(model.forward)
            made[name] = _with_forward(model, compiled)
        elif name == "kiln":
            made[name] = kiln.compile(model).generate
        elif name == "kiln-static":
            fast = kiln.compile(model, mode="reduce-overhead")
            made[name] = lambda ids, fast=fast, **kw: fast.generate(ids, cache_implementation="static", **kw)
        elif name == "kiln-dynamic":
            made[name] = kiln.compile(model, mode="reduce-overhead").generate
        else:
            raise SystemExit(f"unknown form {name!r}; forms are {FORMS}")
    return made


def _with_forward(model: torch.nn.Module, forward: Callable) -> Callable:
    def generate(ids, **kwargs):
        model.forward = forward
        try:
            return model.generate(ids, **kwargs)
        finally:
            del model.forward
    return generate


def copy_bandwidth(device: str) -> float:
    """Bytes read plus written per second by a 1 GiB device-to-device copy (median of 10)."""
    if not device.startswith("cuda"):
        return float("nan")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * src.numel() / statistics.median(times[2:])


def step_bytes(model: torch.nn.Module, batch: int, prompt: int, new: int) -> float:
    """Bytes a decoding step must read: every parameter, and the mean live KV cache over the steps."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = c.hidden_size // c.num_attention_heads
    per_token = 2 * c.num_hidden_layers * heads * head_dim * next(model.parameters()).element_size()
    mean_length = prompt + (new - 1) / 2
    return weights + batch * per_token * mean_length


def run_case(model, made: dict[str, Callable], batch: int, prompt: int, new: int, device: str, rounds: int,
             bandwidth: float) -> list[dict]:
    vocab = model.config.vocab_size
    ids = torch.randint(1, vocab, (batch, prompt), generator=torch.Generator().manual_seed(prompt)).to(device)
    clock = StepClock(device)
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                  pad_token_id=0, logits_processor=[clock])

    def once(generate):
        clock.start()
        with torch.no_grad():
            out = generate(ids, **kwargs)
        return out, clock.seconds()

    rows = {name: {"form": name, "batch": batch, "prompt": prompt, "new": new} for name in made}
    expected = None
    for name, generate in made.items():        # first calls: compiles
        started = time.perf_counter()
        try:
            out, _ = once(generate)
        except Exception as e:                   # a form that fails is a row that says why
            rows[name]["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            continue
        rows[name]["first_call_s"] = round(time.perf_counter() - started, 2)
        if expected is None and name == "eager":
            expected = out
        rows[name]["same_tokens_as_eager"] = None if expected is None else bool(torch.equal(out, expected))
    ttft: dict[str, list] = {n: [] for n in made}
    step: dict[str, list] = {n: [] for n in made}
    for _ in range(rounds):
        for name, generate in made.items():
            if "error" in rows[name]:
                continue
            _, marks = once(generate)
            ttft[name].append(marks[0])
            step[name].append((marks[-1] - marks[0]) / max(len(marks) - 1, 1))
    floor = step_bytes(model, batch, prompt, new) / bandwidth
    for name, row in rows.items():
        if "error" in row:
            continue
        row["ttft_ms"] = round(1e3 * statistics.median(ttft[name]), 2)
        row["decode_ms_per_token"] = round(1e3 * statistics.median(step[name]), 3)
        row["floor_ms"] = round(1e3 * floor, 3)
        row["fraction_of_floor"] = round(floor / statistics.median(step[name]), 3)
        row["tokens_per_s"] = round(batch / statistics.median(step[name]), 1)
    return list(rows.values())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="dolly,llama-1b")
    p.add_argument("--cases", default="1x8+50,16x8+50,1x512+256")
    p.add_argument("--forms", default="eager,inductor-static,kiln-static,kiln-dynamic")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    p.add_argument("--out", default=None, help="append each row as a JSON line to DIR/decoding.jsonl")
    a = p.parse_args(argv)
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if a.device.startswith("cuda") else torch.float32)
    bandwidth = copy_bandwidth(a.device)
    device_name = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(f"device {device_name}; copy bandwidth {bandwidth / 1e12:.3f} TB/s (read + written)", flush=True)
    results = []
    for model_name in a.models.split(","):
        model = build(model_name, a.device, dtype)
        made = forms(model, a.forms.split(","))
        for case in a.cases.split(","):
            for row in run_case(model, made, *parse_case(case), a.device, a.rounds, bandwidth):
                row.update(model=model_name, device=device_name, bandwidth_tb_s=round(bandwidth / 1e12, 3))
                results.append(row)
                print(json.dumps(row), flush=True)
                if a.out:
                    os.makedirs(a.out, exist_ok=True)
                    with open(os.path.join(a.out, "decoding.jsonl"), "a") as f:
                        f.write(json.dumps(row) + "\n")
        del model, made
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(table(results))


def table(rows: list[dict]) -> str:
    lines = ["| model | case | form | first call s | TTFT ms | ms/token | floor ms | of floor | same tokens |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        case = f"{r['batch']}x{r['prompt']}+{r['new']}"
        if "error" in r:
            lines.append(f"| {r['model']} | {case} | {r['form']} | error: {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['model']} | {case} | {r['form']} | {r['first_call_s']} | {r['ttft_ms']} | "
                     f"{r['decode_ms_per_token']} | {r['floor_ms']} | {r['fraction_of_floor']:.0%} | "
                     f"{r['same_tokens_as_eager']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
