"""PyTorch's own Dynamo tests (`test/dynamo/test_*.py`) run with kiln in torch.compile's place.

    python -m kiln.bench.dynamo_suite --fetch
    python -m kiln.bench.dynamo_suite --compiler kiln --compiler torch --out RESULTS.md

The test files are reference data read from PyTorch's public repository into a git-ignored cache,
`.cache/dynamo-tests/<commit>/<file>`, never committed. `--fetch` downloads them at the commit the
installed torch was built from; a cache filled by other means (one commit folder per file) works
the same, and the report names each file's commit. A file that upstream splits into helper modules
(test_misc.py into `_test_misc_part*.py`, test_ctx_manager.py importing test_functions.py) needs
those helpers in the same folder; `--fetch` fetches only the names it is given.

Each file runs in its own subprocess (a crash or a hang costs one file, and kiln's run never shares
a process with Dynamo's). For `--compiler kiln` a shim is installed before the file is imported:

- `torch.compile`, `torch._dynamo.optimize(backend, nopython=...)` and `optimize_assert` become
  `kiln.compile` with the same backend and `fullgraph` meaning ("inductor" means kiln's own
  backend); a backend callable such as `CompileCounter` or `EagerAndRecordGraphs` is handed kiln's
  graphs, so `frame_count` counts kiln's graphs;
- `torch._dynamo.reset` also resets kiln;
- `torch._dynamo.exc.Unsupported` matches kiln's `Unsupported` as well as Dynamo's, so a test
  expecting a refusal under fullgraph accepts kiln's, and `BackendCompilerFailed` matches kiln's
  `CompileStageError` (a backend that raised: kiln names the stage where Dynamo wraps it);
- `torch._dynamo.testing.same` stays.

[Note: outcome classes] Each test gets one class, in this order of precedence:
- skipped: unittest skipped it (a skip decorator: CUDA, Python version, ...);
- n/a: its source reads Dynamo internals (graph or message text, counters, logging, bytecode,
  side effects, compilation metrics) or needs CUDA; neither compiler runs it, so both rates
  cover the same tests (`INTERNALS` lists the markers and why);
- pass (an upstream expectedFailure that passes counts as a pass) / xfail (upstream expects it to
  fail, and it does);
- fail-result: an assertion on a value failed: the compiled code computed something else;
- fail-counts: only an assertion on frame/op/graph counts failed (kiln splits graphs differently);
- error-unsupported: the compiler refused (kiln's or Dynamo's `Unsupported`, a graph break under
  fullgraph);
- error-other: anything else (an exception inside the compiler, an assertion of the compiler's own,
  a timeout, a name the installed torch lacks).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import inspect
import json
import linecache
import os
import re
import signal
import subprocess
import sys
import traceback
import unittest
import urllib.error
import urllib.request

CACHE = os.path.join(os.path.dirname(__file__), "..", "..", ".cache", "dynamo-tests")
RAW = "https://raw.githubusercontent.com/pytorch/pytorch/{commit}/test/dynamo/{name}"
FILES = ["test_list.py", "test_dicts.py", "test_sets.py", "test_ctx_manager.py", "test_exceptions.py",
         "test_generator.py", "test_misc.py", "test_repros.py", "test_higher_order_ops.py"]
OUTCOMES = ["pass", "xfail", "fail-result", "fail-counts", "error-unsupported", "error-other",
            "skipped", "n/a"]
TEST_TIMEOUT_S = 60

# A test whose source matches one of these checks Dynamo itself, not the compiled program's
# results: kiln cannot be expected to reproduce it, so neither compiler runs it.
INTERNALS = [
    (r"assertExpectedInline|normalize_gm|print_readable|assertExpectedRaisesInline|"
     r"assertRaisesRegex\(\s*(torch\._dynamo\.exc\.)?Unsupported", "Dynamo's graph or message text"),
    (r"\bcounters\[|get_compilation_metrics|compilation_metrics", "Dynamo's counters or metrics"),
    (r"make_logging_test|LoggingTestCase|torch\._logging|\brecords\b", "Dynamo's logging"),
    (r"side_effects|symbolic_convert|bytecode_transformation|SpeculationLog|guard_manager|"
     r"CheckFunctionManager|_dynamo\.eval_frame|_dynamo\.variables", "Dynamo's internal classes"),
    (r"canonicaliz|_aot_autograd|_dynamo_source|graph\.nodes|_get_graph_node_names|fx\.Graph\(",
     "Dynamo's or AOT's graph structure"),
    (r"\.cuda\(|device=\"cuda\"|requires_cuda|TEST_CUDA", "CUDA"),
]
# An AssertionError raised inside a compiler is the compiler's failure, not a test's assertion:
# torch's compiler packages and kiln's own (by their installed paths: a checkout in a folder named
# kiln holds its virtual environment, torch included, under .../kiln/.venv/)
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPILER_FRAMES = re.compile(r"/torch/(_dynamo|_functorch|_inductor|fx)/|^" + re.escape(_KILN_DIR + os.sep)
                             + r"(?!bench/dynamo_suite)")
# Dynamo's helpers that tests call to run and check a function (`torch._dynamo.testing.standard_test`).
TEST_HELPERS = re.compile(r"/torch/_dynamo/testing\.py$")
# An assertion line matching this is about how many frames, graphs or ops were compiled.
COUNTS = re.compile(r"frame_count|op_count|\.graphs\b|graph_count|\bcnts?\b|\bcounter\b|CompileCounter")


@dataclasses.dataclass
class TestOutcome:
    file: str
    test: str
    outcome: str
    reason: str = ""


# ---------------------------------------------------------------------------------------- cache

def fetch(commit: str, names: list[str] = FILES) -> list[str]:
    """Download `names` at `commit` into the cache; returns the paths written."""
    folder = os.path.join(CACHE, commit)
    written = []
    for name in names:
        url = RAW.format(commit=commit, name=name)
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as e:
            print(f"{name}: not at {commit} ({e.code}); skipped", file=sys.stderr)
            continue
        except (urllib.error.URLError, OSError) as e:
            raise SystemExit(f"cannot reach raw.githubusercontent.com ({e}); fetch needs internet access, "
                             f"or fill {os.path.normpath(folder)}/ with the test files by other means")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(text)
        written.append(path)
    return written


def cached_files(names: list[str] = FILES) -> list[tuple[str, str, str]]:
    """(name, commit, path) of each cached test file; the installed torch's commit is preferred."""
    import torch
    found = []
    commits = sorted(os.listdir(CACHE)) if os.path.isdir(CACHE) else []
    commits.sort(key=lambda c: c != torch.version.git_version)
    for name in names:
        for commit in commits:
            path = os.path.join(CACHE, commit, name)
            if os.path.exists(path):
                found.append((name, commit, os.path.normpath(path)))
                break
    return found


