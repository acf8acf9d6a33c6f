"""Generate the tiny random-weight Llama the realengine tier serves, offline and seeded (run by install.sh).

Why a generated model: the tier must run on a machine that reaches package registries only, with no
model hub, and must start a real vLLM in about a minute on two CPU cores. The weights are random, so the
text is nonsense, but greedy decoding of the same prompt is deterministic, which is all the P/D tests
compare. Shapes are chosen for vLLM's CPU backend: head_dim 32 is the smallest its CPU attention takes.

The tokenizer is a byte-level BPE trained here on the installed vLLM package's own .py files, sorted, so
the input is fixed by the vLLM version the cache is keyed by, and nothing is downloaded.

Usage: python make_tiny_model.py OUT_DIR      (with the real-engine venv's interpreter)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import vllm
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 0
VOCAB_SIZE = 2048
TRAINING_FILES = 400  # enough text for 2,048 merges; more only slows the install
MAX_MODEL_LEN = 2048
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def train_tokenizer() -> Tokenizer:
    """A byte-level BPE trained on vLLM's sources: any text encodes, and the vocabulary is code-shaped."""
    files = sorted(str(p) for p in Path(vllm.__file__).parent.rglob("*.py"))[:TRAINING_FILES]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    return tok


def main(out: str) -> None:
    tok = train_tokenizer()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=MAX_MODEL_LEN,
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=SPECIAL_TOKENS.index("<s>"),
        eos_token_id=SPECIAL_TOKENS.index("</s>"),
        pad_token_id=SPECIAL_TOKENS.index("<pad>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1])
