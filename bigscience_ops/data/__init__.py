"""Training data: jsonl -> Megatron-compatible .bin/.idx, tokenizers, GPT dataset indices, bundled corpus.

Modules:
  indexed.py      the MMapIndexedDataset file format: writer (atomic), reader, merge
  tokenizer.py    GPT-2 BPE from vocab.json + merges.txt, any tokenizer.json; fastokens and tiktoken fast paths
  tokenizer_cache.py  the backend probe's outcome kept in the user cache ($XDG_CACHE_HOME/bsops)
  preprocess.py   jsonl shards -> tokens as Megatron's preprocess_data.py: inputs, choices, the result
  inputs.py       files, folders and globs (each file once, never bsops' own); decoders; bounded whole-line chunks
  xz.py           multi-block .xz read block by block (in the workers), streamed
  zst.py          a .zst's frames walked before it is read (a cut-short file is refused)
  encode.py       lines -> tokens per key, bad-line accounting, the cross-check
  pipeline.py     the work over processes: sequential, chunks of one input, or whole shards; progress
  shards.py       one part per input shard, written atomically with a record: resume, merge
  gpt_dataset.py  Megatron's GPT dataset: doc/sample/shuffle indices, split, blend, cache
  index_files.py  those indices built straight into their .npy files in bounded memory
  _shuffle.c      numpy's legacy RandomState.shuffle in C, prefetching (same draws, same bytes)
  locks.py        one builder at a time: flock, or an O_EXCL lock file where flock is missing
  corpus.py       the bundled real-text corpus, built into .bin/.idx on demand
  verify.py       `bsops data verify`: a dataset read whole, every token and index entry, nothing sampled
"""
