"""A tiny Hugging Face causal LM (Llama architecture, random weights, built from a config: no download)
as a workload, for tensor parallelism with the model's own declared plan."""

from __future__ import annotations

import torch

from workbench.workloads import Workload

VOCAB, SEQUENCE = 128, 16


def tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQUENCE,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def token_batch(batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    tokens = torch.randint(VOCAB, (batch_size, SEQUENCE), generator=generator)
    return {"input_ids": tokens, "labels": tokens}


def workload() -> Workload:
    return Workload.from_callables(tiny_llama, batch_fn=token_batch, batch_size=4, name="tiny-llama")
