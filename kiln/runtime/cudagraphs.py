"""`mode="reduce-overhead"`: a compiled program recorded once as a CUDA graph and replayed.

[Note: CUDA graphs] A host program launches tens to hundreds of kernels per call; for a small
batch their launch cost, not their work, is the step time. Replaying a recorded CUDA graph launches
them all at once. What makes a replay right:

- Addresses are baked in. Inputs the caller owns and passes anew each call (activations, token
  ids) are copied into static tensors recorded in the graph; inputs marked static are used in
  place, and a call whose static input moved (a parameter replaced) records again. The last
  `KEPT_PER_LAYOUT` recordings of a layout are kept: transformers' generate() makes a new static
  cache each call, and the allocator hands one of two address sets back in turn. Static are
  parameters and buffers, whose storage lives as long as the module, and inputs the program writes
  into (a static KV cache: [Note: writes into inputs in place] in kiln/codegen/reinplace.py), which
  a copy would keep the write from reaching.
- A graph is recorded per input layout (shapes, strides, dtypes, scalar arguments): a program with
  symbolic sizes gets one graph per size it is called with.
- The kernels must be compiled and the allocator warm before recording: the first call of each
  layout runs the program as it is, the second records, later ones replay.
- The outputs live in the graph's memory pool and the next replay overwrites them, so a replay
  returns copies: a caller that keeps a step's logits while it decodes the next reads its own.
  An output that is a static input's storage (the cache the program wrote) is the caller's own
  tensor, returned as it is; so is an output the caller copies into an input at once, before it
  can call again (`written_back`: aot's epilogue writing a mutated input's new value, such as each
  layer's `cumulative_length` of a static cache, 32 copies a token in a 32-layer model).
- [Note: written back inside the graph] Where the input such an output is copied into is known and
  static (`written_into`: aot's `kiln_inputs_written`, inputs that require no grad, as the ones
  the program writes in place), the copy is recorded at the end of the graph, and the replay
  returns the input itself, which the epilogue then finds written: one multi-tensor copy launch and
  its host work less a step. The recording runs the program for real (a warm-up on a side stream,
  or an emulation), so the inputs it writes back are restored after it; the replay writes them once.
- A program that cannot be recorded (it reads a tensor on the host, holds a CPU tensor, or calls
  something that synchronizes) runs without graphs from then on, with a warning saying why.
"""
from __future__ import annotations

import operator
import warnings
from typing import Any, Callable, Sequence

import torch

KEPT_PER_LAYOUT = 2


class CudaGraphed:
    """`program` (a compiled prim graph's callable) run through recorded CUDA graphs.

    `capture(program, args) -> (replay, outputs)` records one call; tests pass one that emulates a
    recording on the CPU (outputs in fixed memory that each replay overwrites)."""

    def __init__(self, program: Callable, static_inputs: Sequence[int] = (), capture: Callable | None = None,
                 written_back: Sequence[int] = (), fixed_size: Sequence[int] = (), concrete_size: Sequence[int] = (),
                 written_into: Sequence[tuple[int, int]] = ()):
        self.program = program
        self.capture = capture or _capture
        self.static_inputs = frozenset(static_inputs)
        self.written_back = frozenset(written_back)
        # (output, static input) pairs: the caller copies the output into the input at once
        # ([Note: written back inside the graph])
        self.written_into = tuple((k, i) for k, i in written_into if k in self.written_back and i in self.static_inputs)
        # static inputs whose size cannot change while their address stays: a module's parameters
        # and buffers, whose guards hold them by identity (a size change needs a new tensor); only
        # their addresses are compared before a replay (450 tensors a dolly step)
        self.fixed_size = frozenset(fixed_size)
        # static inputs whose size the program was compiled for (traced without a symbol in it): a
        # call of another size is no call of this program, so only their addresses are compared
        self.concrete_size = frozenset(concrete_size)
        self.recorded: dict[tuple, list[_Recording]] = {}   # a layout's recordings, the latest first
        self.seen: set[tuple] = set()
        self.disabled: str | None = None          # why graphs are off, once they are
        self.dynamic_inputs: list[int] | None = None  # the inputs a layout is keyed by (not static ones)
        self.pick_dynamic: Callable[[Sequence[Any]], tuple] | None = None
        self.last: _Recording | None = None       # the recording that replayed last
        self.replays = 0
        self.recordings = 0       # made in all (a static input that keeps moving re-records each time)
        self.kiln_compiled = True
        self.programs = getattr(program, "programs", None)
        self.output_strides = getattr(program, "output_strides", ())

    def __call__(self, *args):
        # [Note: the replay's fast path] A decode step replays the recording that replayed last:
        # its layout and static addresses are checked first, in as few Python operations as the
        # checks allow, before the table of layouts is consulted
        last = self.last
        if last is not None and _layout(last.pick_dynamic(args)) == last.layout and last.static_inputs_unmoved(args):
            self.replays += 1
            return last.replay(args)
        return self._call(args)

    def _call(self, args: tuple):
        if self.disabled is not None:
            return self.program(*args)
        if self.dynamic_inputs is None:       # the static inputs' addresses are checked instead
            self.dynamic_inputs = [i for i in range(len(args)) if i not in self.static_inputs]
            self.pick_dynamic = picker(self.dynamic_inputs)
        key = _layout(self.pick_dynamic(args))
        kept = self.recorded.setdefault(key, [])
        for i, recording in enumerate(kept):
            if recording.static_inputs_unmoved(args):
                if i:     # the recording that replayed last is checked first: a generate() replays one
                    kept.insert(0, kept.pop(i))
                self.replays += 1
                self.last = recording
                return recording.replay(args)
        self.last = None
        if key not in self.seen:                   # warm-up: compile kernels, fill the allocator
            self.seen.add(key)
            return self.program(*args)
        reason = _unrecordable(args) if self.capture is _capture else None
        if reason is None:
            try:
                recording = _Recording(self.program, args, self.static_inputs, self.capture, self.written_back,
                                       self.fixed_size, self.concrete_size, self.written_into)
                recording.layout, recording.pick_dynamic = key, self.pick_dynamic
                kept[:] = [recording, *kept[:KEPT_PER_LAYOUT - 1]]
                self.recordings += 1
                self.last = recording
                return recording.replay(args)
            except Exception as e:       # a sync, a host read, an op CUDA graphs refuse: run without
                reason = f"recording failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        self.disabled = reason
        warnings.warn(f"kiln: mode='reduce-overhead' runs this graph without CUDA graphs: {reason}")
        return self.program(*args)


