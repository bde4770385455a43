"""Random Qwen3.5 weights scaled so a small model behaves like a trained one numerically.

Goals: the residual stream stays O(1) through every layer, logits are peaky (a clear greedy winner
at most steps), and no nonlinearity saturates (sigmoid, softplus, exp of the GDN decay). Every
parameter gets a value from here, so the HF module initialisers play no part.
"""

import math

import torch

EMBEDDING_STD = 0.5
# Logit spread (std over the vocabulary) whatever the hidden size: peaky, yet not one-hot.
LOGIT_STD = 3.0
IN_PROJECTION_GAIN = 1.0
# Not damped: when the residual stream is mostly the token's own embedding, a tied head makes greedy
# repeat that token; layers that outweigh the embedding give varied greedy text (residual rms stays <= ~4).
OUT_PROJECTION_GAIN = 1.5
GDN_DECAY_INPUT_GAIN = 0.5
CONV_STD = 0.5
NORM_DELTA_STD = 0.1

OUT_PROJECTIONS = ("o_proj", "out_proj", "down_proj")


def _normal(shape, std, generator):
    return torch.randn(shape, generator=generator, dtype=torch.float32) * std


def _uniform(shape, low, high, generator):
    return low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float32)


def random_parameter(name: str, shape: torch.Size, generator: torch.Generator, tied: bool) -> torch.Tensor:
    """The value of one parameter, chosen by what the name says it is."""
    leaf = name.rsplit(".", 2)
    module, kind = leaf[-2], leaf[-1]
    head_std = LOGIT_STD / math.sqrt(shape[-1])
    if name.endswith("embed_tokens.weight"):
        # A tied table is also the LM head, so it takes the head's scale.
        return _normal(shape, head_std if tied else EMBEDDING_STD, generator)
    if name == "lm_head.weight":
        return _normal(shape, head_std, generator)
    if kind == "A_log":
        # A = exp(A_log) in [0.05, 2]: a mix of long-memory and fast-forgetting heads, as trained.
        return torch.log(_uniform(shape, 0.05, 2.0, generator))
    if kind == "dt_bias":
        return _normal(shape, 0.5, generator) - 1.0
    if module == "conv1d":
        return _normal(shape, CONV_STD, generator)
    if name.endswith("linear_attn.norm.weight"):
        # The gated GDN norm multiplies by w itself (not 1 + w), so it lives around 1.
        return 1.0 + _normal(shape, NORM_DELTA_STD, generator)
    if len(shape) == 1:
        # Zero-centred RMSNorm weights (used as 1 + w) and vision biases / LayerNorm parameters.
        return _normal(shape, NORM_DELTA_STD, generator)
    fan_in = math.prod(shape[1:])
    if module in OUT_PROJECTIONS:
        gain = OUT_PROJECTION_GAIN
    elif module == "in_proj_a":
        gain = GDN_DECAY_INPUT_GAIN
    else:
        gain = IN_PROJECTION_GAIN
    return _normal(shape, gain / math.sqrt(fan_in), generator)


@torch.no_grad()
def fill_random(model: torch.nn.Module, seed: int, tied: bool) -> None:
    """Overwrites every parameter of `model` in place, deterministically in `seed`."""
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in model.named_parameters():
        parameter.copy_(random_parameter(name, parameter.shape, generator, tied))
