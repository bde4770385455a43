#!/usr/bin/env python3
"""Makes the DFlash drafter fixtures the C++ drafter and speculative loop are tested against.

Each fixture is a small random DFlash drafter (config.json + model.safetensors, the layout SpecForge saves:
no "model." prefix, no embedding or head) for one of the Qwen3.5 fixture targets in tests/fixtures/qwen35,
plus a greedy speculative run computed in float32 with PyTorch: the published DFlash math written out
(docs: /work/shared/reference/dflash-system.md §1.3 forward, §1.4 decode loop; the same math as
z-lab/dflash model.py and SpecForge's DFlashDraftModel), with the target run by HF transformers' own
Qwen3.5 code. Every step records the drafts, their logits and top1 - top2 margins, the target's greedy
tokens and the accepted count.

    python tools/oracle/make_dflash_fixtures.py --targets tests/fixtures/qwen35 --out tests/fixtures/dflash
"""

import argparse
import dataclasses
import json
import math
import shutil
import sys
from pathlib import Path

from pure_torch_reference import require_pure_torch_kernels

require_pure_torch_kernels()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from checkpoint_files import print_fixture_report, write_safetensors  # noqa: E402
from hf_oracle import ATTENTION_IMPLEMENTATION, full_forward, text_model  # noqa: E402

SCRIPT = "tools/oracle/make_dflash_fixtures.py"
BLOCK_SIZE = 16
PROMPT_LENGTH = 20
NEW_TOKENS = 48
RMS_NORM_EPS = 1e-6
ROPE_THETA = 10000000.0
NORM_DELTA_STD = 0.1
# The drafter's Linear layers keep activations O(1); its logits come from the target's head.
LINEAR_GAIN = 1.0


@dataclasses.dataclass(frozen=True)
class Fixture:
    name: str
    target: str  # directory name under --targets
    seed: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    target_layer_ids: list[int]
    mask_token_id: int
    window: int  # drafter sliding window of the recorded run (0 = off)
    dtype: torch.dtype


FIXTURES = [
    Fixture("tied-bf16-drafter", target="causal-tied-bf16", seed=11, layers=2, heads=4, kv_heads=2, head_dim=32,
            intermediate=256, target_layer_ids=[0, 2], mask_token_id=253, window=0, dtype=torch.bfloat16),
    # A window (12) smaller than the prompt (20) + block (16): every query sees a clipped range of keys.
    Fixture("f32-tiny-windowed-drafter", target="causal-f32-tiny", seed=12, layers=1, heads=2, kv_heads=1,
            head_dim=16, intermediate=64, target_layer_ids=[0, 1], mask_token_id=250, window=12,
            dtype=torch.float32),
]


def drafter_config(fixture: Fixture, target_config) -> dict:
    """config.json as SpecForge writes it for a DFlashDraftModel (dflash-system.md §1.1)."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": BLOCK_SIZE,
        "dflash_config": {"mask_token_id": fixture.mask_token_id, "target_layer_ids": fixture.target_layer_ids},
        "num_hidden_layers": fixture.layers,
        "num_target_layers": target_config.num_hidden_layers,
        "hidden_size": target_config.hidden_size,
        "intermediate_size": fixture.intermediate,
        "hidden_act": "silu",
        "num_attention_heads": fixture.heads,
        "num_key_value_heads": fixture.kv_heads,
        "head_dim": fixture.head_dim,
        "attention_bias": False,
        "layer_types": ["full_attention"] * fixture.layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "rms_norm_eps": RMS_NORM_EPS,
        "tie_word_embeddings": True,
        "vocab_size": target_config.vocab_size,
        "dtype": str(fixture.dtype).removeprefix("torch."),
    }


def random_drafter(fixture: Fixture, hidden: int) -> dict[str, torch.Tensor]:
    """Random weights under the checkpoint's names, rounded to the storage dtype (returned in that dtype)."""
    generator = torch.Generator().manual_seed(fixture.seed)
    q_dim, kv_dim = fixture.heads * fixture.head_dim, fixture.kv_heads * fixture.head_dim
    shapes = {"fc.weight": (hidden, len(fixture.target_layer_ids) * hidden), "hidden_norm.weight": (hidden,)}
    for i in range(fixture.layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (q_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, q_dim),
            p + "self_attn.q_norm.weight": (fixture.head_dim,),
            p + "self_attn.k_norm.weight": (fixture.head_dim,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "mlp.gate_proj.weight": (fixture.intermediate, hidden),
            p + "mlp.up_proj.weight": (fixture.intermediate, hidden),
            p + "mlp.down_proj.weight": (hidden, fixture.intermediate),
        })
    shapes["norm.weight"] = (hidden,)
    weights = {}
    for name, shape in shapes.items():
        if len(shape) == 1:  # Qwen3 RMSNorm multiplies by w itself: weights around 1
            value = 1.0 + torch.randn(shape, generator=generator) * NORM_DELTA_STD
        else:
            value = torch.randn(shape, generator=generator) * (LINEAR_GAIN / math.sqrt(shape[1]))
        weights[name] = value.to(fixture.dtype)
    return weights


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Qwen3RMSNorm: w * x * rsqrt(mean(x^2) + eps), plain w."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_NORM_EPS))


