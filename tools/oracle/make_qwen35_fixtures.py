#!/usr/bin/env python3
"""Makes the Qwen3.5 fixtures the C++ CPU reference is tested against (see README.md beside this file).

Each fixture is a small random Qwen3.5 checkpoint, written as a user would have it, plus what HF
transformers computes from it in float32: logits, chosen residual-stream states, greedy decoding.

    python tools/oracle/make_qwen35_fixtures.py --out tests/fixtures/qwen35 [--only NAME ...]
"""

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

from pure_torch_reference import require_pure_torch_kernels

require_pure_torch_kernels()

import compressed_tensors  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (  # noqa: E402
    CompressedTensorsConfig,
    GenerationConfig,
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5TextConfig,
)

from checkpoint_files import print_fixture_report, write_safetensors  # noqa: E402
from hf_oracle import (  # noqa: E402
    ATTENTION_IMPLEMENTATION,
    assert_holds,
    assert_weights_equal,
    decode_vs_full_forward,
    full_forward,
    greedy_decode,
)
from random_weights import fill_random, random_parameter  # noqa: E402
from w4a16_pack import compress, dequantized_state_dict, w4a16_config  # noqa: E402

SCRIPT = "tools/oracle/make_qwen35_fixtures.py"
PROMPT_LENGTHS = [1, 63, 64, 65, 200]  # around HF's GDN chunk of 64, and several chunks
GREEDY_PROMPT_LENGTH = 12
GREEDY_NEW_TOKENS = 32
# HF's own chunked (prefill) and recurrent (decode) GDN paths must agree this well in float32.
DECODE_CONSISTENCY_TOLERANCE = 1e-4
SMALL_MARGIN = 0.05

VOCAB = 256
LIN, FULL = "linear_attention", "full_attention"
# Special ids inside the small vocabulary, laid out like Qwen3.5's (eos <|endoftext|>, <|im_end|>, vision).
ENDOFTEXT_ID, IM_END_ID = VOCAB - 2, VOCAB - 1
VISION_IDS = {"vision_start_token_id": VOCAB - 6, "vision_end_token_id": VOCAB - 5,
              "image_token_id": VOCAB - 4, "video_token_id": VOCAB - 3}
TINY_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
               "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 16}
# What the real checkpoint keeps in F32 while everything else is BF16.
F32_GDN_PARAMETERS = ("linear_attn.A_log", "linear_attn.norm.weight")
IGNORED_BY_W4A16 = ["lm_head", "re:.*in_proj_[ab]$"]


def rope(head_dim: int, mrope_section: list[int]) -> dict:
    """Qwen3.5's rope parameters: partial (1/4 of head_dim), theta 1e7, interleaved mRoPE sections."""
    assert sum(mrope_section) * 2 == head_dim // 4
    return {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "mrope_section": mrope_section, "mrope_interleaved": True}


@dataclasses.dataclass(frozen=True)
class W4A16:
    group_size: int
    ignore: list[str]


