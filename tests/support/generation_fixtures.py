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
    model: Any
    config: Any
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


def _permute(weight: Any, n_head: int) -> Any:
    """A q/k projection in llama.cpp's layout (rotary halves interleaved), as GGUF files hold it."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def save_gguf(path: Path, model: Any, tokenizer: Any) -> None:
    """Write a tiny Llama and its byte-level BPE tokenizer as an F32 ``.gguf`` file."""
    import json

    import gguf

    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_rope_dimension_count(config.hidden_size // heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    state = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab = sorted(state["vocab"].items(), key=lambda kv: kv[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    special = set(tokenizer.all_special_ids)
    writer.add_token_types([3 if i in special else 1 for _, i in vocab])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in state["merges"]])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.eos_token_id)
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, tensor in model.state_dict().items():
        data = tensor.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            target = "token_embd.weight"
        elif name == "model.norm.weight":
            target = "output_norm.weight"
        elif name == "lm_head.weight":
            target = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            part = rest.removesuffix(".weight")
            target = f"blk.{layer}.{names[part]}.weight"
            if part == "self_attn.q_proj":
                data = _permute(data, heads)
            elif part == "self_attn.k_proj":
                data = _permute(data, kv_heads)
        writer.add_tensor(target, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


GENERATION_MANIFEST = {"model": {"modelName": "tiny", "handler": "text_generation"}}


def load_tiny_service(folder: Path, running: int, prefill_chunk: int) -> Any:
    """The built-in ``text_generation`` handler loaded (in this process) over the tiny model
    saved in ``folder``, with ``running`` slots (its batch size too) and prefill chunks of
    ``prefill_chunk`` tokens: what a worker's engine loop drives."""
    from handlers.context import Context
    from handlers.service import load_service

    save_pretrained(folder)
    config = {"handler": {"max_running_sequences": running, "prefill_chunk_tokens": prefill_chunk}}
    context = Context(
        "tiny", str(folder), GENERATION_MANIFEST, running, None, "0.12.0", model_yaml_config=config
    )
    return load_service(folder, GENERATION_MANIFEST, context)
