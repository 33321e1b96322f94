"""bsops' model as an lm-evaluation-harness `LM`: lm-eval drives, a Scorer answers in the checkpoint's layout.

`BsopsLM` is a `TemplateLM` (lm_eval/api/model.py) over a `Scorer` (scorer.py: the model in its TP/PP
layout, rank 0's side) and the experiment's own tokenizer. It answers the three request types the way
lm-eval's `hf` model (lm_eval/models/huggingface.py, HFLM) answers them, so that the same checkpoint gives
the same numbers through `bsops convert` + HFLM and through `bsops eval`:

- `loglikelihood`: TemplateLM's `_encode_pair` (trailing spaces of the context move to the continuation,
  the pair encoded whole and split at the context's length; an empty context becomes the end-of-document
  token), then HFLM's truncation: the model reads `(context + continuation)[-(max_length + 1):][:-1]` and
  the continuation is scored at the last len(continuation) positions;
- `loglikelihood_rolling`: the document in HFLM's windows (`rolling_windows`: lm_eval.utils'
  get_rolling_token_windows + make_disjoint_window, the first one conditioned on the end-of-document
  token, context_len 1), the windows' log-likelihoods summed;
- `generate_until`: greedy, one `Scorer.next_tokens` call per generated token for a batch of contexts,
  the context left-truncated to max_length - max_gen_toks, stopped at any `until` string or the
  end-of-document token, the text cut at the first stop string (HFLM's postprocess).

Requests are sorted longest first (as HFLM's Collator sorts them) and handed to the Scorer in chunks,
so each of its batches holds sequences of about one length; identical requests are scored once.

Tokenizer: the experiment's (data.tokenizer) on the `tokenizers` backend, the reference the fast
backends are checked against and what transformers' tokenizer runs on the converted model, so the ids
are those `bsops convert`'s export gives HFLM. A literal `<|endoftext|>` in a task's text is plain text
here, as in preprocessing (the model never saw it as the end-of-document token inside a document);
transformers' tokenizer makes it the special token instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from bigscience_ops.ops.evaluate import EvalError
from bigscience_ops.untrusted import excerpt

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance

    from bigscience_ops.data.tokenizer import Tokenizer
    from bigscience_ops.schema import Experiment

PROGRESS_SECONDS = 30.0
"""Least time between two progress lines of one request type (the last line always comes)."""
CHUNK_BATCHES = 16
"""Batches of requests handed to the Scorer per call: the unit of progress lines."""
MAX_GEN_TOKS = 256
"""Tokens a generate_until request may generate when its task names no max_gen_toks (HFLM's default)."""


class Scorer(Protocol):
    """Rank 0's side of the model in its checkpoint's layout (scorer.py)."""

    max_length: int
    vocab_size: int
    eod: int

    def score(self, items: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Per (context, continuation): (sum of log p(continuation), whether greedy decoding gives it)."""
        ...

    def next_tokens(self, contexts: list[list[int]]) -> list[int]:
        """The greedy next token after each context."""
        ...


def rolling_windows(tokens: list[int], prefix: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """A document's (context, continuation) windows as HFLM.loglikelihood_rolling makes them: every token
    predicted once, the first window conditioned on `prefix`, each later one on the tokens before it (up to
    max_length + 1 tokens per window)."""
    return list(map(make_disjoint_window, get_rolling_token_windows(
        token_list=tokens, prefix_token=prefix, max_seq_len=max_length, context_len=1)))


def fit(context: list[int], continuation: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """(context, continuation) cut from the left to at most max_length + 1 tokens together, as HFLM cuts
    them: the model reads all but the last token, so the continuation keeps every token and the context at
    least one. A continuation of no token or more than max_length tokens is refused (HFLM asserts)."""
    if not continuation or len(continuation) > max_length:
        raise EvalError(f"a continuation of {len(continuation)} tokens cannot be scored; allowed: 1 to "
                        f"{max_length} tokens (the model's sequence length)")
    if not context:
        raise EvalError("a request with an empty context reached the model; lm-eval gives it the "
                        "end-of-document token first")
    keep = max_length + 1 - len(continuation)
    return context[-keep:], continuation


class BsopsLM(TemplateLM):
    """lm-eval's model interface over a Scorer and the experiment's tokenizer (see the module docstring)."""

    def __init__(self, scorer: Scorer, tokenizer: Tokenizer, batch_size: int = 8,
                 log: Callable[[str], None] = lambda line: None) -> None:
        super().__init__()
        if tokenizer.eod is None:
            raise EvalError(f"tokenizer {tokenizer.name} has no <|endoftext|> token; lm-eval's requests need one "
                            "(the context of an empty-context request and of a document's first window)")
        if tokenizer.vocab_size > scorer.vocab_size:
            raise EvalError(f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} tokens but the model's vocabulary "
                            f"has {scorer.vocab_size}; ids past {scorer.vocab_size - 1} would have no embedding: "
                            "evaluate with the tokenizer the model was trained with")
        if tokenizer.eod != scorer.eod:
            raise EvalError(f"the tokenizer's end-of-document id {tokenizer.eod} is not the model's "
                            f"{scorer.eod}; evaluate with the tokenizer the model was trained with")
        self.scorer = scorer
        self._tok = tokenizer
        self.batch_size = batch_size
        self.log = log

    # --- what TemplateLM and lm-eval's evaluator ask of a model

    @property
    def eot_token_id(self) -> int:
        return int(self._tok.eod)

    @property
    def max_length(self) -> int:
        return int(self.scorer.max_length)

    @property
    def max_gen_toks(self) -> int:
        return MAX_GEN_TOKS

    @property
    def tokenizer_name(self) -> str:
        return self._tok.name

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """The text's ids; the tokenizer adds no special token, whatever add_special_tokens says (GPT-2's does
        not either)."""
        return list(self._tok.encode(string))

    def tok_decode(self, tokens: Sequence[int], **kwargs: Any) -> str:
        return self._tok.decode(list(tokens))

    @property
    def bsops_tokenizer(self) -> Tokenizer:
        """The experiment's tokenizer (bits per byte encodes documents to arrays with it)."""
        return self._tok

    def get_model_info(self) -> dict:
        return {"max_length": self.max_length, "tokenizer": self._tok.name}

    # --- the three request types

    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        """(log-likelihood, greedy) per (request, context ids, continuation ids), in the order given."""
        for strings, _, continuation in requests:
            if len(continuation) > self.max_length:
                text = strings[1] if isinstance(strings, tuple) and len(strings) == 2 else ""
                raise EvalError(f"a task asks for the log-likelihood of a continuation of {len(continuation)} tokens "
                                f"({excerpt(str(text))}); the model reads at most {self.max_length} tokens "
                                "(model.seq_length): the task's continuations must be shorter")
        return self.score([(context, continuation) for _, context, continuation in requests], "loglikelihood")

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """Each document's log-likelihood, every token predicted once in HFLM's windows."""
        windows, owners = [], []
        for index, (text,) in enumerate(req.args for req in requests):
            for window in rolling_windows(self.tok_encode(text), self.prefix_token_id, self.max_length):
                windows.append(window)
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self.score(windows, "loglikelihood_rolling"), strict=True):
            totals[owner] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, cut at the first stop string."""
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for index, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items(), key=str)), []).append(index)
        eos = self.tok_decode([self.eot_token_id])
        progress = EvalProgress("generate_until", len(requests), self.log)
        for indices in groups.values():
            kwargs = normalize_gen_kwargs(requests[indices[0]].args[1], self.max_gen_toks)
            if kwargs.get("do_sample") or kwargs.get("temperature", 0.0) not in (0, 0.0, None):
                raise EvalError(f"a task asks for sampled generation ({requests[indices[0]].args[1]}); "
                                "bsops eval generates greedily only (do_sample false, temperature 0)")
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen = int(kwargs.pop("max_gen_toks"))
            if not 0 < max_gen < self.max_length:
                raise EvalError(f"a task asks to generate max_gen_toks {max_gen} tokens ({MAX_GEN_TOKS} where it "
                                f"names none); allowed: 1 to {self.max_length - 1}, below the model's sequence length "
                                f"{self.max_length} (room for the context)")
            order = sorted(indices, key=lambda i: -len(requests[i].args[0]))
            for start in range(0, len(order), self.batch_size):
                batch = order[start:start + self.batch_size]
                contexts = [self.tok_encode(requests[i].args[0])[-(self.max_length - max_gen):] or [self.eot_token_id]
                            for i in batch]  # an empty context: the end-of-document token, as for loglikelihood
                for i, text in zip(batch, self._greedy(contexts, until, max_gen), strict=True):
                    out[i] = postprocess_generated_text(text, until, None)
                    self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
                progress.advance(len(batch))
        progress.done()
        return [text or "" for text in out]

    def _greedy(self, contexts: list[list[int]], until: list[str], max_gen: int) -> list[str]:
        """Each context's greedy continuation as text, stopped after max_gen tokens, at the end-of-document
        token or once a stop string appears (the text still holds it; the caller cuts)."""
        generated: list[list[int]] = [[] for _ in contexts]
        running = list(range(len(contexts)))
        for _ in range(max_gen):
            if not running:
                break
            tokens = self.scorer.next_tokens([contexts[i] + generated[i] for i in running])
            still = []
            for i, token in zip(running, tokens, strict=True):
                generated[i].append(int(token))
                text = self.tok_decode(generated[i])
                if int(token) != self.eot_token_id and not any(stop and stop in text for stop in until):
                    still.append(i)
            running = still
        return [self.tok_decode(ids) for ids in generated]

    # --- scoring in chunks, longest first

    def score(self, pairs: Sequence[tuple[list[int], list[int]]], what: str,
              progress: bool = True) -> list[tuple[float, bool]]:
        """(log-likelihood, greedy) of each (context, continuation) after HFLM's truncation, in the order given:
        scored longest first in chunks of CHUNK_BATCHES batches, each distinct pair once; progress lines
        named `what` unless progress is false."""
        fitted = [fit(context, continuation, self.max_length) for context, continuation in pairs]
        distinct: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        slots = [distinct.setdefault((tuple(c), tuple(x)), len(distinct)) for c, x in fitted]
        unique = list(distinct)
        order = sorted(range(len(unique)), key=lambda i: (-(len(unique[i][0]) + len(unique[i][1])), unique[i]))
        answers: list[tuple[float, bool] | None] = [None] * len(unique)
        lines = EvalProgress(what, len(unique), self.log if progress else lambda line: None)
        for chunk in chunks(order, self.batch_size * CHUNK_BATCHES):
            scored = self.scorer.score([(list(unique[i][0]), list(unique[i][1])) for i in chunk])
            if len(scored) != len(chunk):
                raise EvalError(f"the scorer answered {len(scored)} of {len(chunk)} requests")
            for i, (logprob, greedy) in zip(chunk, scored, strict=True):
                answers[i] = (float(logprob), bool(greedy))
            lines.advance(len(chunk))
        lines.done()
        return [answers[slot] for slot in slots]  # type: ignore[misc]


def chunks(items: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(items), max(1, size)):
        yield items[start:start + size]


class EvalProgress:
    """`what: done/total` lines through `log`, at most one per PROGRESS_SECONDS, and one at the end."""

    def __init__(self, what: str, total: int, log: Callable[[str], None]) -> None:
        self.what, self.total, self.log = what, total, log
        self.count = 0
        self.started = self.last = time.monotonic()

    def advance(self, n: int) -> None:
        self.count += n
        now = time.monotonic()
        if now - self.last >= PROGRESS_SECONDS and self.count < self.total:
            self.last = now
            self.log(f"{self.what}: {self.count}/{self.total} requests, {now - self.started:.0f} s")

    def done(self) -> None:
        if self.total:
            self.log(f"{self.what}: {self.total} requests in {time.monotonic() - self.started:.1f} s")


def experiment_tokenizer(exp: Experiment) -> Tokenizer:
    """The experiment's tokenizer (data.tokenizer) on the `tokenizers` backend (see the module docstring)."""
    from bigscience_ops.data.tokenizer import TokenizerError, TokenizerSpec, build_tokenizer

    t = exp.data.tokenizer
    try:
        return build_tokenizer(TokenizerSpec(t.kind, t.vocab_file, t.merges_file, t.json_file, backend="tokenizers"))
    except TokenizerError as exc:
        raise EvalError(f"data.tokenizer: {exc}") from None


def build_lm(exp: Experiment, scorer: Scorer, log: Callable[[str], None] = lambda line: None) -> BsopsLM:
    """The experiment's model as an lm-eval LM: its tokenizer, eval.batch_size sequences per forward pass."""
    return BsopsLM(scorer, experiment_tokenizer(exp), batch_size=exp.eval.batch_size, log=log)

