"""The benchmark's accuracy rule (PyTorch's `same`) on synthetic tensors: each branch of the rule
is made to pass and to fail."""
import torch

from kiln.bench.accuracy import flatten, rmse, same, tolerance


def test_allclose_passes_and_a_large_error_fails():
    ref = torch.randn(64, 64, dtype=torch.float64).float()
    assert same(ref, ref + 1e-6, tol=1e-4).ok
    verdict = same(ref, ref + 1e-2, tol=1e-4)
    assert not verdict.ok and "no float64 run" in verdict.detail


def test_rmse_fallback_accepts_an_error_no_worse_than_eagers():
    torch.manual_seed(0)
    exact = torch.randn(1000, dtype=torch.float64)
    eager = (exact + 1e-3 * torch.randn(1000, dtype=torch.float64)).float()
    compiled = (exact + 1.5e-3 * torch.randn(1000, dtype=torch.float64)).float()   # worse, but < 2x
    assert not torch.allclose(eager, compiled, atol=1e-4, rtol=1e-4)
    assert same(eager, compiled, exact, tol=1e-4).ok


def test_rmse_fallback_rejects_more_than_twice_eagers_error_in_fp32():
    torch.manual_seed(0)
    exact = torch.randn(1000, dtype=torch.float64)
    noise = torch.randn(1000, dtype=torch.float64)
    eager = (exact + 1e-3 * noise).float()
    compiled = (exact + 3e-3 * torch.randn(1000, dtype=torch.float64)).float()
    verdict = same(eager, compiled, exact, tol=1e-4)
    assert not verdict.ok and "RMSE" in verdict.detail
    assert rmse(exact, compiled) > 2 * rmse(exact, eager)


def test_bf16_results_get_a_3x_multiplier():
    torch.manual_seed(0)
    exact = torch.randn(4000, dtype=torch.float64)
    eager = (exact + 1e-2 * torch.randn(4000, dtype=torch.float64)).bfloat16()
    compiled = (exact + 2.5e-2 * torch.randn(4000, dtype=torch.float64)).bfloat16()
    ratio = rmse(exact, compiled) / rmse(exact, eager)
    assert 2.0 < ratio < 3.0
    assert same(eager, compiled, exact, tol=1e-4).ok                               # within 3x for bf16
    assert not same(eager.float(), compiled.float(), exact, tol=1e-4).ok           # but not 2x for fp32


def test_integers_must_match_exactly_and_structure_must_agree():
    a = torch.arange(10)
    assert same(a, a.clone()).ok
    assert not same(a, a + 1).ok
    assert not same([a, a], [a]).ok
    assert not same(torch.zeros(3), torch.zeros(4)).ok
    assert not same(torch.zeros(3), torch.zeros(3, dtype=torch.float64)).ok


def test_nan_in_compiled_result_fails():
    exact = torch.randn(100, dtype=torch.float64)
    eager = exact.float()
    compiled = eager.clone()
    compiled[3] = float("nan")
    assert not same(eager, compiled, exact, tol=1e-4).ok


def test_outputs_are_walked_as_trees():
    out = {"logits": torch.ones(2), "hidden": (torch.zeros(1), 3)}
    assert [type(x) for x in flatten(out)] == [torch.Tensor, torch.Tensor, int]
    assert not same(out, {"logits": torch.ones(2), "hidden": (torch.zeros(1), 4)}).ok


def test_tolerances_are_looser_for_training_and_bf16():
    assert tolerance("zoo", "infer", "fp32") < tolerance("zoo", "train", "fp32") < tolerance("zoo", "train", "bf16")


# ---------------------------------------------------------------------------- relative=True (the fuzzer's rule)

def test_a_small_wrong_gradient_passes_the_absolute_rule_and_fails_the_relative_one():
    torch.manual_seed(0)
    exact = 1e-5 * torch.randn(100, dtype=torch.float64)
    eager = exact.float()
    wrong = -eager                                      # every value wrong, all below the atol
    assert same(eager, wrong, exact, tol=1e-3).ok      # PyTorch's rule: allclose at atol 1e-3
    verdict = same(eager, wrong, exact, tol=1e-3, relative=True)
    assert not verdict.ok and "RMSE" in verdict.detail
    assert not same(eager, wrong, tol=1e-3, relative=True).ok          # no float64 run: allclose alone


def test_the_relative_rule_accepts_rounding_at_any_scale():
    torch.manual_seed(0)
    for scale in (1e-8, 1.0, 1e6):
        exact = scale * torch.randn(256, 512, dtype=torch.float64)
        eager = exact.float().sum(1)                                    # one summation order
        reordered = exact.float().view(256, 8, 64).sum(1).sum(1)        # another (a split reduction)
        assert not torch.equal(eager, reordered)
        assert same(eager, reordered, exact.sum(1), tol=1e-4, relative=True).ok


def test_the_relative_rule_on_zeros_nonfinite_values_and_floats():
    zeros = torch.zeros(5)
    assert same(zeros, zeros.clone(), zeros.double(), relative=True).ok
    assert not same(zeros, zeros + 1e-9, zeros.double(), relative=True).ok
    inf = torch.tensor([float("inf"), 1.0, float("nan")])
    assert same(inf, inf.clone(), inf.double(), relative=True).ok
    assert not same(inf, torch.tensor([float("inf"), 2.0, float("nan")]), inf.double(), relative=True).ok
    assert same(1e-9, 1e-9 * (1 + 1e-7), 1e-9, relative=True).ok
    assert not same(1e-9, 2e-9, 1e-9, relative=True).ok
    assert same(1e-9, 2e-9).ok                                   # the absolute rule's abs_tol


def test_greedy_decode_verdict_allows_a_near_tie_only():
    """[Note: greedy decoding's near ties]: a swapped token passes only where that step's logits
    pass the rule against float64; later tokens (another prefix) are not compared."""
    import copy
    import types

    from kiln.bench.accuracy import same_greedy_decode
    from kiln.bench.suites import ensure_torchvision_importable
    ensure_torchvision_importable()
    import transformers
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    ids = torch.randint(1, 100, (1, 5))
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0,
                             return_dict_in_generate=True, output_logits=True)
    assert same_greedy_decode(model, ids, ref, ref).ok
    margins = [float(t.topk(2).values[0, 0] - t.topk(2).values[0, 1]) for t in ref.logits]
    step = min(range(len(margins)), key=margins.__getitem__)     # the closest call eager made

    def swapped(noise):
        """ref with token `step` replaced by its runner-up (raised to just above the top), the logits
        there moved by `noise` x their spread, and another prefix after it"""
        res = types.SimpleNamespace(sequences=ref.sequences.clone(), logits=list(copy.deepcopy(ref.logits)))
        logits = res.logits[step].float()
        top = logits[0].topk(2)
        logits = logits + noise * logits.std() * torch.randn_like(logits)
        logits[0, top.indices[1]] = logits[0].max() + 1e-3
        res.logits[step] = logits
        res.sequences[0, 5 + step] = top.indices[1]
        res.sequences[0, 5 + step + 1:] = (res.sequences[0, 5 + step + 1:] + 1) % 100
        return res
    tie = same_greedy_decode(model, ids, ref, swapped(0.0))
    assert tie.ok and f"token {step} of 8 differs" in tie.detail, (margins, tie.detail)
    wrong = same_greedy_decode(model, ids, ref, swapped(1.0))
    assert not wrong.ok and f"token {step} of 8 differs" in wrong.detail
