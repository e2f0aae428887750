"""Model folders for ``bench/bench_engine.py``: no weights, nothing downloaded.

SGLang's ``--load-format dummy`` initialises random weights from ``config.json`` alone, so a
folder with ``config.json``, ``generation_config.json`` and tokenizer files is a servable model:
real kernels, real KV cache, real step times — meaningless text. ``--model-config`` names:

* ``tiny`` — the tests' CPU model shape (as :func:`tests.sglang.real_server.build_tiny_model`:
  Qwen2, hidden 128, 2 layers, float32), vocabulary = the tokenizer's (below);
* ``llama-8b`` — the shape of Llama-3.1-8B (``LlamaForCausalLM``, hidden 4096, 32 layers, 32
  heads, 8 KV heads, intermediate 14336, rope θ 500,000 with Llama-3 scaling,
  bfloat16): GPU-realistic step times and KV bytes per token (128 KiB in bf16);
* ``llama-tiny`` — the same Llama config shrunk to hidden 128 / 2 layers: a CPU smoke test of
  the ``llama-8b`` path.

The tokenizer is a byte-level BPE trained here on the replay's word list (ChatML specials and
chat template), and the model's ``vocab_size`` is set to the tokenizer's own size (about 1,000
entries). Every id the random weights pick is then a real token: it decodes to visible text
(streams show tokens as they are generated: real TTFT and time per token) and the reply,
re-encoded inside the next prompt, keeps about its length. With a larger model vocabulary than
tokenizer (the tests' tiny model: 2,048 ids, 1,012 tokens) about half the sampled ids decode to
nothing and a stream shows its text only at the end — every call's TTFT equals its latency,
which made the step-time calibration meaningless; padding the tokenizer with filler entries
instead makes each reply re-encode to several tokens per generated one (prompts grow past the
recorded lengths). For ``llama-8b`` this shrinks the embedding and LM head from 2 × 0.53 B to
2 × ~4 M parameters: the 32 transformer layers (~7.0 B parameters), the KV bytes per token and
the attention are the 8B model's; the LM head's share of a decode step (~7 %) is missing.
"""
from __future__ import annotations

import json
from pathlib import Path

from tests.sglang.real_server import CHAT_TEMPLATE

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,   # replaced: see above
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "attention_bias": False, "mlp_bias": False,
}
#: the tests' tiny Qwen2 (tests/sglang/real_server.py ``build_tiny_model``)
TINY = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 2048,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "float32", "use_sliding_window": False,
}
LLAMA_TINY = {**LLAMA_8B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
              "max_position_embeddings": 8192, "torch_dtype": "float32"}
MODEL_CONFIGS = ("tiny", "llama-tiny", "llama-8b")


def local_tokenizer(root: Path, vocab_size: int = 1536) -> tuple[int, int]:
    """Train a byte-level BPE of at most ``vocab_size`` entries on the replay's words, save it in
    ``root``; returns (its size, the id of ``<|im_end|>``, the end-of-sequence token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from serving_hooks.replay_prompts import WORDS

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(((" ".join(WORDS) + "\n") * 50 + "user assistant system tok\n" * 20).splitlines(),
                            trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(root)
    return len(fast), int(fast.convert_tokens_to_ids("<|im_end|>"))


def write_model(root: Path, name: str) -> Path:
    """Write the model folder ``name`` (one of :data:`MODEL_CONFIGS`) under ``root``."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"--model-config {name!r}: use one of {', '.join(MODEL_CONFIGS)}")
    root.mkdir(parents=True, exist_ok=True)
    config = dict({"tiny": TINY, "llama-8b": LLAMA_8B, "llama-tiny": LLAMA_TINY}[name])
    size, eos = local_tokenizer(root)
    config.update({"vocab_size": size, "bos_token_id": eos, "eos_token_id": eos})
    (root / "config.json").write_text(json.dumps(config, indent=1))
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": False}))
    return root