def graphed(program: Callable, meta: dict, capture: Callable | None = None) -> CudaGraphed:
    """`program` in CUDA graphs, told of its inputs by its graph's `meta` (aot's `forward_meta`)."""
    return CudaGraphed(program, meta.get("kiln_static_inputs", ()), capture=capture,
                       written_back=meta.get("kiln_written_back", ()), fixed_size=meta.get("kiln_module_state", ()),
                       concrete_size=meta.get("kiln_concrete_size", ()), written_into=meta.get("kiln_inputs_written", ()))


def _layout(args: Sequence[Any]) -> tuple:
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                 for a in args)


def _unrecordable(args: Sequence[Any]) -> str | None:
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.device.type != "cuda":
            return (f"input {i} (a {a.dtype} tensor of shape {tuple(a.shape)}) is on {a.device}, "
                    "not a CUDA device")
    if not any(isinstance(a, torch.Tensor) for a in args):
        return "no input is a tensor"
    return None


class _Recording:
    """One CUDA graph of the program, for one input layout.

    Its checks and its outputs are planned once, here, so a replay does a fixed few C calls: one
    list of the static inputs' addresses compared with the recorded one (sizes only of those whose
    size the program does not fix), one multi-tensor copy of the caller's inputs, the launch, and
    one gather of the returned outputs."""

    def __init__(self, program: Callable, args: Sequence[Any], static_inputs: frozenset, capture: Callable,
                 written_back: frozenset = frozenset(), fixed_size: frozenset = frozenset(),
                 concrete_size: frozenset = frozenset(), written_into: Sequence[tuple[int, int]] = ()):
        args = tuple(args)
        self.static_inputs = static_inputs
        self.layout, self.pick_dynamic = None, None     # set by CudaGraphed, which keys recordings by them
        # a static input is replayed at its address and size (a new cache may take a freed one's address)
        self.pointers = {i: (args[i].data_ptr(), args[i].shape) for i in sorted(static_inputs)
                         if isinstance(args[i], torch.Tensor)}
        # the inputs that tell one recording from another (a generate()'s own cache) come first, so
        # that the comparison with the recording of another cache fails at its first address; the
        # module state's hundreds of addresses after them
        order = [i for i in self.pointers if i not in fixed_size] + [i for i in self.pointers if i in fixed_size]
        self.pick_static, self.addresses = picker(order), [self.pointers[i][0] for i in order]
        # sizes are compared only where they could change at the same address: not a module's state
        # (held by identity by the guards), nor an input whose size the program was compiled for
        sized = [i for i in order if i not in fixed_size and i not in concrete_size]
        self.pick_sized, self.sizes = (picker(sized), [self.pointers[i][1] for i in sized]) if sized else (None, None)
        # the caller's tensors: copied into these before each replay
        copied = {i: torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                  for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in static_inputs}
        graph_args = [copied.get(i, a) for i, a in enumerate(args)]
        self.copy_into, self.pick_copied = list(copied.values()), picker(list(copied))
        self._copy_inputs(args)
        written_into = [(k, i) for k, i in written_into if i in self.pointers]
        if written_into:          # [Note: written back inside the graph]
            before = [args[i].clone() for _, i in written_into]
            try:
                self.replay_graph, self.outputs = capture(_writing_back(program, written_into), graph_args)
            finally:              # the recording's own runs wrote them: as they were
                torch._foreach_copy_([args[i] for _, i in written_into], before)
        else:
            self.replay_graph, self.outputs = capture(program, graph_args)
        # outputs that are a static input's own storage: the caller's tensor, never a copy
        by_address = {}
        for i, (pointer, _) in self.pointers.items():
            by_address.setdefault(pointer, []).append(i)
        self.static_outputs = {k: i for k, o in enumerate(self.outputs) if isinstance(o, torch.Tensor)
                               for i in by_address.get(o.data_ptr(), ()) if o.is_set_to(graph_args[i])}
        self.uncopied = written_back - self.static_outputs.keys()
        # outputs the graph itself copies into the static input they are written back into
        self.written_in_graph = {k: i for k, i in written_into if k not in self.static_outputs
                                 and isinstance(self.outputs[k], torch.Tensor)}
        # what a replay returns in place of the recorded outputs: a static input's own tensor, or a
        # copy of an output in the graph's pool (not one written back at once)
        self.returned_args = [*self.static_outputs.items(), *self.written_in_graph.items()]
        self.returned_copies = [k for k, o in enumerate(self.outputs) if isinstance(o, torch.Tensor)
                                and k not in self.static_outputs and k not in self.uncopied]
        # the replay's result gathered in one C call from (*args, *recorded outputs, *copies)
        n, recorded = len(args), tuple(self.outputs)
        gather = [n + k for k in range(len(recorded))]
        for k, i in self.returned_args:
            gather[k] = i
        for j, k in enumerate(self.returned_copies):
            gather[k] = n + len(recorded) + j
        self.recorded_outputs, self.result_type = recorded, type(self.outputs)
        self.gather, self.pick_copies = picker(gather), picker(self.returned_copies)

    def static_inputs_unmoved(self, args: Sequence[Any]) -> bool:
        return (list(map(_data_ptr, self.pick_static(args))) == self.addresses
                and (self.pick_sized is None or list(map(_size, self.pick_sized(args))) == self.sizes))

    def _copy_inputs(self, args: Sequence[Any]):
        """The caller's inputs into the graph's: one multi-tensor copy, a launch per dtype, not one
        per input (a decode step's ids, positions, mask and cache lengths: 14 launches, ~5 us of
        host each on an H100's host)."""
        if self.copy_into:
            torch._foreach_copy_(self.copy_into, self.pick_copied(args))

    def replay(self, args: tuple):
        """The graph run on the caller's `args` (a tuple); its outputs as the program returns them."""
        self._copy_inputs(args)
        self.replay_graph()
        if self.returned_copies:
            got = self.gather(args + self.recorded_outputs + tuple(map(_clone, self.pick_copies(self.recorded_outputs))))
        else:
            got = self.gather(args + self.recorded_outputs)
        return got if self.result_type is tuple else self.result_type(got)


