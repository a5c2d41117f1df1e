"""`kiln doctor`: versions, a tiny compile on each device checked against eager, a fix for each failure."""
import torch

import kiln
from kiln import doctor
from kiln.cli import main as cli_main


def test_doctor_passes_on_this_machine_and_compiles_through_cpp(capsys):
    assert cli_main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in ("python", "torch", "g++", "cuda", "compile on cpu (C++)"):
        assert f"ok    {name}" in out, out
    assert ("compile on cuda:0 (Triton)" in out) == torch.cuda.is_available()


def test_a_wrong_compile_fails_the_check_and_says_what_to_do(monkeypatch):
    def wrong(fn, **kwargs):
        return lambda x, w: fn(x, w) * 1.01
    monkeypatch.setattr(kiln, "compile", wrong)
    check = doctor.compile_check("cpu", "C++")
    assert not check.ok and "not close" in check.detail and "kiln bug" in check.fix


def test_no_compiler_is_a_failure_with_a_fix(monkeypatch, capsys):
    monkeypatch.setenv("CXX", "no-such-g++")
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "FAIL  g++" in out and "apt-get install g++" in out and "failed: g++" in out
