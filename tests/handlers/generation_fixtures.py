"""A tiny causal LM and tokenizer built in code (fixed seeds, no downloads) for the engine tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a model server answers requests with tokens as they come",
    "continuous batching lets new sequences join the running batch",
    "héllo wörld, ünïcode text is split into bytes by the tokenizer",
    "stop strings end a stream; penalties change what comes next",
] * 4
EOS = "<eos>"


def build_tokenizer() -> Any:
    """A byte-level BPE tokenizer (about 300 tokens) trained on a fixed corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def build_model(vocab_size: int, eos_token_id: int, kind: str = "llama", seed: int = 0) -> Any:
    """A 2-layer model with random weights; a large init range makes its logits decisive."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if kind == "llama":
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            initializer_range=0.2,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id,
            bos_token_id=None,
        )
        model = LlamaForCausalLM(config)
    else:
        config = GPT2Config(
            vocab_size=vocab_size,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=256,
            initializer_range=0.2,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id,
            bos_token_id=eos_token_id,
        )
        model = GPT2LMHeadModel(config)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = eos_token_id
    return model.eval()


def save_pretrained(folder: Path, kind: str = "llama") -> tuple[Any, Any]:
    """Save a tiny model and its tokenizer into ``folder``; returns ``(model, tokenizer)``."""
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), tokenizer.eos_token_id, kind)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer
