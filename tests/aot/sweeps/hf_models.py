"""transformers models (small random configs, CPU, fp32): one training step through aot_compile vs
eager. Dropout is off (config rates 0): kiln's functional rng draws other bits than eager.
Run: python tests/aot/sweeps/hf_models.py [names...]   (output committed as hf_models.md)"""
import copy
import sys
import time

import torch

from kiln.aot import aot_compile
from kiln.bench.accuracy import same, tolerance

VOCAB, BATCH, SEQ = 256, 2, 16


def build(name: str):
    import transformers as T
    configs = {
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB,
                                                       n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                                       attn_pdrop=0.0)),
        "bert": lambda: T.BertForMaskedLM(T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                       intermediate_size=128, vocab_size=VOCAB,
                                                       max_position_embeddings=64, hidden_dropout_prob=0.0,
                                                       attention_probs_dropout_prob=0.0)),
        "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4,
                                                              vocab_size=VOCAB, d_kv=16, dropout_rate=0.0)),
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                          num_attention_heads=4, num_key_value_heads=2,
                                                          vocab_size=VOCAB, max_position_embeddings=64)),
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = configs[name]().train()
        ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    inputs = {"input_ids": ids, "labels": ids}
    if name == "t5":
        inputs["decoder_input_ids"] = ids
    return model, inputs


class LossOf(torch.nn.Module):
    """model(**inputs) -> loss, with the inputs positional (aot_compile's calling convention)."""

    def __init__(self, model, keys):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *tensors):
        return self.model(**dict(zip(self.keys, tensors)), return_dict=False)[0]


def check(name: str):
    model, inputs = build(name)
    reference = copy.deepcopy(model)
    keys = list(inputs)
    args = [inputs[k] for k in keys]
    start = time.time()
    compiled = aot_compile(LossOf(model, keys), args, fw_compiler=lambda g, _: g.forward,
                           bw_compiler=lambda g, _: g.forward)
    seconds = time.time() - start
    loss = compiled(*args)
    loss.backward()
    expected = LossOf(reference, keys)(*args)
    expected.backward()
    tol = tolerance("hf", "train", "fp32")
    verdict = same([expected.detach()] + [p.grad for p in reference.parameters()],
                   [loss.detach()] + [p.grad for p in model.parameters()], tol=tol)
    return verdict, compiled, seconds


def main(names):
    print("| model | same as eager | traced on | compile s | saved bytes (min-cut) | save-all bytes |")
    print("|---|---|---|---|---|---|")
    for name in names:
        verdict, compiled, seconds = check(name)
        info = compiled.info
        print(f"| {name} | {'yes' if verdict.ok else 'NO: ' + verdict.detail} | {compiled.joint.traced_on} | "
              f"{seconds:.1f} | {info.bytes_saved} | {info.bytes_save_all} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:] or ["gpt2", "bert", "t5", "llama"])
