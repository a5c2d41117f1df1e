"""Expected failures of the op sweep: OpInfo name -> {"forward" | "backward": reason}.

The one list of what kiln's decompositions do not reproduce, each with its reason; the CI slice
(tests/prims/test_prims_sweep.py) marks these xfail(strict=True), so a fix shows up as an unexpected pass.
"""
EXPECTED_FAILURES: dict[str, dict[str, str]] = {}
