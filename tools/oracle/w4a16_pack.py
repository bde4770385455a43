"""W4A16 pack-quantization done by the compressed-tensors package itself, and its exact dequantization.

The checkpoint's bit layout must be the package's (what llm-compressor writes), so the quantization
goes through the package's own lifecycle: apply a QuantizationConfig to the model, set min-max
scales with the package's `calculate_qparams`, compress with `ModelCompressor`. The oracle then
dequantizes the stored ints in fp32 by the documented formula, (nibble - 8) * scale, and checks that
against the package's own decompressor.
"""

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.utils import calculate_qparams

PACKED_SUFFIXES = (".weight_packed", ".weight_scale", ".weight_shape")
NIBBLES_PER_WORD = 8
NIBBLE_OFFSET = 8


def w4a16_config(group_size: int, ignore: list[str]) -> QuantizationConfig:
    """Symmetric INT4 weights in groups along K, activations unquantized (the W4A16 preset's shape)."""
    weights = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size)
    return QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
        ignore=ignore,
        format="pack-quantized",
    )


@torch.no_grad()
def compress(model: torch.nn.Module, config: QuantizationConfig) -> ModelCompressor:
    """Quantizes and packs the targeted Linear layers of `model` in place (round-to-nearest, min-max scales).

    The model must already be in the checkpoint dtype: the scales take the dtype of the weights.
    Returns the compressor, whose `update_config` writes the `quantization_config` of config.json.
    """
    apply_quantization_config(model, config)
    for module in model.modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None:
            continue
        weight = module.weight
        groups = weight.reshape(weight.shape[0], -1, scheme.weights.group_size)
        scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
        module.weight_scale.copy_(scale)
        module.weight_zero_point.copy_(zero_point)
    compressor = ModelCompressor(quantization_config=config)
    compressor.compress_model(model)
    return compressor


def dequantize(packed: torch.Tensor, scale: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    """fp32 weight [N, K] from packed int32 [N, K/8] (nibble j of word w = column 8w + j, LSB first)."""
    rows, columns = (int(v) for v in shape)
    shifts = torch.arange(NIBBLES_PER_WORD, dtype=torch.int32) * 4
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF
    values = (nibbles.reshape(rows, -1)[:, :columns] - NIBBLE_OFFSET).to(torch.float32)
    group_size = columns // scale.shape[1]
    return values * scale.to(torch.float32).repeat_interleave(group_size, dim=1)


def dequantized_state_dict(stored: dict[str, torch.Tensor], config: QuantizationConfig) -> dict[str, torch.Tensor]:
    """The stored tensors with every packed Linear replaced by its fp32 `weight`, all upcast to fp32.

    Each dequantized weight is checked against the package's own decompressor (which rounds the same
    exact product to the scale dtype).
    """
    scheme = config.config_groups["group_0"]
    result = {}
    for name, tensor in stored.items():
        if name.endswith(".weight_packed"):
            prefix = name.removesuffix(".weight_packed")
            packed = {suffix.lstrip("."): stored[prefix + suffix] for suffix in PACKED_SUFFIXES}
            weight = dequantize(packed["weight_packed"], packed["weight_scale"], packed["weight_shape"])
            reference = PackedQuantizationCompressor.decompress(packed, scheme)["weight"]
            if not torch.equal(weight.to(reference.dtype), reference):
                raise AssertionError(f"{prefix}: fp32 dequantization disagrees with compressed-tensors")
            result[prefix + ".weight"] = weight
        elif not name.endswith(PACKED_SUFFIXES):
            result[name] = tensor.to(torch.float32)
    return result
