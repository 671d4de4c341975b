#!/usr/bin/env python3
"""Times PyTorch's fused backward kernels on flashcheck problem lines, beside
`flashcheck bench` (which times flashcheck's own subjects and cuDNN's graph,
but sends an external worker no timing request for the backward).

For each line and backend (flash, cudnn, efficient): the forward once, then
torch.autograd.grad of O with dO, retaining the graph, timed with CUDA events:
`--warmup` untimed calls, the median of `--repeats`. Only the backward kernels
run in the timed region (the forward is not replayed). FLOP/s count 2.5 times
the forward's 4 B Hq (visible pairs) d, the convention of cuDNN's and
FlashAttention's benchmarks and of flashcheck bench.

    python3 external/torch_backward_bench.py --problems FILE [--backends flash,cudnn]

Supports: b, hq, hkv, sq, skv, d (dv = d), dtype f16/bf16, mask none, causal_tl,
causal_br (sq == skv, where the two agree); anything else is reported as
unsupported on its line. Exit code: 0, or 2 on bad input.
"""
import argparse
import statistics
import sys


def parse(line):
    fields = dict(item.split("=", 1) for item in line.split())
    p = {k: int(fields[k]) for k in ("b", "hq", "sq", "skv", "d")}
    p["hkv"] = int(fields.get("hkv", p["hq"]))
    p["dtype"] = fields.get("dtype", "bf16")
    p["mask"] = fields.get("mask", "none")
    p["pass"] = fields.get("pass", "fwd")
    return p


def unsupported(p):
    if p["dtype"] not in ("f16", "bf16"):
        return f"dtype {p['dtype']}"
    if p["mask"] not in ("none", "causal_tl", "causal_br"):
        return f"mask {p['mask']}"
    if p["mask"] != "none" and p["sq"] != p["skv"]:
        return "causal with sq != skv"
    return None


def visible_pairs(p):
    if p["mask"] == "none":
        return p["sq"] * p["skv"]
    n = p["sq"]
    return n * (n + 1) // 2


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", required=True, help="a file of problem lines ('#' starts a comment)")
    parser.add_argument("--backends", default="flash,cudnn", help="comma list of flash, cudnn, efficient")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    try:
        lines = [l.split("#")[0].strip() for l in open(args.problems)]
    except OSError as error:
        print(f"torch_backward_bench: {error}", file=sys.stderr)
        return 2
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    for name in chosen:
        if name not in backends:
            print(f"torch_backward_bench: --backends: unknown backend '{name}' (flash, cudnn, efficient)", file=sys.stderr)
            return 2
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    for line in filter(None, lines):
        try:
            p = parse(line)
        except (KeyError, ValueError) as error:
            print(f"torch_backward_bench: bad problem line '{line}': {error}", file=sys.stderr)
            return 2
        why = unsupported(p)
        dtype = torch.bfloat16 if p["dtype"] == "bf16" else torch.float16
        flops = 2.5 * 4 * p["b"] * p["hq"] * visible_pairs(p) * p["d"]
        for name in chosen:
            label = f"torch-{name}-bwd"
            if why:
                print(f"{label:<22} {'-':>9}  {line} (unsupported: {why})")
                continue
            torch.manual_seed(0)
            q = torch.randn(p["b"], p["hq"], p["sq"], p["d"], device="cuda", dtype=dtype, requires_grad=True)
            k = torch.randn(p["b"], p["hkv"], p["skv"], p["d"], device="cuda", dtype=dtype, requires_grad=True)
            v = torch.randn(p["b"], p["hkv"], p["skv"], p["d"], device="cuda", dtype=dtype, requires_grad=True)
            dout = torch.randn(p["b"], p["hq"], p["sq"], p["d"], device="cuda", dtype=dtype)
            try:
                with sdpa_kernel(backends[name]):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=p["mask"] != "none",
                                                         enable_gqa=p["hkv"] != p["hq"])
                times = []
                for n in range(args.warmup + args.repeats):
                    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                    stop.record()
                    torch.cuda.synchronize()
                    if n >= args.warmup:
                        times.append(start.elapsed_time(stop))
            except RuntimeError as error:
                print(f"{label:<22} {'-':>9}  {line} (failed: {str(error).splitlines()[0][:120]})")
                continue
            ms = statistics.median(times)
            print(f"{label:<22} {ms:9.3f}  {line}  {flops / ms / 1e9:.0f} TFLOP/s (median of {len(times)})")
            del out, q, k, v, dout
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
