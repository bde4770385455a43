"""Writes a state dict as the safetensors files of a HF checkpoint: one file, or shards plus an index; and
prints what a fixture generator measured."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

# What `save_pretrained` puts in the header; some loaders insist on it.
SAFETENSORS_METADATA = {"format": "pt"}


def _tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _split_in_order(tensors: dict[str, torch.Tensor], shard_count: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive runs of tensors of about equal byte size, in state-dict order (as HF shards)."""
    total = sum(_tensor_bytes(t) for t in tensors.values())
    shards: list[dict[str, torch.Tensor]] = [{}]
    filled = 0
    for name, tensor in tensors.items():
        boundary = total * len(shards) / shard_count
        if filled >= boundary and len(shards) < shard_count:
            shards.append({})
        shards[-1][name] = tensor
        filled += _tensor_bytes(tensor)
    if len(shards) != shard_count:
        raise ValueError(f"{len(tensors)} tensors cannot fill {shard_count} shards")
    return shards


def write_safetensors(directory: Path, tensors: dict[str, torch.Tensor], shard_count: int) -> list[str]:
    """Writes `model.safetensors`, or `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`.

    Returns the names of the files written.
    """
    tensors = {name: tensor.contiguous() for name, tensor in tensors.items()}
    if shard_count == 1:
        save_file(tensors, directory / "model.safetensors", metadata=SAFETENSORS_METADATA)
        return ["model.safetensors"]
    weight_map = {}
    written = []
    for index, shard in enumerate(_split_in_order(tensors, shard_count), start=1):
        file_name = f"model-{index:05d}-of-{shard_count:05d}.safetensors"
        save_file(shard, directory / file_name, metadata=SAFETENSORS_METADATA)
        weight_map.update({name: file_name for name in shard})
        written.append(file_name)
    index_document = {
        "metadata": {"total_size": sum(_tensor_bytes(t) for t in tensors.values())},
        "weight_map": dict(sorted(weight_map.items())),
    }
    index_path = directory / "model.safetensors.index.json"
    index_path.write_text(json.dumps(index_document, indent=2) + "\n")
    written.append(index_path.name)
    return written


def print_fixture_report(directory: Path, measured: dict) -> None:
    """The measurements of the fixture just made (oracle checks, margins) and the bytes it takes on disk."""
    for key, value in measured.items():
        print(f"  {key}: {value:.3g}" if isinstance(value, float) else f"  {key}: {value}")
    size = sum(p.stat().st_size for p in directory.iterdir())
    print(f"  {size / 1e6:.2f} MB")
