"""How much accuracy each form of x costs a W4A16 linear (docs/roadmap.md, issue 4 item 1).

The tensor-core linears multiply exact weights (n - 8, the group scale applied to each 32-k block's sum) by x
rounded to a 16-bit form. This prints max |y - exact| / max |exact| over the outputs of one W4A16 g32
[2048, 2560] matrix, exact = float64, for x normal and heavy-tailed, in each form:
  BF16 hi/lo   x = bf16(x) + bf16(x - bf16(x)) (the kernels' form today)
  FP16 hi/lo   the same with FP16 parts
  FP16 alone   fp16(x), also with a power-of-two scale per 128-value chunk (the range FP16 lacks)
  BF16 alone   bf16(x), as BF16 engines run

Usage: python bench/x_precision.py   (numpy only; no GPU)
"""
import numpy as np


def bf16(a):
    """Round to nearest even BF16, as float64."""
    bits = np.asarray(a, np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32).astype(np.float64)


def fp16(a):
    return np.asarray(a, np.float16).astype(np.float64)


def forms(x):
    hi = bf16(x)
    hi16 = fp16(x)
    chunks = x.reshape(-1, 128)
    exponent = np.maximum(np.floor(np.log2(np.abs(chunks).max(axis=1, keepdims=True))) - 14, -30)
    return {
        "BF16 hi/lo": hi + bf16(x - hi),
        "FP16 hi/lo": hi16 + fp16(x - hi16),
        "FP16 alone": fp16(x),
        "FP16 alone, chunk-scaled": (fp16(chunks / 2.0**exponent) * 2.0**exponent).reshape(-1),
        "BF16 alone": bf16(x),
    }


def main():
    rng = np.random.default_rng(0)
    n, k, group = 2048, 2560, 32
    codes = rng.integers(0, 16, size=(n, k)).astype(np.float64) - 8
    scales = rng.uniform(0.002, 0.02, size=(n, k // group))
    weights = codes * np.repeat(scales, group, axis=1)
    inputs = {
        "normal": rng.standard_normal(k),
        "heavy-tailed": rng.standard_normal(k) * np.exp(1.5 * rng.standard_normal(k)),
    }
    for name, x in inputs.items():
        exact = weights @ x
        for form, rounded in forms(x).items():
            error = np.abs(weights @ rounded - exact).max() / np.abs(exact).max()
            print(f"{name:13s} {form:25s} max|error| / max|output| = {error:.2e}")


if __name__ == "__main__":
    main()
