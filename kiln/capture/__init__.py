"""Graph capture (TorchDynamo's role): Python callables to torch-level FX graphs plus guards.

Contract with the rest of kiln:
    capture(fn, backend, config: CaptureConfig) -> callable   # same signature as fn
    explain(fn, *args, **kwargs) -> ExplainReport              # graphs, breaks, guards, recompiles
    reset()                                                    # forget every compiled entry
`backend(gm, example_inputs) -> callable` receives each extracted torch-level graph. Parameters and
buffers of modules appear as `get_attr` nodes; later stages read them from `gm` at each call.

How it works, in pipeline order: `frame.py` (the wrapper and its cache of entries) ->
`interpreter.py` + `opcodes.py` (the symbolic bytecode interpreter) -> `semantics.py`,
`attributes.py`, `calls.py`, `classes.py`, `torch_calls.py`, `constants.py` (the Python data model
over trackers from `variables.py`, built by `builder.py` with guards from `guards.py`; `views.py`
keeps dict views live, `keys.py` says what a dict key or set member is keyed by,
`autograd_function.py` follows `Function.apply`); one module per family of values
registers its callables and methods in `callables.py`'s table (`builtins.py`, `containers.py`,
`collections_types.py`, `iterators.py`, `stdlib_functions.py`, `numpy_calls.py`, `pytree_calls.py`,
`model_outputs.py`) ->
`output.py` (the FX graph) -> `convert.py` + `rebuild.py` (generated entry code) and `resume.py`
(resume functions after graph breaks). Under torch.distributed, `distributed.py` says which module
calls run natively (DDP's forward, FSDP2's hooks) and guards process-group queries, and
`buckets.py` cuts each graph compiled during a DDP forward at DDP's gradient buckets before the
backend sees it. `controls.py` reads the marks torch.compiler's controls leave (`disable`,
`set_stance`, `mark_dynamic`, `allow_in_graph`, `substitute_in_graph`): the one place kiln reads
torch's compiler state, never importing it.

[Note: capture's modules import down, handlers call across]
An interpreter's handlers call each other in a circle (a call reads an attribute, which iterates,
which calls), but its modules do not import each other in one. From the bottom: `interpreter.py`
(the Tracer and its two dispatch tables, `HANDLERS` by opcode and `CALLS` by tracker class) ->
`constants.py` -> `torch_calls.py`, `masks.py`, `distributed.py` -> `attributes.py` -> `keys.py` -> `semantics.py`
-> `iterators.py`, `containers.py`, `classes.py`, `builtins.py`, `autograd_function.py` -> `calls.py`
(which fills `CALLS`) -> `opcodes.py` (which fills `HANDLERS`). A module calls one above it only
through `tx.call` and those tables; `tests/test_import_layers.py` fails on an import circle.
"""
from kiln.capture.explain import ExplainReport, explain
from kiln.capture.frame import capture, reset

__all__ = ["capture", "explain", "reset", "ExplainReport"]
