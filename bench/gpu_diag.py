"""GPU diagnostics for timm models (issues 4, 5, 7): capture under fullgraph, an aot_eager training
step against eager, and the ATen ops that reach a backend undecomposed. Run on a CUDA machine:
`python bench/gpu_diag.py`; results in bench/results/diagnostics/20261129-190400_cuda_diagnostics.md."""
import copy, sys, time, traceback, torch, kiln
from kiln.bench.suites import import_timm
from kiln.bench.accuracy import same
from kiln.prims import undecomposed_ops
timm = import_timm()
dev = "cuda"
names = ['resnet50', 'vit_base_patch16_224', 'convnext_tiny', 'efficientnet_b0', 'mobilenetv3_large_100']
rows = []
def row(*a):
    print(*a, flush=True); rows.append(" | ".join(map(str, a)))
for name in names:
    torch.manual_seed(0)
    m = timm.create_model(name, pretrained=False).to(dev)
    x = torch.randn(8, 3, 224, 224, device=dev)
    # capture, fullgraph, eval
    try:
        kiln.reset(); graphs = []
        def rec(gm, ex): graphs.append(gm); return gm.forward
        c = kiln.compile(m.eval(), backend=rec, fullgraph=True)
        with torch.no_grad():
            ok = [torch.equal(c(x), m(x)) for _ in range(2)]
        row(name, "capture fullgraph", f"graphs={len(graphs)} equal={all(ok)}")
    except Exception as e:
        row(name, "capture fullgraph", f"FAIL {type(e).__name__}: {str(e)[:300]}")
    # aot_eager training step fp32
    try:
        kiln.reset()
        m1, m2 = copy.deepcopy(m).train(), copy.deepcopy(m).train()
        c = kiln.compile(m1, backend="aot_eager")
        l1 = c(x).float().pow(2).mean(); l1.backward()
        l2 = m2(x).float().pow(2).mean(); l2.backward()
        g1 = [p.grad for p in m1.parameters()]; g2 = [p.grad for p in m2.parameters()]
        b1 = [b for b in m1.buffers()]; b2 = [b for b in m2.buffers()]
        v = same([l2, g2, b2], [l1, g1, b1], tol=1e-4)
        exact = all(torch.equal(a, b) for a, b in zip(g1, g2))
        row(name, "aot_eager train fp32", f"same={v} exact_grads={exact}")
    except Exception as e:
        row(name, "aot_eager train fp32", f"FAIL {type(e).__name__}: {str(e)[:300]}")
    for prec in ("fp32", "bf16"):
        try:
            mt = copy.deepcopy(m).train()
            with torch.autocast(dev, torch.bfloat16, enabled=prec == "bf16"):
                u = undecomposed_ops(mt, x[:2])
            row(name, f"undecomposed {prec}", dict(u) if u else "none")
        except Exception as e:
            row(name, f"undecomposed {prec}", f"FAIL {type(e).__name__}: {str(e)[:300]}")
print("\n".join(rows))