def rope(x: torch.Tensor, positions: torch.Tensor, head_dim: int) -> torch.Tensor:
    """NeoX (rotate-half) RoPE over the whole head; x [T, heads, head_dim]."""
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    half = head_dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Drafter:
    """The DFlash draft forward of dflash-system.md §1.3 in float32."""

    def __init__(self, fixture: Fixture, weights: dict[str, torch.Tensor], embed: torch.Tensor, head: torch.Tensor):
        self.f = fixture
        self.w = {name: tensor.float() for name, tensor in weights.items()}
        self.embed, self.head = embed, head

    def attention_ranges(self, start: int, keys: int) -> list[tuple[int, int]]:
        """Keys each block query sees: all, or those within window - 1 positions when context + block > window."""
        window = self.f.window
        ranges = []
        for j in range(BLOCK_SIZE):
            p = start + j
            if window > 0 and keys > window:
                ranges.append((max(0, p - (window - 1)), min(keys, p + window)))
            else:
                ranges.append((0, keys))
        return ranges

    @torch.inference_mode()
    def logits(self, features: torch.Tensor, bonus: int) -> torch.Tensor:
        """features [start, n_ids * H] of the tokens the target consumed; returns slots 1..B-1 logits."""
        f, w = self.f, self.w
        start = features.shape[0]
        context = rms_norm(features @ w["fc.weight"].T, w["hidden_norm.weight"])
        block_ids = torch.tensor([bonus] + [f.mask_token_id] * (BLOCK_SIZE - 1))
        block_positions = torch.arange(start, start + BLOCK_SIZE)
        context_positions = torch.arange(start)
        ranges = self.attention_ranges(start, start + BLOCK_SIZE)
        h = self.embed[block_ids]
        group = f.heads // f.kv_heads
        for i in range(f.layers):
            p = f"layers.{i}."
            x = rms_norm(h, w[p + "input_layernorm.weight"])
            q = (x @ w[p + "self_attn.q_proj.weight"].T).view(BLOCK_SIZE, f.heads, f.head_dim)
            k_block = (x @ w[p + "self_attn.k_proj.weight"].T).view(BLOCK_SIZE, f.kv_heads, f.head_dim)
            v_block = (x @ w[p + "self_attn.v_proj.weight"].T).view(BLOCK_SIZE, f.kv_heads, f.head_dim)
            k_context = (context @ w[p + "self_attn.k_proj.weight"].T).view(start, f.kv_heads, f.head_dim)
            v_context = (context @ w[p + "self_attn.v_proj.weight"].T).view(start, f.kv_heads, f.head_dim)
            q = rope(rms_norm(q, w[p + "self_attn.q_norm.weight"]), block_positions, f.head_dim)
            k_block = rope(rms_norm(k_block, w[p + "self_attn.k_norm.weight"]), block_positions, f.head_dim)
            k_context = rope(rms_norm(k_context, w[p + "self_attn.k_norm.weight"]), context_positions, f.head_dim)
            keys = torch.cat([k_context, k_block]).repeat_interleave(group, dim=1)  # [K, heads, hd]
            values = torch.cat([v_context, v_block]).repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(f.head_dim)
            mask = torch.full((BLOCK_SIZE, keys.shape[0]), float("-inf"))
            for j, (first, end) in enumerate(ranges):
                mask[j, first:end] = 0.0
            attention = torch.softmax(scores + mask, dim=-1)
            out = torch.einsum("hqk,khd->qhd", attention, values).reshape(BLOCK_SIZE, f.heads * f.head_dim)
            h = h + out @ w[p + "self_attn.o_proj.weight"].T
            x = rms_norm(h, w[p + "post_attention_layernorm.weight"])
            gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
            h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        return rms_norm(h[1:], w["norm.weight"]) @ self.head.T


