"""The errors kiln raises to users.

Every error says what failed, where (the stage of the pipeline, and the user's source line when
capture knows it), and what to do about it.
"""
from __future__ import annotations


class KilnError(Exception):
    """Base class of kiln's own errors."""


class InvalidOption(KilnError, ValueError):
    """A `kiln.compile` argument or option has a value kiln does not accept."""


class Unsupported(KilnError, RuntimeError):
    """Code that kiln cannot capture; a graph break, or an error under `fullgraph=True`.

    `where` is the user's `file:line` when capture knows it. A RuntimeError, as torch.compile's
    refusal is (its Unsupported derives from RuntimeError): code that guards a compiled call with
    `except RuntimeError` sees kiln's refusal where it would have seen torch.compile's.
    """

    def __init__(self, reason: str, where: str | None = None):
        self.reason = reason
        self.where = where
        super().__init__(f"{where}: {reason}" if where else reason)


class DynamicDimSpecialized(Unsupported):
    """A dim the user marked dynamic (`mark_dynamic`) that the traced code specialized to a
    constant, where torch.compile raises its ConstraintViolationError (a RuntimeError too)."""


class NotYetImplemented(KilnError, NotImplementedError):
    """A part of kiln that does not exist yet (said plainly, never faked)."""


class CompileStageError(KilnError):
    """A stage of the compiler failed on a graph it should have handled: a kiln bug.

    `stage` is one of capture, symbolic, aot, prims, codegen, runtime; `repro` is the path of a
    standalone script that reproduces the failure, when one was written.
    """

    def __init__(self, stage: str, message: str, repro: str | None = None):
        self.stage = stage
        self.repro = repro
        text = f"kiln {stage} stage failed: {message}"
        if repro:
            text += f"\n  repro script: {repro}"
        text += "\n  to run this model anyway, pass options={'on_error': 'eager'}"
        super().__init__(text)