# ----------------------------------------------------------------------------------------- shim

def install_kiln_shim() -> None:
    """Make the test files' entry points into Dynamo compile with kiln instead."""
    import torch
    import torch._dynamo
    import torch._dynamo.exc
    import torch._dynamo.test_case
    import torch._dynamo.testing

    import kiln
    from kiln.errors import Unsupported

    def kiln_backend(backend):
        return "kiln" if backend in (None, "inductor") else backend

    def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None,
                options=None, disable=False):
        if disable:
            return model if model is not None else (lambda fn: fn)
        backend = kiln_backend(backend)
        return kiln.compile(model, fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                            mode=mode if backend == "kiln" else None)

    def optimize(backend="inductor", *, nopython=False, dynamic=None, **_):
        return lambda fn: compile(fn, backend=backend, fullgraph=nopython, dynamic=dynamic)

    def optimize_assert(backend="inductor", *, dynamic=None, **_):
        return optimize(backend, nopython=True, dynamic=dynamic)

    real_reset = torch._dynamo.reset

    def reset():
        real_reset()
        kiln.reset()

    torch.compile = compile
    for module in (torch._dynamo, torch._dynamo.testing, torch._dynamo.test_case):
        for name, value in [("optimize", optimize), ("optimize_assert", optimize_assert), ("reset", reset)]:
            if hasattr(module, name):
                setattr(module, name, value)
    from kiln.errors import CompileStageError
    exc = torch._dynamo.exc
    exc.Unsupported = _either(Unsupported, exc.Unsupported,
                              kiln_call=lambda args, kwargs: len(args) <= 2 and not kwargs.keys() - {"where"})
    exc.BackendCompilerFailed = _either(CompileStageError, exc.BackendCompilerFailed)
    from torch.fx.experimental import symbolic_shapes   # bench only: the tests' name for the error
    from kiln.errors import DynamicDimSpecialized
    symbolic_shapes.ConstraintViolationError = _either(DynamicDimSpecialized, symbolic_shapes.ConstraintViolationError)