def target_rows(model, ids: list[int], layer_ids: list[int]):
    """Logits [T, V] and the concatenated residual stream after each layer in layer_ids [T, n * H] of one
    cache-free HF forward (the target's layer l output is hidden_states[l + 1] of dflash-system.md §1.3)."""
    logits, captured = full_forward(model, torch.tensor(ids), layer_ids)
    return logits, torch.cat([captured[index] for index in layer_ids], dim=-1)


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    top2 = torch.topk(logits, 2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def speculative_greedy(model, drafter: Drafter, prompt: list[int], new_tokens: int):
    """The greedy decode loop of dflash-system.md §1.4, the target recomputed from scratch every step
    (the HF Qwen3.5 cache cannot be rolled back). Returns per-step records and the generated tokens."""
    layer_ids = drafter.f.target_layer_ids
    logits, features = target_rows(model, prompt, layer_ids)
    sequence = list(prompt)
    bonus = int(torch.argmax(logits[-1]))
    generated = [bonus]
    steps = []
    while len(generated) < new_tokens:
        start = len(sequence)
        draft_logits = drafter.logits(features[:start], bonus)
        drafts = torch.argmax(draft_logits, dim=-1).tolist()
        rows, _ = target_rows(model, sequence + [bonus] + drafts, layer_ids)
        verify = rows[start:]
        posterior = torch.argmax(verify, dim=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == posterior[accepted]:
            accepted += 1
        steps.append({"start": start, "bonus": bonus, "drafts": drafts, "draft_logits": draft_logits,
                      "draft_margins": top2_margin(draft_logits), "verify_margins": top2_margin(verify),
                      "accepted": accepted})
        sequence += [bonus] + drafts[:accepted]
        bonus = posterior[accepted]
        generated += drafts[:accepted] + [bonus]
        _, features = target_rows(model, sequence, layer_ids)
    return steps, generated[:new_tokens]


@torch.inference_mode()
def plain_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    sequence = list(prompt)
    for _ in range(new_tokens):
        sequence.append(int(torch.argmax(model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0, -1])))
    return sequence[len(prompt):]


def make_fixture(fixture: Fixture, targets: Path, out: Path) -> dict:
    target_dir = targets / fixture.target
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32,
                                                 attn_implementation=ATTENTION_IMPLEMENTATION).eval()
    config = model.config
    directory = out / fixture.name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    weights = random_drafter(fixture, config.hidden_size)
    (directory / "config.json").write_text(json.dumps(drafter_config(fixture, config), indent=2) + "\n")
    write_safetensors(directory, weights, 1)

    embed = text_model(model).embed_tokens.weight.float()
    drafter = Drafter(fixture, weights, embed, model.lm_head.weight.float())
    rng = np.random.default_rng(fixture.seed)
    prompt = rng.integers(0, config.vocab_size, size=PROMPT_LENGTH).tolist()
    steps, generated = speculative_greedy(model, drafter, prompt, NEW_TOKENS)
    plain = plain_greedy(model, prompt, NEW_TOKENS)
    if generated != plain:
        raise AssertionError("the oracle's speculative greedy output differs from its plain greedy output")

    tensors = {"prompt": torch.tensor(prompt, dtype=torch.int32),
               "tokens": torch.tensor(generated, dtype=torch.int32),
               "accepted": torch.tensor([s["accepted"] for s in steps], dtype=torch.int32),
               "starts": torch.tensor([s["start"] for s in steps], dtype=torch.int32),
               "drafts": torch.tensor([s["drafts"] for s in steps], dtype=torch.int32),
               "draft_margins": torch.stack([s["draft_margins"] for s in steps]).float(),
               "draft_logits": torch.stack([s["draft_logits"] for s in steps]).float()}
    save_file(tensors, directory / "oracle.safetensors", metadata={"format": "pt"})
    all_margins = tensors["draft_margins"]
    measured = {
        "steps": len(steps),
        "accepted_total": int(tensors["accepted"].sum()),
        "accepted_max": int(tensors["accepted"].max()),
        "draft_margin_min": float(all_margins.min()),
        "draft_margins_below_0.01": int((all_margins < 0.01).sum()),
        "draft_logits_abs_max": float(tensors["draft_logits"].abs().max()),
        "distinct_drafts": len(set(tensors["drafts"].flatten().tolist())),
    }
    record = {
        "script": SCRIPT,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "target": f"tests/fixtures/qwen35/{fixture.target}",
        "block_size": BLOCK_SIZE,
        "draft_window": fixture.window,
        "new_tokens": NEW_TOKENS,
        "measured": measured,
        "notes": (f"random drafter (seed {fixture.seed}) stored as {str(fixture.dtype).removeprefix('torch.')}; "
                  "drafts by the DFlash math of dflash-system.md §1.3 in float32 PyTorch on the stored weights, "
                  "target by HF transformers (float32, eager attention, pure-torch GDN) recomputed from scratch "
                  "every step; greedy ignores EOS; speculative output checked equal to plain greedy"),
    }
    (directory / "oracle.json").write_text(json.dumps(record, indent=2) + "\n")
    return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=Path, required=True, help="e.g. tests/fixtures/qwen35")
    parser.add_argument("--out", type=Path, required=True, help="e.g. tests/fixtures/dflash")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one reduction order, so reruns give the same bits
    for fixture in FIXTURES:
        print(f"{fixture.name}:")
        print_fixture_report(args.out / fixture.name, make_fixture(fixture, args.targets, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
