"""Regenerate tokenizer.json: a byte-level BPE of 8192 tokens trained on kjv.jsonl.xz.

GPT-2's pre-tokenizer and byte alphabet, `<|endoftext|>` as id 0 (the end-of-document token), no
normalizer, so bsops can run it through tiktoken with the same ids as `tokenizers`.

    python corpus/make_tokenizer.py          # writes corpus/tokenizer.json (deterministic)
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
VOCAB_SIZE = 8192
EOD = "<|endoftext|>"


def documents() -> list[str]:
    with lzma.open(HERE / "kjv.jsonl.xz", "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def train() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=[EOD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(documents(), trainer=trainer)
    return tok


def main() -> None:
    tok = train()
    out = HERE / "tokenizer.json"
    tok.save(str(out), pretty=False)
    print(f"wrote {out}: {tok.get_vocab_size()} tokens, {EOD} = {tok.token_to_id(EOD)}")


if __name__ == "__main__":
    main()
