"""Writes at loaded indices on the GPU (issue #36, [Note: scatters write in place] in kiln/codegen/ir.py):
a static KV cache's update through kiln.compile with compiled Triton kernels (not the interpreter),
against eager, in float32 and bfloat16, over positions; an accumulating index_put with duplicates;
and the time of one decode-shaped write of every layer's key and value cache (dolly-v2-3b: 32
layers, 32 heads of 80, 2048 positions, bf16), kiln's scatter kernels against eager's index_copy_.

    python bench/scatter_probe.py
"""
import time

import torch

import kiln


class StaticCache(torch.nn.Module):
    def __init__(self, b, h, s, d, dtype):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(b, h, s, d, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(b, h, s, d, dtype=dtype))
        self.proj = torch.nn.Linear(d, d, dtype=dtype)

    def forward(self, q, k, v, cache_position, mask):
        self.k_cache.index_copy_(2, cache_position, self.proj(k))
        self.v_cache.index_copy_(2, cache_position, v)
        scores = q @ self.k_cache.transpose(-1, -2) / self.k_cache.shape[-1] ** 0.5
        return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ self.v_cache


def check_cache(dtype, tol):
    torch.manual_seed(0)
    eager, model = StaticCache(2, 4, 64, 32, dtype).cuda(), StaticCache(2, 4, 64, 32, dtype).cuda()
    model.load_state_dict(eager.state_dict())
    compiled = kiln.compile(model)
    with torch.no_grad():
        for position in (0, 1, 17, 63):
            q, k, v = (torch.randn(2, 4, 1, 32, device="cuda", dtype=dtype) for _ in range(3))
            pos = torch.tensor([position], device="cuda")
            mask = (torch.arange(64, device="cuda") <= position).view(1, 1, 1, 64)
            torch.testing.assert_close(compiled(q, k, v, pos, mask), eager(q, k, v, pos, mask), **tol)
            torch.testing.assert_close(model.k_cache, eager.k_cache, **tol)
            torch.testing.assert_close(model.v_cache, eager.v_cache, **tol)
    print(f"static cache {dtype}: same as eager over 4 positions")


def check_accumulate():
    def f(x, idx, v):
        x.index_put_((idx,), v, accumulate=True)
        return x * 1
    x = torch.zeros(64, 33, device="cuda")
    idx = torch.randint(0, 64, (4096,), device="cuda")
    v = torch.randn(4096, 33, device="cuda")
    xe = x.clone()
    expected = f(xe, idx, v)
    got = kiln.compile(f)(x, idx, v)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x, xe, rtol=1e-4, atol=1e-4)
    print("accumulating index_put, 4096 rows into 64: same as eager (atomic adds)")


def write_all_layers(caches, pos, new):
    for k_cache, v_cache in caches:
        k_cache.index_copy_(2, pos, new)
        v_cache.index_copy_(2, pos, new)
    return new.sum()


def time_writes():
    layers, heads, length, dim = 32, 32, 2048, 80
    caches = [(torch.zeros(1, heads, length, dim, device="cuda", dtype=torch.bfloat16),
               torch.zeros(1, heads, length, dim, device="cuda", dtype=torch.bfloat16)) for _ in range(layers)]
    new = torch.randn(1, heads, 1, dim, device="cuda", dtype=torch.bfloat16)
    compiled = kiln.compile(write_all_layers)
    for name, fn in (("eager", write_all_layers), ("kiln", compiled)):
        for step in range(5):
            fn(caches, torch.tensor([step], device="cuda"), new)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn(caches, torch.tensor([7], device="cuda"), new)
            torch.cuda.synchronize()
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        us = sum(e.device_time for e in events)
        kinds = sorted({e.name[:50] for e in events})
        print(f"{name}: {len(events)} kernels, {us:.0f} us of GPU time for {2 * layers} cache writes; kernels: {kinds[:4]}")
        torch.cuda.synchronize()
        started = time.perf_counter()
        for step in range(100):
            fn(caches, torch.tensor([step % length], device="cuda"), new)
        torch.cuda.synchronize()
        print(f"{name}: {(time.perf_counter() - started) * 1e4:.0f} us a call (wall, host included)")
    expected = torch.zeros(1, heads, length, dim, device="cuda", dtype=torch.bfloat16)
    expected.index_copy_(2, torch.arange(100, device="cuda"), new.expand(1, heads, 100, dim))
    assert all(torch.equal(k, expected) and torch.equal(v, expected) for k, v in caches)
    print("every layer's cache holds the new rows at positions 0..99 and nothing else")


if __name__ == "__main__":
    check_cache(torch.float32, dict(rtol=1e-4, atol=1e-4))
    check_cache(torch.bfloat16, dict(rtol=2e-2, atol=2e-2))
    check_accumulate()
    time_writes()
