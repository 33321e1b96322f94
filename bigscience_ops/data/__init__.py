"""Training data: jsonl -> Megatron-compatible .bin/.idx, tokenizers, GPT dataset indices, bundled corpus.

Modules:
  indexed.py      the MMapIndexedDataset file format: writer (atomic), reader, merge
  tokenizer.py    GPT-2 BPE from vocab.json + merges.txt, any tokenizer.json; fastokens and tiktoken fast paths
  preprocess.py   jsonl[.gz|.xz] -> tokens as Megatron's preprocess_data.py, bad-line accounting, workers
  gpt_dataset.py  Megatron's GPT dataset: doc/sample/shuffle indices, split, blend, cache
  index_files.py  those indices built straight into their .npy files in bounded memory
  _shuffle.c      numpy's legacy RandomState.shuffle in C, prefetching (same draws, same bytes)
  locks.py        one builder at a time: flock, or an O_EXCL lock file where flock is missing
  corpus.py       the bundled real-text corpus, built into .bin/.idx on demand
"""
