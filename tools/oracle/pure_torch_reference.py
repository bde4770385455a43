"""Pins HF transformers to its pure-torch Qwen3.5 kernels before transformers is imported.

transformers resolves the gated-delta-rule and causal-conv1d functions at import time: if `fla`
(flash-linear-attention) or `causal_conv1d` is importable it silently swaps in their kernels, and
`kernels` enables hub kernels. Those differ from the torch reference in low-order bits, so an oracle
made with them would not be the function the C++ CPU reference is written against.
"""

import importlib.util

ACCELERATED_PACKAGES = ("fla", "causal_conv1d", "kernels")


def require_pure_torch_kernels() -> None:
    """Raises if any package that would replace HF's torch kernels is importable."""
    present = [name for name in ACCELERATED_PACKAGES if importlib.util.find_spec(name) is not None]
    if present:
        raise RuntimeError(
            f"{', '.join(present)} importable: HF would use accelerated kernels instead of its torch "
            "reference path; run the oracle in an environment without them"
        )