@dataclasses.dataclass(frozen=True)
class Fixture:
    name: str
    seed: int
    text: dict  # Qwen3_5TextConfig fields beyond the common ones
    dtype: torch.dtype  # of the dense weights (and of the scales when quantized)
    tied: bool
    wrapper: bool = False  # Qwen3_5ForConditionalGeneration: nested text_config, a vision tower
    gdn_parameters_f32: bool = False
    shard_count: int = 1
    mtp: bool = False  # mtp.* tensors in the files (HF ignores them)
    quantization: W4A16 | None = None

    @property
    def model_class(self):
        return Qwen3_5ForConditionalGeneration if self.wrapper else Qwen3_5ForCausalLM

    @property
    def hidden_layers(self) -> list[int]:
        last = len(self.text["layer_types"]) - 1
        return sorted({0, (last + 1) // 2, last})

    def storage_dtype(self, name: str) -> torch.dtype:
        if self.gdn_parameters_f32 and name.endswith(F32_GDN_PARAMETERS):
            return torch.float32
        return self.dtype


FIXTURE_1_TEXT = {
    "hidden_size": 128, "intermediate_size": 256, "layer_types": [LIN, LIN, LIN, FULL],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "rope_parameters": rope(64, [3, 3, 2]),
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
}

FIXTURES = [
    Fixture("causal-tied-bf16", seed=1, text=FIXTURE_1_TEXT, dtype=torch.bfloat16, tied=True,
            gdn_parameters_f32=True),
    Fixture("cg-untied-f16-sharded", seed=2, dtype=torch.float16, tied=False, wrapper=True, shard_count=2, mtp=True,
            text={"hidden_size": 64, "intermediate_size": 192, "layer_types": [FULL, LIN, LIN, FULL, LIN, FULL],
                  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
                  "rope_parameters": rope(32, [2, 1, 1]),
                  # Key and value head dims differ and each key head serves two value heads.
                  "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                  "linear_key_head_dim": 16, "linear_value_head_dim": 32,
                  "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False}),
    Fixture("causal-w4a16-g32", seed=3, text=FIXTURE_1_TEXT, dtype=torch.bfloat16, tied=False,
            gdn_parameters_f32=True, quantization=W4A16(32, IGNORED_BY_W4A16)),
    Fixture("cg-w4a16-g128", seed=4, dtype=torch.float16, tied=True, wrapper=True, gdn_parameters_f32=True,
            quantization=W4A16(128, IGNORED_BY_W4A16 + ["re:model[.]visual.*"]),
            # Every K (hidden, intermediate, GDN value dim, heads * head_dim) is a multiple of 128.
            text={"hidden_size": 256, "intermediate_size": 384, "layer_types": [LIN, FULL, LIN, LIN],
                  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
                  "rope_parameters": rope(64, [3, 3, 2]),
                  "linear_num_key_heads": 1, "linear_num_value_heads": 4,
                  "linear_key_head_dim": 32, "linear_value_head_dim": 32}),
    Fixture("causal-f32-tiny", seed=5, dtype=torch.float32, tied=True,
            text={"hidden_size": 32, "intermediate_size": 64, "layer_types": [LIN, FULL],
                  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                  "rope_parameters": rope(32, [2, 1, 1]),
                  "linear_num_key_heads": 1, "linear_num_value_heads": 2,
                  "linear_key_head_dim": 16, "linear_value_head_dim": 16}),
]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def model_config(fixture: Fixture):
    """The HF config as the checkpoint's config.json states it (without any quantization_config)."""
    text = Qwen3_5TextConfig(
        vocab_size=VOCAB, num_hidden_layers=len(fixture.text["layer_types"]), linear_conv_kernel_dim=4,
        max_position_embeddings=4096, rms_norm_eps=1e-6, eos_token_id=ENDOFTEXT_ID, tie_word_embeddings=fixture.tied,
        dtype=dtype_name(fixture.dtype), **fixture.text)
    if not fixture.wrapper:
        text.architectures = [Qwen3_5ForCausalLM.__name__]
        return text
    vision = dict(TINY_VISION, out_hidden_size=text.hidden_size)
    return Qwen3_5Config(text_config=text.to_dict(), vision_config=vision, tie_word_embeddings=fixture.tied,
                         architectures=[Qwen3_5ForConditionalGeneration.__name__], dtype=dtype_name(fixture.dtype),
                         **VISION_IDS)


def mtp_tensors(text: Qwen3_5TextConfig, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A multi-token-prediction block under the real checkpoint's names and shapes (HF has no module for it)."""
    hidden, head = text.hidden_size, text.head_dim
    query_heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
    shapes = {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
        "mtp.norm.weight": (hidden,),
        "mtp.layers.0.input_layernorm.weight": (hidden,),
        "mtp.layers.0.post_attention_layernorm.weight": (hidden,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * query_heads * head, hidden),
        "mtp.layers.0.self_attn.k_proj.weight": (kv_heads * head, hidden),
        "mtp.layers.0.self_attn.v_proj.weight": (kv_heads * head, hidden),
        "mtp.layers.0.self_attn.o_proj.weight": (hidden, query_heads * head),
        "mtp.layers.0.self_attn.q_norm.weight": (head,),
        "mtp.layers.0.self_attn.k_norm.weight": (head,),
        "mtp.layers.0.mlp.gate_proj.weight": (text.intermediate_size, hidden),
        "mtp.layers.0.mlp.up_proj.weight": (text.intermediate_size, hidden),
        "mtp.layers.0.mlp.down_proj.weight": (hidden, text.intermediate_size),
    }
    return {name: random_parameter(name, torch.Size(shape), generator, tied=False) for name, shape in shapes.items()}


def write_checkpoint(fixture: Fixture, directory: Path):
    """Writes config.json (+ generation_config.json) and the safetensors files.

    Returns the stored tensors and, for a quantized fixture, its QuantizationConfig.
    """
    config = model_config(fixture)
    # Built in float32 whatever config.dtype says, so the F32-stored parameters keep all their bits
    # (from its own config object: `_from_config` rewrites the dtype of the one it gets).
    model = fixture.model_class._from_config(model_config(fixture), dtype=torch.float32)
    fill_random(model, fixture.seed, fixture.tied)
    exact = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    quantization_config = compressor = None
    if fixture.quantization is not None:
        quantization_config = w4a16_config(fixture.quantization.group_size, fixture.quantization.ignore)
        model.to(fixture.dtype)
        compressor = compress(model, quantization_config)
    # The quantized state dict keeps the order of the modules; dense tensors come from the exact values.
    stored = {name: exact[name].to(fixture.storage_dtype(name)) if name in exact else tensor
              for name, tensor in model.state_dict().items()}
    if fixture.tied:
        del stored["lm_head.weight"]
    if fixture.mtp:
        generator = torch.Generator().manual_seed(fixture.seed + 1000)
        stored.update({name: tensor.to(fixture.dtype)
                       for name, tensor in mtp_tensors(getattr(config, "text_config", config), generator).items()})

    config.save_pretrained(directory)
    if compressor is not None:
        compressor.update_config(directory)
    if fixture.wrapper:
        GenerationConfig(bos_token_id=ENDOFTEXT_ID, eos_token_id=[IM_END_ID, ENDOFTEXT_ID],
                         pad_token_id=ENDOFTEXT_ID).save_pretrained(directory)
    files = write_safetensors(directory, stored, fixture.shard_count)
    print(f"  wrote {', '.join(files)}: {len(stored)} tensors")
    return stored, quantization_config


def reference_model(fixture: Fixture, directory: Path, stored: dict, quantization_config):
    """The HF model in float32 on exactly the stored weights, checked parameter by parameter."""
    if quantization_config is None:
        # HF's own loading, as a user would load the checkpoint.
        model = fixture.model_class.from_pretrained(directory, dtype=torch.float32,
                                                    attn_implementation=ATTENTION_IMPLEMENTATION)
        expected = {name: tensor.to(torch.float32) for name, tensor in stored.items()
                    if not name.startswith("mtp.")}
    else:
        model = fixture.model_class._from_config(model_config(fixture), dtype=torch.float32,
                                                 attn_implementation=ATTENTION_IMPLEMENTATION)
        expected = dequantized_state_dict(stored, quantization_config)
        model.load_state_dict(expected, strict=not fixture.tied)
        # HF's own compressed-tensors loader must read the packed format as w4a16_pack.dequantize does.
        hf_dequantized = fixture.model_class.from_pretrained(
            directory, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))
        assert_holds(hf_dequantized, expected)
        print("  HF's compressed-tensors loader (dequantize=True) gives the same fp32 weights")
    assert_weights_equal(model, expected, fixture.tied)
    return model.eval()


def make_oracle(fixture: Fixture, model) -> tuple[dict, dict]:
    """The oracle tensors, and the measurements reported in oracle.json."""
    rng = np.random.default_rng(fixture.seed)
    tensors, hidden_rms = {}, []
    for length in PROMPT_LENGTHS:
        ids = torch.from_numpy(rng.integers(0, VOCAB, size=length)).to(torch.int32)
        logits, hidden = full_forward(model, ids.long(), fixture.hidden_layers)
        tensors[f"p{length}.ids"] = ids
        tensors[f"p{length}.logits"] = logits.float()
        for layer in fixture.hidden_layers:
            tensors[f"p{length}.hidden.{layer}"] = hidden[layer].float()
            hidden_rms.append(hidden[layer].pow(2).mean(-1).sqrt())
    prompt = torch.from_numpy(rng.integers(0, VOCAB, size=GREEDY_PROMPT_LENGTH)).to(torch.int32)
    tokens, step_logits, margins = greedy_decode(model, prompt.long(), GREEDY_NEW_TOKENS)
    step_differences = decode_vs_full_forward(model, prompt.long(), tokens, step_logits)
    tensors.update({"greedy.prompt": prompt, "greedy.tokens": tokens, "greedy.margins": margins.float(),
                    "greedy.decode_logits": step_logits.float()})

    if step_differences.max() > DECODE_CONSISTENCY_TOLERANCE:
        raise AssertionError(f"HF's cached decode differs from its full forward by {step_differences.max():.3g}")
    hidden_rms = torch.cat(hidden_rms)
    prompt_logits = torch.cat([tensors[f"p{length}.logits"] for length in PROMPT_LENGTHS])
    measured = {
        "first_decode_step_vs_full_forward_max_abs": float(step_differences[1]),
        "all_decode_steps_vs_full_forward_max_abs": float(step_differences.max()),
        "greedy_margin_min": float(margins.min()),
        "greedy_margin_max": float(margins.max()),
        "greedy_margins_below_0.05": int((margins < SMALL_MARGIN).sum()),
        "greedy_distinct_tokens": len(set(tokens.tolist())),
        "hidden_row_rms_min": float(hidden_rms.min()),
        "hidden_row_rms_max": float(hidden_rms.max()),
        "prompt_logits_abs_max": float(prompt_logits.abs().max()),
        "prompt_logits_std": float(prompt_logits.std()),
    }
    return tensors, measured


def describe(fixture: Fixture) -> str:
    parts = [f"random weights (seed {fixture.seed}) stored as {dtype_name(fixture.dtype)}"]
    if fixture.gdn_parameters_f32:
        parts.append("linear_attn.A_log and linear_attn.norm.weight stored F32 as in the real checkpoint")
    if fixture.quantization is not None:
        parts.append(f"Linear layers W4A16 pack-quantized by compressed-tensors {compressed_tensors.__version__} "
                     f"(symmetric, group {fixture.quantization.group_size}, min-max scales, round to nearest); "
                     "HF ran on the fp32 dequantization (nibble - 8) * scale")
    else:
        parts.append("HF loaded the checkpoint with from_pretrained(dtype=float32)")
    parts.append("embeddings tied" if fixture.tied else "untied lm_head.weight")
    if fixture.wrapper:
        parts.append("model.visual.* present" + (" and mtp.* present" if fixture.mtp else "") + ", unused by text")
    parts.append(f"pure-torch GDN/conv paths, {ATTENTION_IMPLEMENTATION} attention; prompt ids uniform in [0, {VOCAB}); "
                 "greedy.decode_logits row 0 is the prefill's last row, rows 1.. come from single-token "
                 "cached decode steps (recurrent GDN); greedy ignores EOS")
    return "; ".join(parts)


def make_fixture(fixture: Fixture, out: Path) -> dict:
    directory = out / fixture.name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    torch.manual_seed(fixture.seed)
    stored, quantization_config = write_checkpoint(fixture, directory)
    model = reference_model(fixture, directory, stored, quantization_config)
    print(f"  {type(model).__name__} in float32 holds exactly the stored (dequantized) weights")
    tensors, measured = make_oracle(fixture, model)
    save_file(tensors, directory / "oracle.safetensors", metadata={"format": "pt"})
    record = {
        "script": SCRIPT,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "model_class": type(model).__name__,
        "hidden_layers": fixture.hidden_layers,
        "prompt_lengths": PROMPT_LENGTHS,
        "greedy_new_tokens": GREEDY_NEW_TOKENS,
        "attn_implementation": ATTENTION_IMPLEMENTATION,
        "measured": measured,
        "notes": describe(fixture),
    }
    if fixture.quantization is not None:
        record["compressed_tensors"] = compressed_tensors.__version__
    (directory / "oracle.json").write_text(json.dumps(record, indent=2) + "\n")
    return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="e.g. tests/fixtures/qwen35")
    parser.add_argument("--only", nargs="*", choices=[f.name for f in FIXTURES], help="make only these")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one reduction order, so reruns give the same bits
    for fixture in FIXTURES:
        if args.only and fixture.name not in args.only:
            continue
        print(f"{fixture.name}:")
        print_fixture_report(args.out / fixture.name, make_fixture(fixture, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
