#!/usr/bin/env python3
"""Checks the fixtures against an independent float64 numpy transcription of the Qwen3.5 text model.

The transcription follows the written description (shared/reference/qwen35-model.md §3-§4), not HF's
code: zero-centred RMSNorm (1 + w), per-head interleaved query/gate, partial NeoX RoPE, GQA, the
token-by-token gated delta rule (grouped key heads), the gated output norm (w, not 1 + w). Agreement
with HF's float32 numbers therefore says the fixtures hold the documented function, and how far HF's
own float32 arithmetic is from exact.

    python tools/oracle/check_fixtures_float64.py tests/fixtures/qwen35 [--tolerance 5e-4]
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from w4a16_pack import dequantized_state_dict, w4a16_config

EPS = 1e-6


def load_checkpoint(directory: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Text config and float64 text weights keyed without the `model.`/`model.language_model.` prefix."""
    config = json.loads((directory / "config.json").read_text())
    tensors = {}
    for path in sorted(directory.glob("model*.safetensors")):
        tensors.update(load_file(path))
    quantization = config.get("quantization_config")
    if quantization is not None:
        group_size = quantization["config_groups"]["group_0"]["weights"]["group_size"]
        tensors = dequantized_state_dict(tensors, w4a16_config(group_size, []))
    prefix = "model.language_model." if "text_config" in config else "model."
    weights = {name.removeprefix(prefix): tensor.to(torch.float64).numpy() for name, tensor in tensors.items()
               if name.startswith(prefix) or name == "lm_head.weight"}
    return config.get("text_config", config), weights


def rms_norm(x, weight, zero_centred=True):
    normalized = x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
    return normalized * (1.0 + weight if zero_centred else weight)


def l2_normalize(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + EPS)


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def rotate(x, positions, rotary_dim, theta):
    """Partial NeoX RoPE on the first `rotary_dim` dims of x [T, heads, head_dim]; pairs (i, i + rotary_dim/2)."""
    inverse_frequency = 1.0 / theta ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = positions[:, None] * inverse_frequency[None]
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
    half = rotary_dim // 2
    first, second = x[..., :half], x[..., half:rotary_dim]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin, x[..., rotary_dim:]], -1)


def gated_attention(c, w, h):
    tokens, heads, kv_heads, head_dim = len(h), c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    query_gate = (h @ w["q_proj.weight"].T).reshape(tokens, heads, 2, head_dim)
    query, gate = query_gate[:, :, 0], query_gate[:, :, 1]
    key = (h @ w["k_proj.weight"].T).reshape(tokens, kv_heads, head_dim)
    value = (h @ w["v_proj.weight"].T).reshape(tokens, kv_heads, head_dim)
    rope = c["rope_parameters"]
    rotary_dim = int(head_dim * rope["partial_rotary_factor"])
    positions = np.arange(tokens, dtype=np.float64)
    query = rotate(rms_norm(query, w["q_norm.weight"]), positions, rotary_dim, rope["rope_theta"])
    key = rotate(rms_norm(key, w["k_norm.weight"]), positions, rotary_dim, rope["rope_theta"])
    causal = np.tril(np.ones((tokens, tokens), dtype=bool))
    out = np.empty((tokens, heads, head_dim))
    for head in range(heads):
        kv = head // (heads // kv_heads)
        scores = np.where(causal, query[:, head] @ key[:, kv].T / np.sqrt(head_dim), -np.inf)
        probabilities = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, head] = probabilities / probabilities.sum(-1, keepdims=True) @ value[:, kv]
    return (out * sigmoid(gate)).reshape(tokens, -1) @ w["o_proj.weight"].T