def _either(kiln_error: type, dynamo_error: type, kiln_call=lambda args, kwargs: False) -> type:
    """The class the shim puts at a name of `torch._dynamo.exc` (`Unsupported`,
    `BackendCompilerFailed`) or of `symbolic_shapes` (`ConstraintViolationError`): a test's `assertRaises` with it accepts kiln's error and Dynamo's
    alike, and Dynamo's own code that still runs under the shim (`torch._dynamo.export`,
    `torch.cond`'s tracing), which builds one through the module global with Dynamo's arguments
    (`Unsupported(msg, case_name=...)`), gets Dynamo's own class, which its `except` clauses (bound
    at import) catch as they do without the shim. `kiln_call(args, kwargs)`: whether a
    construction is kiln's (the test files' `raise Unsupported(...)`)."""
    kinds = (kiln_error, dynamo_error)

    class Either(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, kinds)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, kinds)

    class Shim(kiln_error, metaclass=Either):
        def __new__(cls, *args, **kwargs):
            return (kiln_error if kiln_call(args, kwargs) else dynamo_error)(*args, **kwargs)

    Shim.__name__ = Shim.__qualname__ = dynamo_error.__name__
    return Shim


def install_compat() -> None:
    """Names the test files import that the installed torch lacks (a stub each, nothing more).

    Newer files import names torch has not got yet; older ones (test_higher_order_ops.py,
    test_repros.py at the commits the cache holds) import names torch has since renamed or dropped:
    `HAS_CUDA` (whether CUDA and Triton are usable: False on this CPU build, so CUDA tests skip) and
    `disable_translation_validation_if_dynamic_shapes` (a decorator that turns off Dynamo's own
    translation validation: nothing to turn off for kiln, and off by default for torch)."""
    import enum

    import torch
    from torch.testing._internal import common_utils, inductor_utils
    if not hasattr(common_utils, "HardwareClassification"):
        common_utils.HardwareClassification = enum.Enum("HardwareClassification", "GENERIC CPU CUDA")
    if not hasattr(common_utils, "disable_translation_validation_if_dynamic_shapes"):
        common_utils.disable_translation_validation_if_dynamic_shapes = lambda fn: fn
    if not hasattr(inductor_utils, "HAS_CUDA"):
        inductor_utils.HAS_CUDA = torch.cuda.is_available() and getattr(inductor_utils, "HAS_TRITON", False)


def install_helper_compat(folder: str) -> None:
    """The test folder's own helper module (`utils.py`), adapted to the installed torch where the
    two disagree. test_repros.py's setUp installs a hook (Dynamo's self-check of its guard
    managers: torch's compiler calls it, kiln's never does) written for `hook(guard_manager,
    f_locals)`; torch 2.13 passes the guard builder as a third argument. The hook is handed the
    arguments it takes, as the torch the file was written for handed them."""
    if not os.path.exists(os.path.join(folder, "utils.py")):
        return
    import inspect

    import utils as helper
    install = getattr(helper, "install_guard_manager_testing_hook", None)
    if install is None or getattr(install, "kiln_compat", False):
        return

    def adapted(hook_fn):
        try:
            params = inspect.signature(hook_fn).parameters.values()
        except (TypeError, ValueError):
            return install(hook_fn)
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            return install(hook_fn)
        n = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
        return install(lambda *args: hook_fn(*args[:n]))

    adapted.kiln_compat = True
    helper.install_guard_manager_testing_hook = adapted


