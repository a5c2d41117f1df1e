"""Graph capture (TorchDynamo's role): Python callables to torch-level FX graphs plus guards.

Contract with the rest of kiln:
    capture(fn, backend, config: CaptureConfig) -> callable   # same signature as fn
    explain(fn, *args, **kwargs) -> ExplainReport              # graphs, breaks, guards, recompiles
    reset()                                                    # forget every compiled entry
`backend(gm, example_inputs) -> callable` receives each extracted torch-level graph. Parameters and
buffers of modules appear as `get_attr` nodes; later stages read them from `gm` at each call.

How it works, in pipeline order: `frame.py` (the wrapper and its cache of entries) ->
`interpreter.py` + `opcodes.py` (the symbolic bytecode interpreter) -> `semantics.py`,
`attributes.py`, `calls.py`, `classes.py`, `torch_calls.py` (the Python data model over trackers from
`variables.py`, built by `builder.py` with guards from `guards.py`; `views.py` keeps dict views live,
`autograd_function.py` follows `Function.apply`); one module per family of values
registers its callables and methods in `callables.py`'s table (`builtins.py`, `containers.py`,
`collections_types.py`, `iterators.py`, `stdlib_functions.py`, `numpy_calls.py`, `pytree_calls.py`,
`model_outputs.py`) ->
`output.py` (the FX graph) -> `convert.py` + `rebuild.py` (generated entry code) and `resume.py`
(resume functions after graph breaks). Under torch.distributed, `distributed.py` says which module
calls run natively (DDP's forward, FSDP2's hooks) and guards process-group queries, and
`buckets.py` cuts each graph compiled during a DDP forward at DDP's gradient buckets before the
backend sees it.
"""
from kiln.capture.explain import ExplainReport, explain
from kiln.capture.frame import capture, reset

__all__ = ["capture", "explain", "reset", "ExplainReport"]
