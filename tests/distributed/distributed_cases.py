"""What each rank runs for test_distributed.py: eager and compiled training under DDP and FSDP2.

`run_rank(rank, world, store, out_dir, cases)` (the target of torch.multiprocessing) joins a gloo
group, runs each case (3 SGD steps of a zoo model, eager then compiled from the same weights and
rank-dependent data) and saves what the test compares into `out_dir/rank{r}.pt`: losses and
gradients of both runs, how many graphs the backend compiled, and the order in which the last
step's backward ran its compiled pieces and DDP launched its bucket all-reduces.
"""
from __future__ import annotations

import copy
import datetime
import os
import traceback
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln
from kiln import backends
from kiln.bench.zoo import ZOO, loss_of

STEPS = 3
BACKENDS = {"aot_eager": backends.aot_eager, "kiln": backends.kiln}   # capture + aot; the whole pipeline
BUCKET_MB = {"gpt2": 0.05, "resnet": 0.02, "mlp": 0.2}   # the test models hold 0.6, 0.08, 0.6 MiB of parameters


def _model(name: str, rank: int):
    model, inputs = ZOO[name].make("cpu")
    model.train()
    for m in model.modules():   # compiled dropout draws other random numbers than eager's
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    # each rank its own data, so the all-reduce changes the gradients
    g = torch.Generator().manual_seed(100 + rank)
    inputs = tuple(torch.randint_like(x, 0, 512, generator=g) if not x.is_floating_point()
                   else torch.randn(x.shape, generator=g) for x in inputs)
    return model, inputs


def _grad(p: torch.Tensor) -> torch.Tensor:
    g = p.grad
    return (g.to_local() if hasattr(g, "to_local") else g).detach().clone()


class Recorder:
    """A counting backend (aot_eager or kiln underneath), and the order of the backward's events."""

    def __init__(self, backend: str = "aot_eager"):
        self.graphs = 0
        self.events: list[str] = []
        self.compiler = BACKENDS[backend]

    def backend(self, gm, example_inputs):
        self.graphs += 1
        return self.compiler(gm, example_inputs)

    def comm_hook(self, state, bucket):
        self.events.append("allreduce")
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        return allreduce_hook(state, bucket)

    def watch_backward(self, loss: torch.Tensor):
        """A pre-hook on each compiled graph's backward node reachable from `loss`."""
        seen, todo = set(), [loss.grad_fn]
        while todo:
            fn = todo.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            if "CompiledFunction" in fn.name():
                fn.register_prehook(lambda *_: self.events.append("backward"))
            todo += [f for f, _ in fn.next_functions]


def _train(model, call, inputs, recorder: Recorder | None = None):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, grads = [], []
    for step in range(STEPS):
        loss = loss_of(call(*inputs))
        if recorder is not None:
            recorder.events.clear()
            recorder.watch_backward(loss)
        loss.backward()
        losses.append(loss.item())
        grads.append([_grad(p) for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return losses, grads


def ddp_case(name: str, form: str, split: bool, rank: int, backend: str = "aot_eager") -> dict:
    model, inputs = _model(name, rank)
    reference = copy.deepcopy(model)
    cap = BUCKET_MB[name]
    eager = _train(reference, DDP(reference, bucket_cap_mb=cap), inputs)
    rec = Recorder(backend)
    opts = {"ddp_split": split}
    if form == "outer":                     # kiln.compile(DDP(model)), as torch.compile documents
        ddp = DDP(model, bucket_cap_mb=cap)
        call = kiln.compile(ddp, backend=rec.backend, options=opts, fullgraph=True)   # the model is one graph
    else:                                   # DDP(kiln.compile(model))
        ddp = DDP(kiln.compile(model, backend=rec.backend, options=opts), bucket_cap_mb=cap)
        call = ddp
    ddp.register_comm_hook(None, rec.comm_hook)
    compiled = _train(model, call, inputs, rec)
    return {"eager": eager, "compiled": compiled, "graphs": rec.graphs, "events": list(rec.events)}


def fsdp_case(name: str, rank: int) -> dict:
    from torch.distributed.fsdp import fully_shard
    model, inputs = _model(name, rank)
    reference = copy.deepcopy(model)
    block_type = type(next(m for m in model.modules() if type(m).__name__ in ("GPT2Block", "BasicBlock")))
    for m in (reference, model):
        for block in [b for b in m.modules() if isinstance(b, block_type)]:
            fully_shard(block)
        fully_shard(m)
    eager = _train(reference, reference, inputs)
    rec = Recorder()
    compiled = _train(model, kiln.compile(model, backend=rec.backend), inputs)
    blocks = sum(isinstance(b, block_type) for b in model.modules())
    return {"eager": eager, "compiled": compiled, "graphs": rec.graphs, "blocks": blocks}


def explain_case(rank: int) -> dict:
    """What `kiln.explain` says of a DDP module: the split, piece by piece."""
    model, inputs = _model("gpt2", rank)
    report = kiln.explain(DDP(model, bucket_cap_mb=BUCKET_MB["gpt2"]), *inputs)
    with torch.no_grad():
        inference = kiln.explain(DDP(model, bucket_cap_mb=BUCKET_MB["gpt2"]), *inputs)
    return {"splits": [s.detail for s in report.splits], "text": str(report), "graphs": report.graph_count,
            "inference_splits": len(inference.splits)}


class RankReader(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        if dist.get_rank() == 0:
            x = x * 2
        return self.lin(x) * dist.get_world_size()


def rank_case(rank: int) -> dict:
    """A forward that reads the rank, and a recompile on rank 1 alone."""
    model = RankReader()
    x = torch.randn(3, 4)
    report = kiln.explain(model, x)
    compiled = kiln.compile(model, backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x)
        compiled(torch.randn(5, 4) if rank == 1 else x)
    return {"rank_guards": report.rank_guards, "text": str(report), "out": out.detach(), "expected": model(x).detach(),
            "warnings": [str(w.message) for w in caught]}


CASES = {
    "ddp_gpt2_outer": lambda r: ddp_case("gpt2", "outer", True, r),
    "ddp_gpt2_one_graph": lambda r: ddp_case("gpt2", "outer", False, r),
    "ddp_resnet_inner": lambda r: ddp_case("resnet", "inner", True, r),
    "ddp_mlp_kiln": lambda r: ddp_case("mlp", "outer", True, r, backend="kiln"),
    "fsdp_gpt2": lambda r: fsdp_case("gpt2", r),
    "fsdp_resnet": lambda r: fsdp_case("resnet", r),
    "explain": explain_case,
    "ranks": rank_case,
}


def run_rank(rank: int, world: int, store: str, out_dir: str, cases: list[str]) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if os.path.exists("/sys/class/net/lo"):   # gloo on loopback: containers' host names may not resolve
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    results = {}
    try:
        for case in cases:
            try:
                results[case] = CASES[case](rank)
            except Exception:
                results[case] = {"error": traceback.format_exc()}
            kiln.reset()
    finally:
        torch.save(results, f"{out_dir}/rank{rank}.pt")
        dist.destroy_process_group()
