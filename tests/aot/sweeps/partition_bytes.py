"""Bytes the forward saves for the backward, per zoo model: min-cut partition vs saving every
forward value the backward reads. Run: python tests/aot/sweeps/partition_bytes.py [--size test|bench]
Output: a markdown table (committed as tests/aot/sweeps/partition_bytes.md)."""
import argparse
import sys

import torch

from kiln.aot import functionalize, min_cut_partition, trace_joint
from kiln.bench.zoo import ZOO


def measure(name: str, size: str = "test"):
    model, inputs = ZOO[name].make("cpu", size=size)
    model.train()
    joint = functionalize(trace_joint(torch.fx.symbolic_trace(model), list(inputs)))
    _, _, info = min_cut_partition(joint)
    return info


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="test")
    args = parser.parse_args(argv)
    print(f"| model ({args.size}) | saved values | min-cut bytes | save-all bytes | ratio | recomputed ops |")
    print("|---|---|---|---|---|---|")
    for name in sorted(ZOO):
        info = measure(name, args.size)
        print(f"| {name} | {len(info.saved)} | {info.bytes_saved} | {info.bytes_save_all} | "
              f"{info.bytes_saved / info.bytes_save_all:.2f} | {len(info.recomputed)} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
