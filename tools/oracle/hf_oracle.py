"""Runs a HF transformers Qwen3.5 model in float32 and records what the C++ reference is tested against."""

import torch

ATTENTION_IMPLEMENTATION = "eager"


def text_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Qwen3_5TextModel inside a ForCausalLM (`model`) or a ForConditionalGeneration (`model.language_model`)."""
    return getattr(model.model, "language_model", model.model)


def assert_weights_equal(model: torch.nn.Module, expected: dict[str, torch.Tensor], tied: bool) -> None:
    """Every parameter HF holds equals the fp32 value it should have loaded (catches silent re-init or casts)."""
    loaded = dict(model.named_parameters(remove_duplicate=False))
    if tied:
        head, embedding = loaded.pop("lm_head.weight"), text_model(model).embed_tokens.weight
        if head.data_ptr() != embedding.data_ptr():
            raise AssertionError("tie_word_embeddings is set but lm_head is not the embedding")
    if loaded.keys() != expected.keys():
        raise AssertionError(f"parameters differ: {sorted(loaded.keys() ^ expected.keys())}")
    for name, parameter in loaded.items():
        if parameter.dtype != torch.float32 or not torch.equal(parameter, expected[name]):
            raise AssertionError(f"{name}: HF holds another value than the checkpoint's")


def assert_holds(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    """Each parameter named in `expected` equals it; other parameters (e.g. a quantizer's) are not looked at."""
    loaded = dict(model.named_parameters(remove_duplicate=False))
    for name, value in expected.items():
        if name not in loaded or not torch.equal(loaded[name].to(torch.float32), value):
            raise AssertionError(f"{name}: missing or another value than expected")


@torch.inference_mode()
def full_forward(model: torch.nn.Module, ids: torch.Tensor, hidden_layers: list[int]):
    """Logits [T, V] of one cache-free forward (HF's chunked GDN path) and the residual stream after
    each layer in `hidden_layers` [T, H], taken by forward hooks on the decoder layers."""
    layers = text_model(model).layers
    captured = {}

    def capture(index):
        def hook(_module, _inputs, output):
            captured[index] = (output[0] if isinstance(output, tuple) else output)[0].clone()
        return hook

    handles = [layers[index].register_forward_hook(capture(index)) for index in hidden_layers]
    try:
        logits = model(input_ids=ids[None], use_cache=False).logits[0]
    finally:
        for handle in handles:
            handle.remove()
    return logits, captured


@torch.inference_mode()
def greedy_decode(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int):
    """Prefill, then one token at a time through HF's cache (the recurrent GDN path).

    Returns tokens [N], the logits each token was chosen from [N, V] (row 0 = prefill's last row) and
    the top1 - top2 margin of each row [N].
    """
    output = model(input_ids=prompt[None], use_cache=True)
    cache, logits = output.past_key_values, output.logits[0, -1]
    tokens, step_logits = [], []
    for step in range(new_tokens):
        step_logits.append(logits.clone())
        tokens.append(int(torch.argmax(logits)))
        if step + 1 < new_tokens:
            output = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
            logits = output.logits[0, -1]
    step_logits = torch.stack(step_logits)
    top2 = torch.topk(step_logits, 2, dim=-1).values
    return torch.tensor(tokens, dtype=torch.int32), step_logits, top2[:, 0] - top2[:, 1]


@torch.inference_mode()
def decode_vs_full_forward(model, prompt: torch.Tensor, tokens: torch.Tensor, step_logits: torch.Tensor):
    """Max |difference| per greedy step between the cached decode and one cache-free forward over
    prompt + generated tokens (HF's recurrent vs chunked GDN paths must agree)."""
    sequence = torch.cat([prompt, tokens[:-1].to(prompt.dtype)])
    logits, _ = full_forward(model, sequence, [])
    return (logits[len(prompt) - 1:] - step_logits).abs().amax(dim=-1)
