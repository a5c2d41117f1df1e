"""Performance rewrites, each against eager: max pooling as one fused pointwise pass (no gather),
channels-last buffers around CPU convolutions (kiln.codegen.layout), common buffers computed once
(kiln.codegen.dedupe)."""
import torch
import torch.nn.functional as F

import kiln
from kiln.codegen import dedupe, ir, layout


def _compile_and_compare(fn, *inputs, rtol=1e-4, atol=1e-5, options=None):
    kiln.reset()
    compiled = kiln.compile(fn, backend="kiln", options=options)
    with torch.no_grad():
        got = compiled(*inputs)
        ref = fn(*[x.double() for x in inputs])
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=atol, equal_nan=True)
    return compiled


def _record_graphs(monkeypatch):
    """The loop IR of every graph after the layout pass."""
    import kiln.codegen.compile as compile_module
    seen = []

    def recording(graph, free_outputs=frozenset()):
        out = layout.optimize_layouts(graph, free_outputs)
        seen.append(out)
        return out
    monkeypatch.setattr(compile_module, "optimize_layouts", recording)
    return seen


def test_max_pool_fuses_with_its_producer_without_a_gather(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    graphs = _record_graphs(monkeypatch)

    def f(x, scale):
        return F.max_pool2d(torch.relu(x * scale), kernel_size=3, stride=2, padding=1)
    x = torch.randn(2, 3, 11, 9)
    x[0, 0, 0, 0] = float("nan")                      # NaN propagates as in eager
    x[1, 2] = -1.0                                    # a window of equal values
    _compile_and_compare(f, x, torch.randn(1, 3, 1, 1))
    (graph,) = graphs
    loads = [ld for n in graph.nodes if isinstance(n, ir.ComputedBuffer) for ld in ir.loads_of(n.body.expr)]
    assert loads and not any(ld.indirect for ld in loads), "max pooling still gathers"
    assert not any(isinstance(n, ir.ComputedBuffer) and isinstance(n.body, ir.Reduction) for n in graph.nodes)


def test_max_pool_dilation_ceil_mode_and_1d_3d():
    _compile_and_compare(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, dilation=2, ceil_mode=True),
                         torch.randn(2, 4, 13, 10))
    _compile_and_compare(lambda x: F.max_pool1d(x, 2), torch.randn(2, 3, 9))
    _compile_and_compare(lambda x: F.max_pool3d(x, 2, stride=1), torch.randn(1, 2, 4, 5, 3))


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.down = torch.nn.Conv2d(8, 8, 1, stride=2)

    def forward(self, x):
        y = F.max_pool2d(torch.relu(self.bn(self.conv1(x))), 3, 2, 1)
        z = torch.relu(self.conv2(y) + y)
        return self.down(z).mean((2, 3))


def test_convolutions_read_and_write_channels_last(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    graphs = _record_graphs(monkeypatch)
    model = _Block().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 12, 12)
    kiln.reset()
    compiled = kiln.compile(model, backend="kiln")
    with torch.no_grad():
        got, ref = compiled(x), model(x)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    (graph,) = graphs
    buffers = graph.buffer_map()
    convs = [n for n in graph.nodes if layout._is_convolution(n)]
    assert len(convs) == 3
    assert graph.inputs[0] == "arg0" and graph.buffer_map()["arg0"].strides == (432, 144, 12, 1)
    for conv in convs:         # the first reads a channels-last copy of the graph input
        for name in (conv.args[0].name, conv.outputs[0]):
            assert buffers[name].strides == layout.channels_last_strides(buffers[name].sizes), name
        weight = buffers[conv.args[1].name]   # a channels-last copy too (ATen would clone it per call)
        assert layout._is_channels_last(weight), weight
    assert sum(conv.args[1].name.endswith("_nhwc") for conv in convs) == 2   # the 1x1 weight needs none


def _record_sources(monkeypatch):
    """The C++ source of every module kiln prints."""
    from kiln.codegen import cpp
    seen = []
    original = cpp.print_module

    def recording(kernels, buffers):
        seen.append(original(kernels, buffers))
        return seen[-1]
    monkeypatch.setattr(cpp, "print_module", recording)
    return seen