# --------------------------------------------------------------------------------------- worker

def internals_reason(test: unittest.TestCase) -> str | None:
    """Why `test` checks Dynamo itself rather than results, or None ([Note: outcome classes])."""
    method = getattr(test, test._testMethodName)
    try:
        source = inspect.getsource(inspect.unwrap(method))
    except (OSError, TypeError):
        return None
    for pattern, why in INTERNALS:
        if re.search(pattern, source):
            return why
    return None


def classify_error(err, test_file: str) -> tuple[str, str]:
    """The outcome class and a one-line reason for an exception a test raised."""
    kind, value, tb = err
    text = getattr(value, "reason", None) if isinstance(getattr(value, "reason", None), str) else str(value)
    reason = f"{kind.__name__}: " + (text.strip().splitlines() or [""])[0][:160]   # kiln's without `where`
    from torch._dynamo.exc import Unsupported as DynamoUnsupported   # the shim may have replaced it
    from kiln.errors import NotYetImplemented, Unsupported
    if issubclass(kind, (Unsupported, NotYetImplemented, DynamoUnsupported)) or \
            kind.__module__.startswith("torch._dynamo.exc") and "Unsupported" in kind.__name__:
        return "error-unsupported", reason
    innermost = traceback.extract_tb(tb)[-1].filename if tb else ""
    if issubclass(kind, AssertionError) and not COMPILER_FRAMES.search(innermost):
        # the test's own line, or the line of Dynamo's test helper it called (`standard_test`
        # asserts the op count itself)
        frames = [f for f in traceback.extract_tb(tb) if f.filename == test_file or TEST_HELPERS.search(f.filename)]
        statement = _statement(frames[-1].filename, frames[-1].lineno) if frames else ""
        if COUNTS.search(statement):
            return "fail-counts", f"counts: {' '.join(statement.split())}"
        return "fail-result", reason
    return "error-other", reason


def _statement(path: str, line: int) -> str:
    """The Python statement starting at `path:line` (up to 8 lines, until its brackets close)."""
    text = ""
    for n in range(line, line + 8):
        text += linecache.getline(path, n)
        if text.count("(") + text.count("[") <= text.count(")") + text.count("]"):
            break
    return text


ASSERTIONS = ["assertEqual", "assertGreater", "assertGreaterEqual", "assertLess", "assertLessEqual",
              "assertTrue", "assertFalse", "assertIs", "assertIsNot", "assertNotEqual", "assertIn"]


def soften_count_assertions(test: unittest.TestCase, test_file: str) -> None:
    """Let `test`'s assertions on counts fail silently, so the rest of it still checks values.

    [Note: counts hide results] A test that asserts `frame_count == 2` before comparing the
    recompiled result stops at the count; with kiln a wrong count can mean a guard that did not
    fire and a stale result right after. A test that fails only on counts is therefore run again
    with this softening: if a value assertion then fails it is fail-result, else fail-counts."""
    for name in ASSERTIONS:
        original = getattr(test, name)

        def soft(*args, __original=original, **kwargs):
            caller = sys._getframe(1)
            try:
                return __original(*args, **kwargs)
            except AssertionError:
                if caller.f_code.co_filename == test_file and COUNTS.search(_statement(test_file, caller.f_lineno)):
                    return None
                raise
        setattr(test, name, soft)


class ClassifyingResult(unittest.TestResult):
    """Collects one TestOutcome per test ([Note: outcome classes])."""

    def __init__(self, file: str, test_file: str):
        super().__init__()
        self.file, self.test_file = file, test_file
        self.outcomes: dict[str, TestOutcome] = {}

    def record(self, test, outcome, reason=""):
        name = test.id().split(".", 1)[-1]
        if name not in self.outcomes or self.outcomes[name].outcome == "pass":
            self.outcomes[name] = TestOutcome(self.file, name, outcome, reason)

    def addSuccess(self, test):
        self.record(test, "pass")

    def addUnexpectedSuccess(self, test):
        self.record(test, "pass", "upstream expects a failure")

    def addExpectedFailure(self, test, err):
        self.record(test, "xfail", classify_error(err, self.test_file)[1])

    def addSkip(self, test, reason):
        self.record(test, "n/a" if reason.startswith("n/a: ") else "skipped", reason.removeprefix("n/a: "))

    def addFailure(self, test, err):
        self.record(test, *classify_error(err, self.test_file))

    addError = addFailure

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self.record(test, *classify_error(err, self.test_file))


