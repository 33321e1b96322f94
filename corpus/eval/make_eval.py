"""Regenerate the bundled evaluation example: smoke tasks on the chapters `tiny` never trains on.

`tiny` (trainings/tiny.yaml) trains on corpus/kjv.jsonl.xz, one document per chapter, with
`data.split: 949,50,1`: bsops (bigscience_ops/data/gpt_dataset.py `split_boundaries`, Megatron's
rounding) gives documents 0-1128 to training, 1129-1187 to validation and 1188 to test. The 60
chapters 1129-1188 (Titus 1 to Revelation 22) are the held-out text; every file here is made from
them only, and a verse whose text also occurs word for word in a training chapter is left out.

  kjv_last_word.jsonl    last-word task (LAMBADA-style): up to three consecutive verses, as the
                         chapter prints them (verse numbers included), ending in a verse whose last
                         word is to be predicted; read by kjv_last_word.yaml with lambada_openai's
                         templates (context = text without its last word, target = " " + last word)
  kjv_two_choice.jsonl   two-choice task: a verse and the next verse's number, then the true next
                         verse against a verse of another held-out chapter (kjv_two_choice.yaml)
  kjv_epistles.jsonl     bits-per-byte source: the 38 held-out chapters Titus 1 to Jude 1, whole
  kjv_revelation.jsonl   bits-per-byte source: Revelation 1-22, whole

These are smoke tasks on tiny's held-out text, to exercise `bsops eval` end to end offline on CPU,
not benchmarks: a few hundred examples, one book's style, no human curation. Stdlib only and
deterministic (random.Random with a fixed seed, the corpus read in order):

    python corpus/eval/make_eval.py        # rewrites the four .jsonl files next to this script
"""

from __future__ import annotations

import functools
import json
import lzma
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "kjv.jsonl.xz"
SPLIT = "949,50,1"  # trainings/tiny.yaml data.split; tests/evaluate/test_corpus_eval.py checks it against tiny's
SEED = 32  # issue 32
LAST_WORD_ITEMS = 200  # one loglikelihood request each
TWO_CHOICE_ITEMS = 150  # two loglikelihood requests each
MAX_CONTEXT_CHARS = 360  # about 90 tokens of the bundled tokenizer: within tiny's 128-token sequences
FIRST_REVELATION = "Revelation 1"
VERSE = re.compile(r"^(\d+) (.*)$")
LAST_WORD = re.compile(r"^(.*\S) ([A-Za-z]{3,})[.,;:!?]*$")  # the verse's last word, its punctuation dropped


def split_boundaries(split: str, num_docs: int) -> list[int]:
    """Document boundaries [0, train_end, valid_end, num_docs] as bsops computes them (Megatron's rounding)."""
    parts = [float(s) for s in split.split("," if "," in split else "/")]
    parts += [0.0] * (3 - len(parts))
    index = [0]
    for part in parts:
        index.append(index[-1] + int(round(part / sum(parts) * float(num_docs))))
    diff = index[-1] - num_docs
    return [index[0]] + [i - diff for i in index[1:]]


def chapters() -> list[dict]:
    """The corpus's documents in order (the order of the .bin bsops builds from it)."""
    with lzma.open(CORPUS, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def held_out(docs: list[dict], split: str = SPLIT) -> tuple[list[dict], list[dict]]:
    """(training documents, held-out documents: the valid and test ranges)."""
    train_end = split_boundaries(split, len(docs))[1]
    return docs[:train_end], docs[train_end:]


def verses(doc: dict) -> list[tuple[int, str]]:
    """(number, text without its number) of each verse of a chapter."""
    body = doc["text"].split("\n\n", 1)[1]
    found = []
    for line in body.splitlines():
        m = VERSE.match(line)
        if m is None:
            raise SystemExit(f"{doc['id']}: unexpected line {line!r}")
        found.append((int(m.group(1)), m.group(2)))
    return found


def _line(number: int, text: str) -> str:
    return f"{number} {text}"


def last_word_items(docs: list[dict], seen_in_training, rng: random.Random) -> list[dict]:
    items = []
    for doc in docs:
        vs = verses(doc)
        for i, (number, text) in enumerate(vs):
            m = LAST_WORD.match(text)
            if m is None or seen_in_training(text):
                continue
            lines = [f"{number} {m.group(1)} {m.group(2)}"]
            for before in reversed(vs[max(0, i - 2):i]):  # up to two verses before, while they fit
                length = sum(len(x) + 1 for x in lines) + len(_line(*before))
                if seen_in_training(before[1]) or length > MAX_CONTEXT_CHARS:
                    break
                lines.insert(0, _line(*before))
            if sum(len(x) + 1 for x in lines) > MAX_CONTEXT_CHARS:
                continue
            items.append({"chapter": doc["id"], "verse": number, "text": "\n".join(lines)})
    chosen = sorted(rng.sample(range(len(items)), min(LAST_WORD_ITEMS, len(items))))
    return [items[i] for i in chosen]


def two_choice_items(docs: list[dict], seen_in_training, rng: random.Random) -> list[dict]:
    pool = [(doc["id"], number, text) for doc in docs for number, text in verses(doc) if not seen_in_training(text)]
    candidates = []
    for doc in docs:
        vs = verses(doc)
        for (number, text), (next_number, next_text) in zip(vs, vs[1:]):
            if seen_in_training(text) or seen_in_training(next_text):
                continue
            context = f"{_line(number, text)}\n{next_number}"
            if len(context) + len(next_text) > MAX_CONTEXT_CHARS:
                continue
            candidates.append((doc["id"], next_number, context, next_text))
    items = []
    for i in sorted(rng.sample(range(len(candidates)), min(TWO_CHOICE_ITEMS, len(candidates)))):
        chapter, number, context, true = candidates[i]
        while True:  # a verse of another held-out chapter, of a length the context leaves room for
            other, other_number, wrong = rng.choice(pool)
            if other != chapter and len(context) + len(wrong) <= MAX_CONTEXT_CHARS:
                break
        label = rng.randrange(2)
        choices = [wrong, true] if label else [true, wrong]
        items.append({"chapter": chapter, "verse": number, "context": context, "choices": choices, "label": label,
                      "distractor": f"{other}:{other_number}"})
    return items


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_bytes("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode())


def build(out: Path = HERE) -> dict[str, int]:
    """Write the four files into OUT; return the rows of each."""
    training, held = held_out(chapters())
    train_text = "\n".join(doc["text"] for doc in training)

    @functools.cache
    def seen_in_training(verse_text: str) -> bool:  # 0.5 ms a verse; 1209 verses
        return verse_text in train_text

    first_rev = next(i for i, doc in enumerate(held) if doc["id"] == FIRST_REVELATION)
    files = {
        "kjv_last_word.jsonl": last_word_items(held, seen_in_training, random.Random(SEED)),
        "kjv_two_choice.jsonl": two_choice_items(held, seen_in_training, random.Random(SEED + 1)),
        "kjv_epistles.jsonl": [{"id": doc["id"], "text": doc["text"]} for doc in held[:first_rev]],
        "kjv_revelation.jsonl": [{"id": doc["id"], "text": doc["text"]} for doc in held[first_rev:]],
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        write_jsonl(out / name, rows)
    return {name: len(rows) for name, rows in files.items()}


def main() -> None:
    for name, rows in build().items():
        print(f"wrote {HERE / name}: {rows} rows")


if __name__ == "__main__":
    main()
