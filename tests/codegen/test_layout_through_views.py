"""[Note: layouts through views] in kiln/codegen/layout.py: ShuffleNet's channel shuffle
(`cat`, then `view(b, 2, c/2, h, w).transpose(1, 2).contiguous().view(b, c, h, w)`) computes a
5-d buffer that the next block's convolutions read through 4-d views. Laid out so that those
views are channels-last, the blocks stay NHWC from end to end: no kernel transposes between NCHW
and NHWC. Compared with eager, in inference and in training."""
import sympy
import torch
import torch.nn.functional as F

import kiln
import kiln.prims.ops  # noqa: F401  (registers the prims)
from kiln.codegen import ir, layout


def _shuffle(x, groups=2):
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).contiguous().view(b, -1, h, w)


def _conv_bn(cin, cout, k=1, stride=1, groups=1, relu=True):
    layers = [torch.nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), torch.nn.BatchNorm2d(cout)]
    return torch.nn.Sequential(*layers, *([torch.nn.ReLU()] if relu else []))


class Block(torch.nn.Module):
    """torchvision's ShuffleNetV2 InvertedResidual, small."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        half = cout // 2
        self.stride = stride
        if stride > 1:
            self.branch1 = torch.nn.Sequential(_conv_bn(cin, cin, 3, stride, cin, relu=False), _conv_bn(cin, half))
        self.branch2 = torch.nn.Sequential(_conv_bn(cin if stride > 1 else half, half),
                                           _conv_bn(half, half, 3, stride, half, relu=False), _conv_bn(half, half))

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return _shuffle(out)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = _conv_bn(3, 8, 3, 2)
        self.blocks = torch.nn.Sequential(Block(8, 12, 2), Block(12, 12, 1), Block(12, 12, 1))
        self.last = _conv_bn(12, 16)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.last(self.blocks(self.stem(x))).mean((2, 3)))


def _model():
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
    return model


def _record(monkeypatch):
    """(loop IR after the layout pass, schedule) of every graph kiln compiles."""
    import kiln.codegen.compile as compile_module
    seen = []
    optimize, schedule = compile_module.optimize_layouts, compile_module.schedule

    def laid_out(graph, free_outputs=frozenset()):
        seen.append([optimize(graph, free_outputs)])
        return seen[-1][0]

    def scheduled(graph):
        seen[-1].append(schedule(graph))
        return seen[-1][1]
    monkeypatch.setattr(compile_module, "optimize_layouts", laid_out)
    monkeypatch.setattr(compile_module, "schedule", scheduled)
    return seen


def _innermost_steps(kernel: ir.Kernel, buffers) -> list[tuple[str, int]]:
    """(buffer, step) for every load of a buffer of 3 or more dims whose index moves by more than
    one element along the kernel's innermost loop (at a point away from any clamp's edge)."""
    inner = max(k for k, r in enumerate(kernel.ranges) if sympy.sympify(r) != 1)
    var = ir.loop_var(inner)
    point = {ir.loop_var(k): int(r) // 2 for k, r in enumerate(kernel.ranges)}
    steps = []
    for stage in kernel.stages:
        for stmt in stage.body:
            for e in ir.stmt_exprs(stmt):
                for ld in ir.loads_of(e):
                    if len(buffers[ld.buffer].sizes) < 3 or ld.indirect:
                        continue
                    index = sympy.sympify(ld.index)
                    step = index.subs({**point, var: point[var] + 1}) - index.subs(point)
                    if step not in (0, 1):
                        steps.append((ld.buffer, int(step)))
    return steps


def test_the_channel_shuffle_keeps_its_blocks_channels_last(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    graphs = _record(monkeypatch)
    model = _model().eval()
    x = torch.randn(2, 3, 32, 32)
    kiln.reset()
    with torch.no_grad():
        got, want = kiln.compile(model)(x), model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    ((graph, sched),) = graphs
    buffers = graph.buffer_map()
    shuffled = [b for b in buffers.values() if len(b.sizes) == 5]
    assert len(shuffled) == 3, [str(b) for b in shuffled]
    for buf in shuffled:     # [b, c/2, 2, h, w]: the group dim innermost, then the channel pairs
        b, half, g, h, w = (int(s) for s in buf.sizes)
        assert tuple(buf.strides) == (half * g * h * w, g, 1, w * half * g, half * g), buf
    convs = [n for n in graph.nodes if layout._is_convolution(n)]
    for conv in convs:
        image = conv.args[0]
        if isinstance(image, ir.ViewArg):
            assert layout._channels_last_view(image), str(conv)
        else:
            assert layout._is_channels_last(buffers[image.name]), str(conv)
        assert layout._is_channels_last(buffers[conv.outputs[0]]), str(conv)
    assert sum(isinstance(conv.args[0], ir.ViewArg) for conv in convs) == 3   # blocks 2 and 3 take a chunk, the last conv all the channels
    kernels = [k for k in sched.steps if isinstance(k, ir.Kernel)]
    transposing = {k.name: _innermost_steps(k, buffers) for k in kernels if k.ranges[0] == 2}
    assert not any(transposing.values()), transposing


def test_a_view_that_splits_a_buffer_dim_keeps_the_buffer_contiguous():
    """A view that merges buffer dims (`[b, c/2, 2, h, w]` read as `[b, c, h, w]`) gets
    channels-last strides, at an offset too (a chunk); one that splits a buffer dim across
    view dims (`[b, c*h, w]` read as `[b, c, h, w]`: h is not apart from c in the buffer) gets none."""
    buf = ir.Buffer("b", (2, 6, 20), ir.contiguous_strides((2, 6, 20)), torch.float32, "cpu")
    merged = ir.ViewArg("b", (2, 3, 2, 20), (120, 40, 20, 1))       # dim 1 (6) split into c=3, h=2
    assert layout._strides_for_view(buf, merged) is None         # h and w are one buffer dim: no NHWC
    buf5 = ir.Buffer("s", (2, 4, 2, 5, 5), ir.contiguous_strides((2, 4, 2, 5, 5)), torch.float32, "cpu")
    view = ir.ViewArg("s", (2, 8, 5, 5), (200, 25, 5, 1))
    strides = layout._strides_for_view(buf5, view)
    assert strides == (200, 2, 1, 40, 8)
    half = layout._relaid_view(ir.ViewArg("s", (2, 4, 5, 5), (200, 25, 5, 1), 100), buf5, strides)
    assert (half.strides, half.offset) == ((200, 1, 40, 8), 4)
    x = [ir.loop_var(k) for k in range(4)]   # the split the relaid index needs: floor(x1/2), not a floor of a sum
    from kiln.codegen.indexing import simplify_index
    upper = dict(zip(x, (2, 8, 5, 5)))
    assert simplify_index(sympy.floor((25 * x[1] + 5 * x[2] + x[3]) / 50), upper) == sympy.floor(x[1] / 2)
    # the values: the relaid view reads the elements the old one did
    data = torch.arange(200 * 2.0)
    old = torch.as_strided(data, (2, 4, 2, 5, 5), buf5.strides)
    new = torch.empty_strided((2, 4, 2, 5, 5), strides).copy_(old)
    flat = torch.as_strided(new, (new.untyped_storage().nbytes() // 4,), (1,))
    assert torch.equal(torch.as_strided(flat, half.sizes, half.strides, int(half.offset)),
                       torch.as_strided(data, (2, 4, 5, 5), (200, 25, 5, 1), 100))


def test_a_shufflenet_training_step_equals_eager():
    model = _model().train()
    reference = _model().train()
    x = torch.randn(2, 3, 32, 32)
    kiln.reset()
    compiled = kiln.compile(model)
    for _ in range(2):
        for m in (compiled, reference):
            m.zero_grad(set_to_none=True)
        got = compiled(x).square().mean()
        got.backward()
        want = reference(x).square().mean()
        want.backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4)


def test_a_cats_pieces_are_loaded_under_their_conditions_in_triton():
    """[Note: a select's loads are masked by its condition] in kiln/codegen/triton/printer.py:
    each piece of a cat (three here: a nested select) is read only where it is selected; a select
    on loaded values keeps its loads unmasked. Through Triton's interpreter, against eager."""
    import re
    import sys
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_triton_e2e import check

    def f(a, b, c):
        x = torch.cat([a, torch.relu(b) * 2, c], dim=1)
        n, ch, h, w = x.shape
        return x.view(n, 3, ch // 3, h, w).transpose(1, 2).contiguous().view(n, ch, h, w) + 1
    kernels = check(f, torch.randn(2, 4, 5, 5), torch.randn(2, 4, 5, 5), torch.randn(2, 4, 5, 5))
    (cat,) = [k.source for k in kernels if "tl.where" in k.source and "tl.minimum" in k.source]
    loads = re.findall(r"tl\.load\(p_in\d \+ .*, (xmask[^,]*), other=0\)", cat)
    assert len(loads) == 3 and all(" & " in mask for mask in loads), cat
    assert len(set(loads)) == 3, loads        # each under its own condition
    kernels = check(lambda x, y: torch.where(x > 0, x, y * 2), torch.randn(40), torch.randn(40), grad=False)
    (select,) = [k.source for k in kernels if "tl.where" in k.source]
    assert re.findall(r"tl\.load\([^\n]*\), xmask, other=0\)", select) and " & " not in select, select



def _relu_then_convs(second_view: ir.ViewArg) -> ir.Graph:
    """buf0 = relu(arg0) [2, 6, 8, 8]; buf1 = conv(buf0, arg1); buf2 = conv(second_view, arg2)."""
    conv, f32 = torch.ops.kiln_prims.convolution.default, torch.float32
    sizes = (2, 6, 8, 8)
    x = [ir.loop_var(k) for k in range(4)]
    bufs = (ir.Buffer("arg0", sizes, ir.contiguous_strides(sizes), f32, "cpu"),
            ir.Buffer("arg1", (4, 6, 1, 1), (6, 1, 1, 1), f32, "cpu"),
            ir.Buffer("arg2", (5, 3, 1, 1), (3, 1, 1, 1), f32, "cpu"),
            ir.Buffer("buf0", sizes, ir.contiguous_strides(sizes), f32, "cpu"),
            ir.Buffer("buf1", (2, 4, 8, 8), ir.contiguous_strides((2, 4, 8, 8)), f32, "cpu"),
            ir.Buffer("buf2", (2, 5, 8, 8), ir.contiguous_strides((2, 5, 8, 8)), f32, "cpu"))
    relu = ir.Op("maximum", (ir.Load("arg0", bufs[3].index(x), f32), ir.Constant(0.0, f32)), f32)
    nodes = (ir.ComputedBuffer("buf0", ir.Pointwise(sizes, relu)),
             ir.ExternKernel(("buf1",), conv, (ir.BufferArg("buf0"), ir.BufferArg("arg1"), None, [1, 1], [0, 0],
                                               [1, 1], False, [0, 0], 1)),
             ir.ExternKernel(("buf2",), conv, (second_view, ir.BufferArg("arg2"), None, [1, 1], [0, 0], [1, 1],
                                               False, [0, 0], 1)))
    return ir.Graph(inputs=("arg0", "arg1", "arg2"), buffers=bufs, nodes=nodes, outputs=("buf1", "buf2"))


def test_a_channel_range_read_by_a_convolution_goes_channels_last_with_its_buffer():
    """A 4-d buffer that one convolution reads whole and another by a range of its channels (a
    view: `chunk`) goes channels-last, the range a view at a channel offset; a view no NHWC
    strides give (`[b, c*h, w]`, a conv1d's: c and h are not next to each other in NHWC) keeps
    the buffer as it is."""
    chunk = ir.ViewArg("buf0", (2, 3, 8, 8), (384, 64, 8, 1), sympy.Integer(192))
    free = frozenset({"buf1", "buf2"})     # the outputs' layout is the pass's to choose (a forward's saved values)
    graph = layout.optimize_layouts(_relu_then_convs(chunk), free)
    buffers = graph.buffer_map()
    assert layout._is_channels_last(buffers["buf0"]) and layout._is_channels_last(buffers["buf2"])
    view = graph.nodes[-1].args[0]
    assert (view.strides, view.offset) == ((384, 1, 48, 6), 3), view
    flat = ir.ViewArg("buf0", (2, 48, 8), (384, 8, 1), sympy.Integer(0))
    graph = layout.optimize_layouts(_relu_then_convs(flat), free)
    assert graph.buffer_map()["buf0"].strides == (384, 64, 8, 1)
    assert graph.nodes[-1].args[0] == flat