_data_ptr, _size, _clone = torch.Tensor.data_ptr, torch.Tensor.size, torch.Tensor.clone


def _writing_back(program: Callable, written_into: list[tuple[int, int]]) -> Callable:
    """`program`, then its outputs copied into the inputs they are written back into (but those it
    wrote in place): what a recording records ([Note: written back inside the graph])."""
    def run(*graph_args):
        outputs = program(*graph_args)
        pairs = [(graph_args[i], outputs[k]) for k, i in written_into
                 if isinstance(outputs[k], torch.Tensor) and not outputs[k].is_set_to(graph_args[i])]
        if pairs:
            torch._foreach_copy_([t for t, _ in pairs], [v for _, v in pairs])
        return outputs
    return run


def picker(indices: list[int]) -> Callable[[Sequence[Any]], tuple]:
    """`args -> the args[i] for i in indices`, as one C call: a tuple, or a slice of `args` where
    the indices are a run."""
    if len(indices) > 1 and list(indices) == list(range(indices[0], indices[-1] + 1)):
        return operator.itemgetter(slice(indices[0], indices[-1] + 1))
    if len(indices) > 1:
        return operator.itemgetter(*indices)
    return (lambda args: (args[indices[0]],)) if indices else (lambda args: ())


def _capture(program: Callable, graph_args: list) -> tuple[Callable, Any]:
    """Record `program(*graph_args)` as a CUDA graph: torch's recipe, a run on a side stream first."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        program(*graph_args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = program(*graph_args)
    return graph.replay, outputs
