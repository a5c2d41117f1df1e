"""The Dynamo-suite runner (kiln.bench.dynamo_suite) classifies each outcome class
([Note: outcome classes]) on a synthetic test file written in Dynamo's test style: no network, no
cache."""
import sys
import textwrap

import pytest

from kiln.bench import dynamo_suite

SYNTHETIC = textwrap.dedent('''
    import unittest

    import torch
    import torch._dynamo.test_case
    from torch._dynamo.testing import CompileCounter


    def off_by_one(gm, example_inputs):      # a backend whose results are wrong
        return lambda *args: [out + 1 for out in gm(*args)]


    class Cases(torch._dynamo.test_case.TestCase):
        def test_pass(self):
            fn = torch.compile(lambda x: x.sin() + 1, backend="eager", fullgraph=True)
            x = torch.randn(3)
            self.assertEqual(fn(x), x.sin() + 1)

        def test_wrong_value(self):
            fn = torch.compile(lambda x: x * 2, backend=off_by_one)
            x = torch.randn(3)
            self.assertEqual(fn(x), x * 2)

        def test_counts_only(self):
            cnts = CompileCounter()
            fn = torch.compile(lambda x: x.cos(), backend=cnts)
            x = torch.randn(3)
            self.assertEqual(fn(x), x.cos())
            self.assertEqual(cnts.frame_count, 7)

        def test_wrong_value_behind_counts(self):
            cnts = CompileCounter()
            fn = torch._dynamo.optimize(cnts)(lambda x: x.cos())
            x = torch.randn(3)
            fn(x)
            self.assertEqual(cnts.frame_count, 7)
            self.assertEqual(fn(x), x.sin())

        def test_refused_under_fullgraph(self):
            def fn(x):
                torch._dynamo.graph_break()    # a break neither compiler may take under fullgraph
                return x * 2
            torch._dynamo.optimize_assert("eager")(fn)(torch.randn(3))

        def test_other_error(self):
            raise RuntimeError("boom")

        @unittest.skip("needs CUDA")
        def test_skipped(self):
            pass

        def test_dynamo_internals(self):
            torch._dynamo.utils.counters["stats"]["calls_captured"]

        @unittest.expectedFailure
        def test_expected_failure(self):
            self.assertTrue(False)
''')

EXPECTED = {
    "Cases.test_pass": "pass",
    "Cases.test_wrong_value": "fail-result",
    "Cases.test_counts_only": "fail-counts",
    "Cases.test_wrong_value_behind_counts": "fail-result",
    "Cases.test_refused_under_fullgraph": "error-unsupported",
    "Cases.test_other_error": "error-other",
    "Cases.test_skipped": "skipped",
    "Cases.test_dynamo_internals": "n/a",
    "Cases.test_expected_failure": "xfail",
}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    path = tmp_path_factory.mktemp("dynamo_tests") / "test_synthetic.py"
    path.write_text(SYNTHETIC)
    return str(path)


@pytest.mark.parametrize("compiler", ["kiln", "torch"])
def test_each_outcome_class(synthetic, compiler):
    outcomes = {o.test: o for o in dynamo_suite.run_in_subprocess("test_synthetic.py", synthetic, compiler)}
    assert {test: o.outcome for test, o in outcomes.items()} == EXPECTED, outcomes
    assert outcomes["Cases.test_wrong_value_behind_counts"].reason.startswith("after a count assertion failed")


def test_report_counts_each_class():
    outcomes = [dynamo_suite.TestOutcome("test_x.py", test, outcome, "why 12")
                for test, outcome in EXPECTED.items()]
    text = dynamo_suite.report({"kiln": outcomes}, [("test_x.py", "abc123", "/nowhere")], "cmd")
    assert "| test_x.py | kiln | 9 | 1 | 1 | 2 | 1 | 1 | 1 | 1 | 1 | 14% |" in text
    assert "| fail-result | 2 | why N |" in text


HANGS = textwrap.dedent('''
    import signal
    import time
    import unittest


    class Cases(unittest.TestCase):
        def test_a_pass(self):
            pass

        def test_b_hang(self):
            signal.signal(signal.SIGALRM, signal.SIG_IGN)    # a hang the per-test alarm cannot end
            time.sleep(600)

        def test_c_never_runs(self):
            pass
''')

LAST_IS_INTERNAL = textwrap.dedent('''
    import unittest

    import torch._dynamo.utils


    class Cases(unittest.TestCase):
        def test_a_pass(self):
            pass

        def test_z_internals(self):
            torch._dynamo.utils.counters["stats"]
''')


def test_every_outcome_reaches_the_parent_the_last_one_included(tmp_path):
    path = tmp_path / "test_last.py"
    path.write_text(LAST_IS_INTERNAL)
    outcomes = dynamo_suite.run_in_subprocess("test_last.py", str(path), "torch")
    assert [(o.test, o.outcome) for o in outcomes] == [("Cases.test_a_pass", "pass"), ("Cases.test_z_internals", "n/a")]


def test_file_timeout_keeps_the_outcomes_that_ran(tmp_path):
    path = tmp_path / "test_hangs.py"
    path.write_text(HANGS)
    outcomes = dynamo_suite.run_in_subprocess("test_hangs.py", str(path), "torch", timeout_s=20)
    assert [(o.test, o.outcome) for o in outcomes] == [("Cases.test_a_pass", "pass"), ("<file>", "error-other")]
    assert "ran past 20s" in outcomes[-1].reason


HELPER = textwrap.dedent('''
    import contextlib

    installed = []


    @contextlib.contextmanager
    def install_guard_manager_testing_hook(hook_fn):
        installed.append(hook_fn)
        try:
            yield
        finally:
            installed.pop()
''')


def test_helper_hook_gets_the_arguments_it_takes(tmp_path, monkeypatch):
    # test_repros.py's hook takes (guard_manager, f_locals); torch 2.13 also passes the builder
    (tmp_path / "utils.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "utils", raising=False)
    dynamo_suite.install_helper_compat(str(tmp_path))
    import utils
    seen = []
    with utils.install_guard_manager_testing_hook(lambda manager, f_locals: seen.append((manager, f_locals))):
        utils.installed[-1]("manager", {"x": 1}, "builder")
    assert seen == [("manager", {"x": 1})]
    monkeypatch.delitem(sys.modules, "utils", raising=False)
