"""Writes a tiny random-weight llama GGUF model (~0.5 MB) that real llama.cpp loads and runs.

Output is gibberish, but everything else is real: tokenisation, chat template, sampling,
streaming, usage counts, stop reasons. Nothing is downloaded.

``eos_logit``: a model that ends its answers (the end token ``<|im_end|>`` gets about this logit whatever the
input, so a sampled answer is a few tokens long): for clients that treat reaching ``max_tokens`` as an error,
as Claude Code does.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_LAYER = 2
# The trained context the model says it has: llama.cpp's server caps a slot's context at it ("the slot context
# exceeds the training context of the model - capping"), and the coding-agent tests need room for their prompts.
N_CTX = 32768

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = ["the", "a", "hello", "world", "model", "turn", "out", "is", "of", "and", "to", "in", "it", "you"]


def _vocab() -> tuple[list[str], list[float], list[int]]:
    t = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [t.UNKNOWN, t.CONTROL, t.CONTROL, t.CONTROL, t.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [t.BYTE] * 256
    pieces = list(dict.fromkeys(["▁", *(f"▁{w}" for w in _WORDS), *"abcdefghijklmnopqrstuvwxyz", *_WORDS]))
    tokens += pieces
    types += [t.NORMAL] * len(pieces)
    scores = [0.0] * 261 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [int(x) for x in types]


def write_tiny_model(path: Path, seed: int = 0, eos_logit: float = 0.0) -> Path:
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)
    kv_dim = N_EMBD // N_HEAD * N_HEAD_KV

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("turnout-tiny")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(4)
    writer.add_add_bos_token(True)
    # No "▁" before the text that follows a special token: llama.cpp feeds the chat template's generation prompt
    # ("<|im_start|>assistant\n") to a grammar before sampling, and a space there fails every grammar
    # (response_format, tool calls) with "Failed to initialize samplers".
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_pooling_type(gguf.PoolingType.MEAN)  # one vector per input on /v1/embeddings

    embeddings, output = weight(n_vocab, N_EMBD), weight(n_vocab, N_EMBD)
    if eos_logit:
        # every token's embedding carries 1.0 in dimension 0, which dominates the (small) residual stream: after
        # the final RMS norm it is about sqrt(N_EMBD), and the end token's output row turns it into eos_logit
        embeddings[:, 0] = 1.0
        output[4, 0] = eos_logit / np.sqrt(N_EMBD)
    writer.add_tensor("token_embd.weight", embeddings)
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", output)
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv_dim, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv_dim, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(N_EMBD, N_FF))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(N_FF, N_EMBD))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