def test_channels_last_max_pool_indexes_without_div_mod_and_selects(monkeypatch):
    """Max pooling of a channels-last buffer: the window's clamped indices (`Max(0, 2*h - 1)`) are
    bounded, so the relaid loads lose their div/mod, and the padded window's loads, provably in
    bounds, print as selects that vectorize."""
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    sources = _record_sources(monkeypatch)
    def f(x, w):
        return F.max_pool2d(torch.relu(F.conv2d(x, w, padding=1)), 3, 2, 1) * 2
    _compile_and_compare(f, torch.randn(4, 3, 10, 10), torch.randn(8, 3, 3, 3))
    kernels = [k.split("\n}\n")[0] for src in sources for k in src.split('extern "C" ')[1:] if ' void kernel' in k[:60]]
    pool = [k for k in kernels if "-INFINITY" in k]
    assert pool, sources
    assert "%" not in pool[0] and "kiln_where" in pool[0], pool[0]
    assert 'optimize("no-tree-pre")' in pool[0], pool[0]    # else g++ leaves the loop scalar
    assert ">= static_cast<int64_t>(10)" not in pool[0] and "< static_cast<int64_t>(10)" not in pool[0], \
        "the bounds decide a padded window's upper tests"


def test_a_big_leading_loop_is_parallel_alone(monkeypatch):
    """`omp parallel for` collapses only the loops it needs to spread over the threads."""
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    sources = _record_sources(monkeypatch)
    x = torch.randn(32, 17, 11, 12).permute(0, 2, 3, 1)   # three outer loops, one inner
    _compile_and_compare(lambda a: (a * 3).relu() + 1, x)
    assert sources and all("collapse" not in s and "#pragma omp parallel for" in s for s in sources), sources
    sources.clear()
    _compile_and_compare(lambda a: (a * 3).relu() + 1, torch.randn(2, 64, 8, 64))
    assert sources and all("collapse(2)" in s for s in sources), sources


def test_a_transposing_kernel_walks_tiles(monkeypatch):
    """A pointwise kernel whose innermost loop strides through one buffer while the loop above it
    walks that buffer at unit stride (autocast's bfloat16 copy of a weight, transposed for mm) loops
    over 32 x 32 tiles, the last ones partial; outer loops and tile rows share the threads."""
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    sources = _record_sources(monkeypatch)

    def f(w, x):
        return w.t().contiguous().to(torch.bfloat16), (x.transpose(-1, -2) * 2).contiguous()
    w, x = torch.randn(100, 70), torch.randn(4, 200, 100)
    kiln.reset()
    got = kiln.compile(f, backend="kiln")(w, x)
    for g, e in zip(got, f(w, x)):
        assert torch.equal(g, e)
    (source,) = sources
    assert source.count("_t += 32) {") == 4, source
    assert source.count("std::min<int64_t>(x") == 4 and "collapse(2)" in source, source


def test_channels_last_training_step_matches_eager():
    model = _Block().train()
    ref_model = _Block().train()
    ref_model.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 12, 12)
    kiln.reset()
    compiled = kiln.compile(model, backend="kiln")
    compiled(x).sum().backward()
    ref_model(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)


def test_relaid_loads_keep_their_elements():
    """A reduction over a relaid buffer, read through a permuted index: the pass rewrites the load."""
    x0, x1, x2, x3 = (ir.loop_var(k) for k in range(4))
    sizes = (2, 3, 4, 5)
    src = ir.Buffer("buf0", sizes, ir.contiguous_strides(sizes), torch.float32)
    plan = {"buf0": layout.channels_last_strides(sizes)}
    # element (n, c, h, w) of buf0 read at loop index (n, h, w, c)
    old_index = src.index([x0, x3, x1, x2])
    body = ir.Pointwise((2, 4, 5, 3), ir.Load("buf0", old_index, torch.float32))
    graph = ir.Graph((src, ir.Buffer("buf1", (2, 4, 5, 3), ir.contiguous_strides((2, 4, 5, 3)), torch.float32)),
                     (ir.ComputedBuffer("buf1", body),), (), ("buf1",))
    new = layout.apply_layouts(graph, plan)
    load = new.nodes[0].body.expr
    relaid = ir.Buffer("buf0", sizes, plan["buf0"], torch.float32)
    assert load.index == relaid.index([x0, x3, x1, x2])


def test_a_value_several_matmuls_read_is_computed_once(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    graphs = _record_graphs(monkeypatch)

    def f(x, w1, w2, w3):
        y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)
        return (y @ w1) * torch.sigmoid(y @ w2) + y @ w3
    x = torch.randn(2, 5, 8)
    _compile_and_compare(f, x, torch.randn(8, 4), torch.randn(8, 4), torch.randn(8, 4))
    (graph,) = graphs
    mm_inputs = {n.args[0].name for n in graph.nodes if isinstance(n, ir.ExternKernel)
                 and isinstance(n.args[0], (ir.BufferArg, ir.ViewArg))}
    assert len(mm_inputs) == 1, graph
    bodies = [n.body for n in graph.nodes if isinstance(n, ir.ComputedBuffer)]
    assert len(bodies) == len(set(bodies)), "two buffers still compute the same values"