def gated_delta_net(c, w, h):
    tokens = len(h)
    key_heads, value_heads = c["linear_num_key_heads"], c["linear_num_value_heads"]
    key_dim, value_dim = c["linear_key_head_dim"], c["linear_value_head_dim"]
    mixed = h @ w["in_proj_qkv.weight"].T
    kernel = w["conv1d.weight"][:, 0]  # [channels, K]; tap K-1 is the current token
    padded = np.concatenate([np.zeros((kernel.shape[1] - 1, mixed.shape[1])), mixed])
    mixed = silu(sum(kernel[:, j] * padded[j:j + tokens] for j in range(kernel.shape[1])))
    split = key_heads * key_dim
    query = l2_normalize(mixed[:, :split].reshape(tokens, key_heads, key_dim)) / np.sqrt(key_dim)
    key = l2_normalize(mixed[:, split:2 * split].reshape(tokens, key_heads, key_dim))
    value = mixed[:, 2 * split:].reshape(tokens, value_heads, value_dim)
    beta = sigmoid(h @ w["in_proj_b.weight"].T)
    decay = np.exp(-np.exp(w["A_log"]) * softplus(h @ w["in_proj_a.weight"].T + w["dt_bias"]))
    state = np.zeros((value_heads, key_dim, value_dim))
    out = np.empty((tokens, value_heads, value_dim))
    for t in range(tokens):
        for head in range(value_heads):
            k, q = key[t, head // (value_heads // key_heads)], query[t, head // (value_heads // key_heads)]
            state[head] *= decay[t, head]
            state[head] += np.outer(k, (value[t, head] - state[head].T @ k) * beta[t, head])
            out[t, head] = state[head].T @ q
    z = (h @ w["in_proj_z.weight"].T).reshape(tokens, value_heads, value_dim)
    out = rms_norm(out, w["norm.weight"], zero_centred=False) * silu(z)
    return out.reshape(tokens, -1) @ w["out_proj.weight"].T


def forward(c, weights, ids):
    """Logits [T, V] and the residual stream after every layer."""
    x = weights["embed_tokens.weight"][ids]
    residuals = []
    for index, layer_type in enumerate(c["layer_types"]):
        prefix = f"layers.{index}."
        w = {name.removeprefix(prefix): value for name, value in weights.items() if name.startswith(prefix)}
        h = rms_norm(x, w["input_layernorm.weight"])
        if layer_type == "full_attention":
            x = x + gated_attention(c, {n.removeprefix("self_attn."): v for n, v in w.items()}, h)
        else:
            x = x + gated_delta_net(c, {n.removeprefix("linear_attn."): v for n, v in w.items()}, h)
        h = rms_norm(x, w["post_attention_layernorm.weight"])
        x = x + (silu(h @ w["mlp.gate_proj.weight"].T) * (h @ w["mlp.up_proj.weight"].T)) @ w["mlp.down_proj.weight"].T
        residuals.append(x)
    head = weights.get("lm_head.weight", weights["embed_tokens.weight"])
    return rms_norm(x, weights["norm.weight"]) @ head.T, residuals


def check(directory: Path) -> dict[str, float]:
    """Max |float64 − HF float32| over the prompt logits, the hidden states and the greedy logits."""
    config, weights = load_checkpoint(directory)
    oracle = {name: tensor.numpy() for name, tensor in load_file(directory / "oracle.safetensors").items()}
    meta = json.loads((directory / "oracle.json").read_text())
    logits_error = hidden_error = 0.0
    for length in meta["prompt_lengths"]:
        logits, residuals = forward(config, weights, oracle[f"p{length}.ids"])
        logits_error = max(logits_error, np.abs(logits - oracle[f"p{length}.logits"]).max())
        for layer in meta["hidden_layers"]:
            hidden_error = max(hidden_error, np.abs(residuals[layer] - oracle[f"p{length}.hidden.{layer}"]).max())
    prompt, tokens = oracle["greedy.prompt"], oracle["greedy.tokens"]
    logits, _ = forward(config, weights, np.concatenate([prompt, tokens[:-1]]))
    greedy_logits = logits[len(prompt) - 1:]
    if not np.array_equal(greedy_logits.argmax(-1), tokens):
        raise AssertionError(f"{directory.name}: float64 greedy tokens differ from HF's")
    return {"logits": logits_error, "hidden": hidden_error,
            "greedy_logits": np.abs(greedy_logits - oracle["greedy.decode_logits"]).max()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixtures", type=Path, help="e.g. tests/fixtures/qwen35")
    parser.add_argument("--tolerance", type=float, default=5e-4, help="max abs difference allowed")
    args = parser.parse_args()
    failed = False
    for directory in sorted(p for p in args.fixtures.iterdir() if (p / "oracle.safetensors").exists()):
        errors = check(directory)
        failed |= max(errors.values()) > args.tolerance
        print(f"{directory.name}: max |float64 - HF float32| " + ", ".join(f"{k} {v:.3g}" for k, v in errors.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