def _timeout(signum, frame):
    raise TimeoutError(f"test ran past {TEST_TIMEOUT_S}s")


def run_file(name: str, path: str, compiler: str, emit=None) -> list[TestOutcome]:
    """Import one cached test file and run its tests under `compiler` (in this process).

    `emit`, if given, is called with each outcome as soon as its test has finished, so that a
    parent which has to kill a file that runs too long keeps the outcomes of the tests that ran."""
    path = os.path.abspath(path)
    install_compat()
    if compiler == "kiln":
        install_kiln_shim()
    sys.path.insert(0, os.path.dirname(path))   # the files import their helper modules by name
    install_helper_compat(os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        outcome = TestOutcome(name, "<import>", "error-other", f"{type(e).__name__}: {e}"[:200])
        if emit:
            emit(outcome)
        return [outcome]
    result = ClassifyingResult(name, path)
    signal.signal(signal.SIGALRM, _timeout)
    emitted: list[str] = []

    def flush():   # hand on the outcomes recorded since the last call
        for key in list(result.outcomes)[len(emitted):]:
            emit(result.outcomes[key])
            emitted.append(key)
    if emit is None:
        flush = lambda: None   # noqa: E731
    for test in _flatten(unittest.defaultTestLoader.loadTestsFromModule(module)):
        why = internals_reason(test)
        if why:
            result.addSkip(test, f"n/a: {why}")
            flush()
            continue
        signal.alarm(TEST_TIMEOUT_S)
        try:
            test.run(result)
            name = test.id().split(".", 1)[-1]
            if result.outcomes.get(name, TestOutcome("", "", "")).outcome == "fail-counts":
                again = ClassifyingResult(result.file, path)
                soften_count_assertions(test, path)
                test.run(again)
                if again.outcomes[name].outcome == "fail-result":
                    result.outcomes[name] = dataclasses.replace(
                        again.outcomes[name], reason=f"after a count assertion failed: {again.outcomes[name].reason}")
        finally:
            signal.alarm(0)
        flush()
    return list(result.outcomes.values())


def _flatten(suite):
    for item in suite:
        yield from (_flatten(item) if isinstance(item, unittest.TestSuite) else [item])


# ---------------------------------------------------------------------------------------- report

def run_in_subprocess(name: str, path: str, compiler: str, timeout_s: int = 3600) -> list[TestOutcome]:
    """Run one file in a worker process. The worker prints each outcome as its test finishes: a
    file killed at `timeout_s` keeps the outcomes of the tests that ran, plus one error-other row
    for the rest; a worker that dies keeps them too, plus one row saying how it died."""
    command = [sys.executable, "-m", "kiln.bench.dynamo_suite", "--worker", name, path, compiler]
    root = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
        stdout, stderr, died = done.stdout, done.stderr, done.returncode != 0
        why = f"worker exited {done.returncode}"
    except subprocess.TimeoutExpired as e:
        decode = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        stdout, stderr, died = decode(e.stdout), decode(e.stderr), True
        why = f"file ran past {timeout_s}s; the tests after the last one reported did not run"
    rows = [json.loads(line[len("OUTCOME "):]) for line in stdout.splitlines() if line.startswith("OUTCOME ")]
    outcomes = [TestOutcome(**row) for row in rows]
    if died or not rows:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        outcomes.append(TestOutcome(name, "<file>", "error-other", f"{why}: {tail}"[:200]))
    return outcomes


def group_reason(reason: str) -> str:
    """A reason with its particulars (numbers, addresses) blanked, for grouping."""
    reason = re.sub(r"0x[0-9a-f]+", "0x…", reason)
    return re.sub(r"\d+", "N", reason)[:140]


def report(results: dict[str, list[TestOutcome]], files: list[tuple[str, str, str]], command: str) -> str:
    lines = [f"# PyTorch's Dynamo tests through kiln and torch.compile (CPU)", "", f"Command: `{command}`", "",
             "Outcome classes: see [Note: outcome classes] in `kiln/bench/dynamo_suite.py`. "
             "rate = pass / (tests - skipped - n/a); n/a tests (Dynamo internals, CUDA) run under neither.", "",
             "| file | compiler | tests | " + " | ".join(OUTCOMES) + " | rate |",
             "|---|---|---|" + "---|" * len(OUTCOMES) + "---|"]
    names = [name for name, _, _ in files]
    for name in names + (["all"] if len(names) > 1 else []):
        for compiler, outcomes in results.items():
            mine = [o for o in outcomes if o.file == name or name == "all"]
            count = collections.Counter(o.outcome for o in mine)
            ran = len(mine) - count["skipped"] - count["n/a"]
            rate = f"{count['pass'] / ran:.0%}" if ran else "-"
            lines.append(f"| {name} | {compiler} | {len(mine)} | " + " | ".join(str(count[o]) for o in OUTCOMES)
                         + f" | {rate} |")
    lines += ["", "Files (reference data from github.com/pytorch/pytorch, cached, not committed):", ""]
    lines += [f"- `test/dynamo/{name}` at `{commit}`" for name, commit, _ in files]
    for compiler, outcomes in results.items():
        failed = [o for o in outcomes if o.outcome not in ("pass", "xfail", "skipped", "n/a")]
        groups = collections.Counter((o.outcome, group_reason(o.reason)) for o in failed)
        lines += ["", f"## {compiler}: failure reasons, grouped (most frequent first)", "",
                  "| outcome | tests | reason | e.g. |", "|---|---|---|---|"]
        for (outcome, reason), n in groups.most_common(40):
            example = next(o for o in failed if o.outcome == outcome and group_reason(o.reason) == reason)
            lines.append(f"| {outcome} | {n} | {reason.replace('|', '/')} | {example.file}::{example.test} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kiln.bench.dynamo_suite", description=__doc__.splitlines()[0])
    parser.add_argument("--fetch", action="store_true", help="download the test files into the cache")
    parser.add_argument("--commit", help="pytorch commit to fetch (default: the installed torch's)")
    parser.add_argument("--compiler", action="append", choices=["kiln", "torch"], help="repeatable")
    parser.add_argument("--files", nargs="*", default=FILES, help="test file names (default: all listed)")
    parser.add_argument("--out", help="write the markdown report here (and the outcomes as .jsonl beside it)")
    parser.add_argument("--worker", nargs=3, metavar=("NAME", "PATH", "COMPILER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_file(*args.worker, emit=lambda outcome: print("OUTCOME " + json.dumps(dataclasses.asdict(outcome)),
                                                          flush=True))
        return
    if args.fetch:
        import torch
        for path in fetch(args.commit or torch.version.git_version, args.files):
            print(f"fetched {path}")
    if not args.compiler:
        return
    files = cached_files(args.files)
    if not files:
        raise SystemExit(f"no cached test files in {os.path.normpath(CACHE)}; run with --fetch first")
    results = {}
    for compiler in args.compiler:
        results[compiler] = []
        for name, _, path in files:
            outcomes = run_in_subprocess(name, path, compiler)
            print(f"{compiler} {name}: {collections.Counter(o.outcome for o in outcomes)}", file=sys.stderr)
            results[compiler] += outcomes
    text = report(results, files, "python -m kiln.bench.dynamo_suite " + " ".join(argv or sys.argv[1:]))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        with open(os.path.splitext(args.out)[0] + ".jsonl", "w") as f:
            for compiler, outcomes in results.items():
                for o in outcomes:
                    f.write(json.dumps({"compiler": compiler, **dataclasses.asdict(o)}) + "\n")


if __name__ == "__main__":
    main()