def test_dedupe_renames_loads_externs_and_keeps_outputs():
    x0 = ir.loop_var(0)
    buf = lambda name: ir.Buffer(name, (4,), (1,), torch.float32)
    body = ir.Pointwise((4,), ir.Op("exp", (ir.Load("arg0", x0, torch.float32),), torch.float32))
    nodes = (ir.ComputedBuffer("buf0", body), ir.ComputedBuffer("buf1", body),      # buf1 = buf0
             ir.ExternKernel(("buf2",), torch.ops.aten.neg.default, (ir.BufferArg("buf1"),)),
             ir.ComputedBuffer("buf3", ir.Pointwise((4,), ir.Load("buf1", x0, torch.float32))),
             ir.ComputedBuffer("buf4", body))                                        # an output: kept
    graph = ir.Graph(tuple(buf(n) for n in ("arg0", "buf0", "buf1", "buf2", "buf3", "buf4")), nodes,
                     ("arg0",), ("buf2", "buf3", "buf4"))
    new = dedupe.dedupe_buffers(graph)
    assert [n.buffer if isinstance(n, ir.ComputedBuffer) else n.outputs[0] for n in new.nodes] == \
        ["buf0", "buf2", "buf3", "buf4"]
    assert new.nodes[1].args == (ir.BufferArg("buf0"),)
    assert new.nodes[2].body.expr == ir.Load("buf0", x0, torch.float32)
    assert "buf1" not in new.buffer_map()


def test_a_buffer_another_extern_reads_keeps_its_layout(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    graphs = _record_graphs(monkeypatch)

    def f(x, w):
        y = torch.relu(x * 2)
        return F.conv2d(y, w, padding=1), torch.sort(y, -1).values
    x, w = torch.randn(2, 3, 6, 5), torch.randn(4, 3, 3, 3)
    kiln.reset()
    with torch.no_grad():
        got = kiln.compile(f, backend="kiln")(x, w)
    for a, b in zip(got, f(x, w)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    (graph,) = graphs
    buffers = graph.buffer_map()
    sort = next(n for n in graph.nodes if isinstance(n, ir.ExternKernel) and not layout._is_convolution(n))
    read = sort.args[0].name
    assert buffers[read].strides == ir.contiguous_strides(buffers[read].sizes)


def _linear_of_a_permute(monkeypatch, options):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    graphs = _record_graphs(monkeypatch)

    def f(x, w):
        return F.gelu(F.linear(x.permute(0, 2, 3, 1), w * 2))
    x, w = torch.randn(4, 8, 6, 6), torch.randn(16, 8)
    _compile_and_compare(f, x, w, options=options)
    buffers = [b for g in graphs for b in g.buffers]
    assert max(int(ir.product(b.sizes)) for b in buffers) <= 4 * 6 * 6 * 16, [str(b) for b in buffers]
    return [n for g in graphs for n in g.nodes if isinstance(n, ir.ExternKernel)]


def test_a_weight_expanded_for_bmm_reaches_it_as_a_stride_0_view(monkeypatch):
    # under numerics="eager", F.linear on a permuted activation reaches ATen as bmm of the weight
    # expanded to the batch (convnext's MLP): the cast weight is written once, not once per batch entry
    externs = _linear_of_a_permute(monkeypatch, {"numerics": "eager"})
    views = [a for n in externs for a in n.args if isinstance(a, ir.ViewArg) and 0 in a.strides]
    assert views, "the expanded weight should reach bmm as a view with a zero stride"


def test_a_linear_of_a_permute_is_one_product_over_rows(monkeypatch):
    # by default the rows are folded ([Note: linear over rows] in kiln/aot/rules.py): no batched product
    externs = _linear_of_a_permute(monkeypatch, None)
    names = [getattr(n.op, "__name__", "") for n in externs]
    assert names and not any(name.startswith("bmm") for name in names), names


def test_an_empty_value_into_a_matmul_is_not_compacted_to_one_element():
    """broadcast_view dropped the empty dims of a (1, 1, 0, 0) value (its index reads no loop
    variable) and computed one element from empty inputs, out of their bounds: qr's backward of a
    (1, 1, 0, 5) input crashed the process. Segfaults are not assertions: this runs in a child."""
    import subprocess
    import sys
    code = ("import torch, kiln\n"
            "c, a = torch.randn(1, 1, 0, 0), torch.randn(1, 0, 0)\n"
            "f = lambda c, a: torch.bmm((c + 1).view(1, 0, 0), a)\n"
            "assert kiln.compile(f)(c, a).shape == f(c, a).shape == (1, 0, 0)\n"
            "x = torch.randn(1, 1, 0, 5, requires_grad=True)\n"
            "q, r = kiln.compile(torch.linalg.qr, fullgraph=True)(x)\n"
            "(g,) = torch.autograd.grad((q.sum() + r.sum()), x)\n"
            "assert g.shape == x.shape\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
