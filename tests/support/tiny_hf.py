"""A tiny random Llama in Hugging Face format for real vLLM engines, written by the tests themselves.

Run with the vLLM environment's Python (it has torch, transformers and tokenizers):
``python tests/support/tiny_hf.py OUT_DIR``. vLLM's CPU attention needs a head size of at least 32, so the
model has hidden size 128 and 4 heads. The tokenizer is a byte-level BPE trained here on generated text.
Output is gibberish but real: tokens, usage, streaming, metrics.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "runs",
    "over",
    "under",
    "quick",
    "brown",
    "lazy",
    "fox",
    "hello",
    "world",
    "model",
    "token",
    "city",
    "river",
    "blue",
    "red",
]


def write(out: Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15))) + "." for _ in range(500)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(lines, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE  # where every vLLM version looks for it
    config_path.write_text(json.dumps(config, indent=2))
    model_config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(model_config).save_pretrained(out, safe_serialization=True)
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))
