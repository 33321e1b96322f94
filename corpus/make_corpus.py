"""Regenerate kjv.jsonl.xz: the King James Version of the Bible, one chapter per document.

Source: Debian's `bible-kjv-text` package (the text) read through the `bible` program of
`bible-kjv` (its data file is compressed in that program's own format). The KJV text is in the
public domain (translation of 1611; see /usr/share/doc/bible-kjv-text/copyright).

    apt-get install bible-kjv bible-kjv-text
    python corpus/make_corpus.py            # writes corpus/kjv.jsonl.xz
"""

from __future__ import annotations

import json
import lzma
import re
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHAPTER = re.compile(r"^([1-3]?\s?[A-Z][A-Za-z ]+?) (\d+)$")
VERSE = re.compile(r"^\s*(\d+) (.*)$")


def read_bible() -> str:
    argv = ["bible", "-l100000", "Gen1:1-Rev22:21"]  # one verse per line, no wrapping
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0 or not done.stdout:
        raise SystemExit(f"{argv} failed with exit code {done.returncode}: {done.stderr.strip()} "
                         "(install Debian's bible-kjv and bible-kjv-text)")
    return done.stdout


def chapters(text: str) -> list[dict]:
    docs: list[dict] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if m := CHAPTER.match(line):
            docs.append({"id": f"{m.group(1)} {m.group(2)}", "verses": []})
        elif (m := VERSE.match(line)) and docs:
            docs[-1]["verses"].append(f"{m.group(1)} {m.group(2).strip()}")
        else:
            raise SystemExit(f"unexpected line in the bible output: {line!r}")
    return [{"id": d["id"], "text": d["id"] + "\n\n" + "\n".join(d["verses"]) + "\n"} for d in docs]


def main() -> None:
    docs = chapters(read_bible())
    out = HERE / "kjv.jsonl.xz"
    payload = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode()
    out.write_bytes(lzma.compress(payload, preset=9 | lzma.PRESET_EXTREME))
    print(f"wrote {out}: {len(docs)} chapters, {len(payload) / 1e6:.2f} MB of jsonl, "
          f"{out.stat().st_size / 1e6:.2f} MB compressed")


if __name__ == "__main__":
    main()
