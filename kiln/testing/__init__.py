"""Testing tools that ship with kiln: random program generation and differential fuzzing against
eager PyTorch (`kiln.testing.fuzz`, `kiln.testing.guard_fuzz`)."""
