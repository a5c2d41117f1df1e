"""Data-parallel training of a GPT-2-style model with `kiln.compile(DDP(model))`, launched by torchrun.

    torchrun --nproc_per_node 2 examples/ddp_train.py                       # CPU, gloo: a small model
    torchrun --nproc_per_node 1 examples/ddp_train.py --device cuda --steps 30 --compare --bucket-view
    torchrun --nproc_per_node 8 examples/ddp_train.py --device cuda --layers 12 --dim 768

Each rank builds the same model (seeded), wraps it in DistributedDataParallel and compiles that:
kiln runs DDP's own forward and captures the model's, cutting the graph at DDP's gradient buckets
so each bucket's all-reduce overlaps the backward of earlier layers (`--one-graph` keeps one
graph; so does a world size of 1, where there is nothing to overlap). Every rank trains on its own batch. It prints the loss, the median step time after
warm-up and, with `--compare`, the median step time of the same model compiled without DDP,
timed in the same rounds (a DDP step, then a plain step), and their ratio. `KILN_LOG=graphs`
prints where the graph was cut (a line per piece: its parameters and bytes).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln
from kiln.bench.models.language import GPT2LM, LMSize
from kiln.bench.models.vision import init_weights


def build(args, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    model = GPT2LM(LMSize(vocab=args.vocab, dim=args.dim, layers=args.layers, heads=args.heads, max_len=args.seq),
                   dropout=0.0)
    init_weights(model)
    return model.to(device).train()


def batch(args, rank: int, step: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)


class Trainer:
    """One model, its compiled form and optimizer; `step` runs one timed training step."""

    def __init__(self, model, compiled, args, device):
        self.model, self.compiled, self.args, self.device = model, compiled, args, device
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")

    def step(self, ids: torch.Tensor) -> tuple[float, torch.Tensor]:
        sync(self.device)
        start = time.perf_counter()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.args.bf16):
            logits = self.compiled(ids)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        sync(self.device)
        return time.perf_counter() - start, loss.detach()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--steps", type=int, default=10, help="timed steps after --warmup")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (the first one compiles)")
    p.add_argument("--compare", action="store_true", help="also time the model compiled without DDP")
    p.add_argument("--one-graph", action="store_true", help="options={'ddp_split': False}: no cut at buckets")
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP's bucket_cap_mb (default: DDP's 25)")
    p.add_argument("--bucket-view", action="store_true",
                   help="DDP's gradient_as_bucket_view=True: gradients live in the buckets (no copies)")
    p.add_argument("--backend", default="kiln")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast (default: on for cuda)")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--dim", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    args = p.parse_args()
    cuda = args.device == "cuda"
    # GPT-2 small on the GPU; a model that trains in seconds on the CPU
    for name, gpu, cpu in (("layers", 12, 2), ("dim", 768, 64), ("heads", 12, 4), ("vocab", 50257, 512),
                           ("seq", 512, 32), ("batch", 8, 4)):
        if getattr(args, name) is None:
            setattr(args, name, gpu if cuda else cpu)
    if args.bf16 is None:
        args.bf16 = cuda

    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    if "WORLD_SIZE" not in os.environ:   # run without torchrun: a group of one
        os.environ.update(WORLD_SIZE="1", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    world = dist.get_world_size()

    model = build(args, device)
    ddp_kwargs = {"device_ids": [local_rank]} if cuda else {}
    if args.bucket_cap_mb is not None:
        ddp_kwargs["bucket_cap_mb"] = args.bucket_cap_mb
    if args.bucket_view:
        ddp_kwargs["gradient_as_bucket_view"] = True
    ddp = DDP(model, **ddp_kwargs)
    options = {"ddp_split": not args.one_graph}
    trainers = {"DDP compiled": Trainer(model, kiln.compile(ddp, backend=args.backend, options=options), args, device)}
    if args.compare:
        plain = build(args, device)
        trainers["compiled, no DDP"] = Trainer(plain, kiln.compile(plain, backend=args.backend), args, device)

    times: dict[str, list[float]] = {name: [] for name in trainers}
    for step in range(args.warmup + args.steps):
        ids = batch(args, rank, step, device)
        for name, trainer in trainers.items():   # one round: a step of each, so both see the same machine
            seconds, loss = trainer.step(ids)
            if step >= args.warmup:
                times[name].append(seconds)
            if name == "DDP compiled" and (step == 0 or step == args.warmup + args.steps - 1) and rank == 0:
                print(f"step {step}: loss {loss.item():.4f}" + (" (includes compiling)" if step == 0 else ""))
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"world size {world}, {args.device}, {params / 1e6:.1f}M parameters, batch {args.batch}x{args.seq} "
              f"per rank, bf16 autocast {args.bf16}, ddp_split {not args.one_graph}")
        medians = {name: statistics.median(t) for name, t in times.items() if t}
        for name, m in medians.items():
            print(f"{name} step: {m * 1e3:.2f} ms (median of {len(times[name])})")
        if len(medians) == 2:
            a, b = medians.values()
            print(f"DDP / no DDP: {a / b:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
