"""Testing tools that ship with kiln: random program generation and differential fuzzing against
eager PyTorch (`kiln.testing.fuzz`, `kiln.testing.guard_fuzz`). PyTorch's own Dynamo tests run with
kiln in torch.compile's place are a comparison, in `kiln.bench.dynamo_suite`."""
