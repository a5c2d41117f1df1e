"""The warm start of a captured graph ([Note: warm start of a captured graph] in
kiln/pipeline/warm_start.py): a second process traces, lowers and compiles nothing, and its
training step still equals eager's (outputs, gradients, BatchNorm's running statistics)."""
import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import torch, kiln
    from kiln.aot import runtime
    from kiln.codegen import compile as c
    traced, lowered = [], []
    orig_trace, orig_lower = runtime.trace_joint, c.lower_graph
    runtime.trace_joint = lambda *a, **k: (traced.append(1), orig_trace(*a, **k))[1]
    c.lower_graph = lambda *a: (lowered.append(1), orig_lower(*a))[1]

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10), torch.nn.LayerNorm(10)).train()
    x = torch.randn(4, 3, 6, 6)
    ref, model = make(), make()
    want = ref(x); want.sum().backward()
    compiled = kiln.compile(model)
    got = compiled(x); got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    for a, b in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(a, b)
    # the same graph without grad is another entry (no backward): not the training one
    model.eval(); ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-5)
    # an embedding's backward calls one of kiln's own ops (kiln_prims), which a warm start links too
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4)
    ids = torch.tensor([[1, 2, 2], [9, 0, 1]])
    got = kiln.compile(emb)(ids); got.sum().backward()
    grad = emb.weight.grad.clone(); emb.weight.grad = None
    want = emb(ids); want.sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, emb.weight.grad)
    print("traced", len(traced), "lowered", len(lowered))
""")


def _cold_then_warm(program: str, cache) -> list[subprocess.CompletedProcess]:
    """`program` run by two processes in turn with one (empty at first) cache directory; both succeed."""
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("KILN_DISABLE_CACHE", None)
    runs = [subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, cwd=str(ROOT))
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    return runs


def test_a_second_process_traces_and_lowers_nothing(tmp_path):
    cold, warm = (r.stdout.split() for r in _cold_then_warm(CHILD, tmp_path))
    assert int(cold[1]) >= 3 and int(cold[3]) >= 5, cold      # train (fw + bw), eval, embedding (fw + bw)
    assert warm[1] == "0" and warm[3] == "0", warm
    assert len(list((tmp_path / "aot").iterdir())) == int(cold[1])


ZOO_CHILD = textwrap.dedent("""
    import sys, torch, kiln
    from kiln.bench.zoo import ZOO, loss_of
    for name, train in (("resnet", True), ("gpt2", False), ("llama", False)):
        ref, inputs = ZOO[name].make("cpu", size="test")
        model, _ = ZOO[name].make("cpu", size="test")
        model.load_state_dict(ref.state_dict())
        ref.train(train); model.train(train)
        with torch.set_grad_enabled(train):
            want, got = ref(*inputs), kiln.compile(model)(*inputs)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            if train:
                loss_of(want).backward(); loss_of(got).backward()
                for a, b in zip(model.parameters(), ref.parameters()):
                    torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-4)
                for a, b in zip(model.buffers(), ref.buffers()):
                    torch.testing.assert_close(a, b)
    print("dynamo", "torch._dynamo" in sys.modules)
""")


def test_a_warm_start_of_the_zoo_imports_no_dynamo(tmp_path):
    """[Note: meta rules without torch's refs]: capture, all a warm start runs of the compiler,
    computes its fake tensors' metadata without torch's refs, whose first call imports torch._dynamo
    (about a second); the second process still equals eager."""
    runs = _cold_then_warm(ZOO_CHILD, tmp_path)
    assert runs[1].stdout.split()[-1] == "False", runs[1].stdout


CONCRETE_CHILD = textwrap.dedent("""
    import torch, kiln
    import kiln.pipeline as pipeline
    from kiln.aot import runtime
    told, traced = [], []
    wrap, trace = pipeline._wrap, runtime.trace_joint
    pipeline._wrap = lambda options, program, meta, on_cuda: (told.append(meta.get("kiln_concrete_size")),
                                                              wrap(options, program, meta, on_cuda))[1]
    runtime.trace_joint = lambda *a, **k: (traced.append(1), trace(*a, **k))[1]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model)(x), model(x))
    print(len(traced), told[0])
""")


def test_a_warm_start_tells_the_forward_program_which_inputs_have_concrete_sizes(tmp_path):
    """forward_meta's `kiln_concrete_size` (the inputs a CUDA graph compares only by address) is kept
    with the warm-start entry: a second process, which traces nothing, is told what the first was."""
    cold, warm = (r.stdout.strip() for r in _cold_then_warm(CONCRETE_CHILD, tmp_path))
    assert cold == "1 (0, 1, 2)" and warm == "0 (0, 1, 2)", (cold, warm)
