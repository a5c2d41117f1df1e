"""Shared by every test folder: model libraries importable on the CPU-only torch (see
`kiln.bench.suites.ensure_torchvision_importable`), before any test module imports transformers or timm."""
from kiln.bench.suites import ensure_torchvision_importable

ensure_torchvision_importable()
