"""Graph capture (TorchDynamo's role): Python callables to torch-level FX graphs plus guards.

Contract with the rest of kiln:
    capture(fn, backend, config: CaptureConfig) -> callable   # same signature as fn
    explain(fn, *args, **kwargs) -> report                     # graphs, breaks, guards, recompiles
    reset()                                                    # forget every compiled entry
`backend(gm, example_inputs) -> callable` receives each extracted torch-level graph. Parameters and
buffers of modules may appear as `get_attr` nodes; later stages read them from `gm` at each call.

Until the bytecode interpreter lands this package re-exports the `stopgap` (torch.fx.symbolic_trace).
"""
from kiln.capture.stopgap import capture, explain, reset

__all__ = ["capture", "explain", "reset"]
