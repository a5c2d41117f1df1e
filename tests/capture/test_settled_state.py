"""[Note: settled module state]: guards on a module tree's own state are checked only after some
module's state was written; every such write is still seen, and state kiln cannot count stays live."""
import subprocess
import sys
import textwrap
import types

import torch

import kiln
from kiln.runtime.module_writes import MODULE_WRITES


class CountingTable(dict):
    """A module table that counts lookups by key, as a settled guard's read makes them."""
    reads = 0

    def __getitem__(self, key):
        CountingTable.reads += 1
        return super().__getitem__(key)


class Block(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.lin = torch.nn.Linear(6, 6)
        self.norm = torch.nn.LayerNorm(6)
        self.scales = [1.0, 2.0]

    def forward(self, x):
        y = self.norm(self.lin(x)) * self.cfg.scale * self.scales[1]
        return y.relu() if self.cfg.act == "relu" else y.tanh()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = types.SimpleNamespace(scale=0.5, act="relu")   # one object every block reads, as a config
        self.blocks = torch.nn.ModuleList(Block(cfg) for _ in range(3))
        self.register_buffer("shift", torch.tensor(0.25))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x + self.shift


def check(compiled, model, x):
    torch.testing.assert_close(compiled(x), model(x))


def test_settled_guards_are_not_read_without_a_write():
    torch.manual_seed(0)
    model = Model().eval()
    model.blocks[0].lin._parameters = CountingTable(model.blocks[0].lin._parameters)
    compiled = kiln.compile(model)
    x = torch.randn(2, 6)
    check(compiled, model, x)          # compiles
    check(compiled, model, x)          # the entry's first check: every guard, then the stamp is set

    def compiled_reads():
        CountingTable.reads = 0
        compiled(x)
        return CountingTable.reads
    assert compiled_reads() == 0       # the parameter's identity guard was not evaluated
    model.blocks[2].norm.eps = 1e-5    # a counted write anywhere: the settled guards run once more
    assert compiled_reads() > 0
    assert compiled_reads() == 0
    check(compiled, model, x)


def test_counted_writes_are_seen():
    torch.manual_seed(0)
    model = Model().eval()
    compiled = kiln.compile(model)
    x = torch.randn(2, 6)
    check(compiled, model, x)
    model.blocks[1].norm.eps = 0.5                          # a plain attribute
    check(compiled, model, x)
    model.blocks[2].lin = torch.nn.Linear(6, 6)             # a submodule swapped
    check(compiled, model, x)
    with torch.no_grad():
        model.blocks[0].lin.weight = torch.nn.Parameter(torch.randn(6, 6))   # a parameter replaced
    check(compiled, model, x)
    model.register_buffer("shift", torch.tensor(-3.0))      # a buffer registered anew
    check(compiled, model, x)
    del model.blocks[1].norm.bias                           # a parameter deleted (LayerNorm reads None)
    model.blocks[1].norm.register_parameter("bias", None)
    check(compiled, model, x)
    model.double()                                          # _apply
    check(compiled, model, x.double())


def test_class_swap_is_seen():
    class Gelu(torch.nn.ReLU):
        def forward(self, x):
            return torch.nn.functional.gelu(x)

    seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = kiln.compile(seq)
    x = torch.randn(3, 4)
    check(compiled, seq, x)
    seq[1].__class__ = Gelu
    check(compiled, seq, x)


def test_state_outside_modules_stays_live():
    torch.manual_seed(0)
    model = Model().eval()
    compiled = kiln.compile(model)
    x = torch.randn(2, 6)
    check(compiled, model, x)
    check(compiled, model, x)

    def uncounted(write):
        """Make the write, which moves no count: only the live guards can see it."""
        writes = MODULE_WRITES[0]
        write()
        assert MODULE_WRITES[0] == writes
        check(compiled, model, x)
    uncounted(lambda: setattr(model.blocks[0].cfg, "scale", 3.0))   # a plain object the modules share
    uncounted(lambda: setattr(model.blocks[0].cfg, "act", "tanh"))
    uncounted(lambda: model.blocks[1].scales.__setitem__(1, -1.0))  # a list a module holds
    uncounted(lambda: model.shift.add_(2.0))                        # a buffer's values


def test_module_tensors_metadata_writes_are_seen():
    """[Note: module tensors' metadata]: a parameter or buffer given data of another shape, dtype or
    layout under the same object recompiles (kiln once returned the old shape's result)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = kiln.compile(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    with torch.no_grad():
        model[0].weight.data = torch.randn(8, 4)
        model[0].bias.data = torch.randn(8)
    check(compiled, model, x)
    model[0].weight.data = torch.randn(4, 8).t()                 # same sizes, other strides
    check(compiled, model, x)
    with torch.no_grad():
        model[0].bias.set_(torch.randn(16)[::2])                  # set_: same size, stride 2
    check(compiled, model, x)

    net = Model().eval()
    compiled = kiln.compile(net)
    y = torch.randn(2, 6)
    check(compiled, net, y)
    net.shift.data = torch.linspace(0, 1, 6)                      # a 0-d buffer becomes a row
    check(compiled, net, y)
    net.shift.data = torch.linspace(0, 1, 6, dtype=torch.float64)
    check(compiled, net, y)
    net.shift.resize_(2, 1).fill_(0.5)                             # resize_ of a buffer
    check(compiled, net, y)


def test_module_tensor_guards_wait_for_a_tensor_write():
    """Unwritten, the metadata guards of a module's tensors do not run: a call reads no parameter
    table; after a `.data` write they run once, and the new data's metadata passes them."""
    from kiln.runtime.module_writes import TENSOR_WRITES
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    model[0]._parameters = CountingTable(model[0]._parameters)
    compiled = kiln.compile(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    check(compiled, model, x)

    def compiled_reads():
        CountingTable.reads = 0
        compiled(x)
        return CountingTable.reads
    assert compiled_reads() == 0
    before = TENSOR_WRITES[0]
    kiln.compile(lambda a: a.sin() * 2)(x)                        # kiln's own fake tensors write no count
    assert TENSOR_WRITES[0] == before
    model[0].weight.data = torch.randn(4, 4)                     # same metadata: no recompile
    assert TENSOR_WRITES[0] == before + 1
    assert compiled_reads() > 0
    assert compiled_reads() == 0
    check(compiled, model, x)


def test_dynamo_traces_modules_as_before():
    """torch.compile in the same process sees nn.Module's counted methods as nn.Module's own: the
    same frames and ops with kiln's wrap as without."""
    script = textwrap.dedent("""
        import sys, torch
        from torch._dynamo.testing import CompileCounter

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, x):
                super().__setattr__("flag", True)
                self.add_module("extra", self.lin)          # as transformers' output capturing does
                return self.lin(x).relu() + self.lin.weight.data.sum()

        if sys.argv[1] == "wrapped":
            from kiln.runtime.module_writes import count_module_writes, count_tensor_writes
            count_module_writes()
            count_tensor_writes()
        counter, m = CompileCounter(), M()
        f = torch.compile(m, backend=counter)
        x = torch.randn(2, 4)
        for _ in range(3):
            y = f(x)
        assert torch.allclose(y, m.lin(x).relu() + m.lin.weight.sum())
        print(counter.frame_count, counter.op_count)
    """)
    counts = [subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True,
                             timeout=300).stdout.split()[-2:] for mode in ("plain", "wrapped")]
    assert counts[0] == counts[1], counts
