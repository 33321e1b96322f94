"""Typed YAML: mappings -> frozen dataclasses, with number coercion and errors that name the field.

Generic: knows nothing of experiments. A file may name a `base:` that it is merged over
(`read_with_bases`; the caller says which file a base name means), and a command line's
`SECTION.KEY=VALUE` texts make one more mapping merged over it (`parse_assignments`). Values are coerced to the
declared types (`10e6` for an int, `6e-5` for a float), unknown keys are rejected with the valid
ones, and each error names the file that set the value, its field path, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from bigscience_ops.errors import ConfigError


def documented(default: Any = dataclasses.MISSING, doc: str = "", *, factory: Any = None, trusted_shell_line: bool = False,
               at_least: float | None = None, above: float | None = None, below: float | None = None,
               at_most: float | None = None, charset: Charset | None = None) -> Any:
    """A field with its doc and bounds. `trusted_shell_line` marks trusted shell lines: a tab is allowed there, a line
    break never. `at_least` or `above`, and `below` or `at_most`, bound a number; `build` refuses a value outside them,
    naming the field and the range. `charset` lists the characters a string (or each string of a list) may hold;
    `build` refuses any other."""
    metadata: dict[str, Any] = {"doc": doc, "text": SHELL_LINE if trusted_shell_line else PLAIN}
    if charset is not None:
        metadata["charset"] = charset
    bounds = {k: v for k, v in (("at_least", at_least), ("above", above), ("below", below), ("at_most", at_most))
              if v is not None}
    if bounds:
        metadata["bounds"] = bounds
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# Every string may reach a job script, where a newline ends an `#SBATCH` comment and starts a
# command, and a CR, NUL, ESC or DEL hides or garbles what a reader sees: none is allowed. Nor are
# the Unicode line breaks (NEL U+0085, LINE and PARAGRAPH SEPARATOR U+2028/U+2029) and C1 controls,
# which Python's splitlines() and email headers treat as line ends. Trusted shell lines may hold a
# tab, still never a line break.
PLAIN = "plain"
SHELL_LINE = "shell-line"
_CONTROL = {PLAIN: re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]"),
            SHELL_LINE: re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")}
_NAMES = {0x00: "NUL", 0x09: "tab", 0x0A: "newline", 0x0B: "vertical tab", 0x0C: "form feed", 0x0D: "carriage return",
          0x1B: "escape", 0x1C: "file separator", 0x1D: "group separator", 0x1E: "record separator", 0x7F: "DEL",
          0x85: "next line", 0x2028: "line separator", 0x2029: "paragraph separator"}


def control_character(text: str, kind: str = PLAIN) -> str | None:
    """'U+000A (newline) at position 3' for the first control character `kind` refuses, else None."""
    found = _CONTROL[kind].search(text)
    if found is None:
        return None
    code = ord(found.group())
    name = _NAMES.get(code, "control character")
    return f"U+{code:04X} ({name}) at position {found.start()}"


def control_allowed(kind: str) -> str:
    if kind == SHELL_LINE:
        return ("allowed: one shell line per item: no line break or other control character (a tab is allowed); "
                "split it into several items")
    return ("allowed: one line of printable text, without control characters (C0 and C1 ranges, DEL, tab) or "
            "Unicode line breaks (U+2028, U+2029), which could end an #SBATCH line or an email header")


@dataclass(frozen=True)
class Charset:
    """The characters a string field may hold: `chars`, a regular-expression character class matching
    one allowed character, and `allowed`, the same in words for the error. Not empty, and no leading
    `-` unless `leading_dash` (a value that starts with one reads as an option to the tool it reaches)."""

    chars: str
    allowed: str
    leading_dash: bool = False

    def problem(self, text: str) -> str | None:
        """What in `text` is not allowed ('' (U+0020) at position 3', 'a leading -', 'empty'), else None."""
        if not text:
            return "it is empty (leave the field out, or null, for none)"
        one = re.compile(self.chars)
        for position, char in enumerate(text):
            if not one.fullmatch(char):
                return f"{char!r} (U+{ord(char):04X}) at position {position} is not allowed"
        if text.startswith("-") and not self.leading_dash:
            return "it starts with '-', which would read as an option"
        return None


def check_charset(charset: Charset, value: Any) -> str | None:
    """The first problem of `value` (a string or a list of strings) against `charset`, as the error's 'allowed' text."""
    for item in value if isinstance(value, list) else [value]:
        problem = charset.problem(item) if isinstance(item, str) else None
        if problem is not None:
            return f"{problem}; allowed: {charset.allowed}"
    return None


MAX_FILE_BYTES = 1 << 20  # an experiment or cron.yaml file: far above any real one
MAX_DEPTH = 32  # nesting of mappings and lists
MAX_NODES = 100_000  # values built, aliases counted once per use
MAX_EXPANDED_CHARS = 4 << 20  # text once every alias is expanded (3000 aliases of a 100 kB string made a 300 MB job script)


class _Loader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's base-60 integers, so `time: 20:00:00` stays a string; it refuses a key
    given twice in one mapping, nesting deeper than MAX_DEPTH and more than MAX_NODES values (aliases count
    once per use)."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._built = 0

    def construct_object(self, node, deep=False):
        self._built += 1
        if self._built > MAX_NODES:
            raise yaml.constructor.ConstructorError(None, None, f"more than {MAX_NODES} values (aliases included)",
                                                    node.start_mark)
        return super().construct_object(node, deep)

    def compose_node(self, parent, index):
        depth = getattr(self, "_depth", 0) + 1
        if depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                              self.peek_event().start_mark)
        self._depth = depth
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth = depth - 1

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping (first at line {seen[key]}); the "
                    "second would silently replace the first", key_node.start_mark)
            if isinstance(key, str):
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:int"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)

MAX_INT = 2**63 - 1  # what every tool downstream (numpy, torch, Slurm) holds

_INT_TEXT = re.compile(r"[-+]?\d[\d_]*(?:[eE]\+?\d+)?")
_FLOAT_TEXT = re.compile(r"[-+]?(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][-+]?\d+)?")


PLAIN_FILE_ALLOWED = ("a plain file: an experiment file or a base is never read through a symbolic link (it could "
                      "name any file, whose content an error would then show), nor from a FIFO, folder or device; "
                      "put the file itself there")


def read_yaml(path: Path) -> dict:
    """The mapping a YAML file holds: a plain file (never through a link, never a FIFO: untrusted.read_small) of at
    most MAX_FILE_BYTES of UTF-8, within _Loader's limits. An error shows no line of the file."""
    from bigscience_ops.untrusted import RecordFileError, kind_of, read_small

    try:
        data = read_small(path, MAX_FILE_BYTES)
        if data is None:
            raise ConfigError(str(path), "", "<file>", "an existing file (it is not there)")
        text = data.decode("utf-8")
    except RecordFileError as exc:
        if "holds more than" in exc.what:
            raise ConfigError(str(path), "", f"more than {MAX_FILE_BYTES} bytes",
                              f"at most {MAX_FILE_BYTES} bytes") from None
        if "cannot be opened" in exc.what:
            raise ConfigError(str(path), "", "<file>", f"a readable file ({exc.what.removeprefix('cannot be opened ')})"
                              ) from None
        raise ConfigError(str(path), "", kind_of(path), PLAIN_FILE_ALLOWED) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), "", f"byte {exc.object[exc.start:exc.start + 1]!r} at offset {exc.start}",
                          "UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(str(path), "", "<file>", f"a readable file ({exc.strerror})") from None
    data = _load(text, str(path), "", "<file>")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", type(data).__name__, "the top level must be a mapping of sections")
    return data


def _load(text: str, source: str, dotted: str, shown: object, flow_only: bool = False) -> Any:
    """The value YAML `text` holds, within bsops' limits (_Loader's, and MAX_EXPANDED_CHARS once aliases are
    expanded); `flow_only`: a mapping or list written in flow style only ({a: 1}, [a, b]), as one command-line value
    must be. Errors name `source`, `dotted` and `shown`."""
    try:
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
            if root is not None and expanded_chars(root, {}) > MAX_EXPANDED_CHARS:
                raise ConfigError(source, dotted, shown, f"at most {MAX_EXPANDED_CHARS} characters of text once "
                                                         "its aliases are expanded")
            if flow_only and isinstance(root, yaml.CollectionNode) and not root.flow_style:
                raise ConfigError(source, dotted, shown, "one YAML flow value: a list as [a, b], a mapping as "
                                                         "{key: value}, a string holding ': ' or ' #' quoted")
            if flow_only:
                _whole_value(text, root, source, dotted, shown)
            return loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except (yaml.YAMLError, RecursionError, ValueError) as exc:  # ValueError: an integer of thousands of digits
        raise ConfigError(source, dotted, shown, f"valid YAML within bsops' limits: {_yaml_problem(exc)}") from None


def _yaml_problem(exc: BaseException) -> str:
    """What YAML found wrong and where (line, column), without the line of the file PyYAML's own text quotes: the
    file may not be what its name says, and an error is no way to read it."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return " ".join(str(exc).split())[:200]
    parts = []
    for what, mark in ((exc.context, exc.context_mark), (exc.problem, exc.problem_mark)):
        if what:
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            parts.append(f"{' '.join(str(what).split())[:160]}{where}")
    return "; ".join(parts) or "not valid YAML"


def _whole_value(text: str, root, source: str, dotted: str, shown: object) -> None:
    """Refuse a command-line value of which YAML reads only a part: a ` #` (or a leading `#`) starts a comment that
    cuts the rest off (`paths.output=/x/run #2` would be /x/run), and `---`/`...` are document markers. What is
    typed is the value, whole, or it is refused, as `': '` is."""
    start, end = (root.start_mark.index, root.end_mark.index) if root is not None else (0, 0)
    if not text[:start].strip() and not text[end:].strip():
        return
    read = text[start:end]
    cut = f"YAML reads only {read!r} of it" if read else "YAML reads none of it"
    raise ConfigError(source, dotted, shown, f"{cut} (a '#' after a space, or at the start, begins a comment; '---' "
                                             "and '...' mark documents); allowed: one YAML flow value, whole: quote "
                                             "a string that holds ' #' or ': ' (paths.output='\"/x/run #2\"')")


def expanded_chars(node, memo: dict[int, int]) -> int:
    """Characters of text under `node` with every alias expanded (the node graph is shared, so memoized); an
    experiment file's and a task file's alias bombs are refused by it."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 0  # a recursive alias counts once
    if isinstance(node, yaml.ScalarNode):
        size = len(node.value)
    elif isinstance(node, yaml.SequenceNode):
        size = sum(expanded_chars(child, memo) for child in node.value)
    else:
        size = sum(expanded_chars(k, memo) + expanded_chars(v, memo) for k, v in node.value)
    memo[id(node)] = size
    return size


def read_with_bases(path: Path, find_base: Callable[[object, Path], Path],
                    before_merge: Callable[[dict, dict, str], None], chain: tuple[Path, ...] = ()) -> tuple[dict, dict]:
    """`path`'s mapping merged over the files its `base:` chain names, and for each field path the file that set
    it (the last one wins). `find_base(base, path)` is the file that `path`'s `base:` value means; each file's
    own mapping goes through `before_merge(data, inherited, source)` (a check, or an inherited value it
    replaces dropped) just before it is merged over what it inherits. A chain that loops is refused."""
    here = Path(os.path.realpath(path))  # realpath: a link loop is no exception (read_yaml refuses links)
    if here in chain:
        raise ConfigError(str(path), "base", " -> ".join(p.stem for p in chain + (path,)), "base chains must not loop")
    data = read_yaml(path)
    merged: dict = {}
    origins: dict = {}
    if data.get("base") is not None:
        merged, origins = read_with_bases(find_base(data["base"], path), find_base, before_merge, chain + (here,))
    before_merge(data, merged, str(path))
    merge(merged, data, origins, str(path), "")
    return merged, origins


def read_layers(path: Path, find_base: Callable[[object, Path], Path],
                before_merge: Callable[[dict, dict, str], None], top: tuple[dict, str] | None = None) -> tuple[dict, dict]:
    """read_with_bases, then one more layer merged over it as a file is over its base (`top`: the mapping and its
    source, e.g. the command line's assignments), through the same `before_merge`."""
    merged, origins = read_with_bases(path, find_base, before_merge)
    if top is not None and top[0]:
        before_merge(top[0], merged, top[1])
        merge(merged, top[0], origins, top[1], "")
    return merged, origins


def merge(into: dict, data: dict, origins: dict, source: str, prefix: str) -> None:
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value, origins, source, dotted + ".")
        else:
            into[key] = value
            _record(value, origins, source, dotted + ".")
        origins[dotted] = source


FIELD_PATH = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
ASSIGNMENT_ALLOWED = ("allowed: SECTION.KEY=VALUE: a field path (names of letters, digits, '_' and '-' joined by '.'), "
                      "'=', then one YAML flow value, e.g. train.seed=7, optimizer.lr=3e-4, eval.tasks=[arc_easy, piqa]")


def parse_assignments(texts: Iterable[str], source: str) -> dict:
    """`SECTION.KEY=VALUE` texts (a command line's) as one mapping, to be merged over a file's as a file is over its
    base (`merge`): each VALUE is one YAML flow value read by the file's loader (`7`, `3e-4`, `[a, b]`, `{x: 1}`;
    nothing after the `=` is null). Refused here: no `=`, a malformed field path, a control character or line break,
    a block-style value, and a field given twice or inside another one given (`train.seed=1 train={seed: 2}`).
    Unknown keys, types and bounds are `build`'s, as for a file; errors name `source`."""
    data: dict = {}
    given: dict[tuple[str, ...], str] = {}
    for text in texts:
        bad = control_character(text)
        if bad is not None:
            raise ConfigError(source, "", text, f"{bad}; {control_allowed(PLAIN)}")
        key, equals, value_text = text.partition("=")
        if not equals or not FIELD_PATH.fullmatch(key):
            problem = "no '='" if not equals else "no field path before '='" if not key else f"{key!r} is no field path"
            raise ConfigError(source, "", text, f"{problem}; {ASSIGNMENT_ALLOWED}")
        path = tuple(key.split("."))
        for other, first in given.items():
            if path[:len(other)] == other or other[:len(path)] == path:
                twice = "given twice" if path == other else f"overlaps {'.'.join(other)}, also given"
                raise ConfigError(source, key, text, f"{twice} ({first!r}, then {text!r}); give each field once")
        given[path] = text
        node = data
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = _load(value_text, source, key, text, flow_only=True)
    return data


def _record(value: Any, origins: dict, source: str, prefix: str) -> None:
    """Every key of a section set as a whole comes from `source` too (so a later file's sibling keys do not hide it)."""
    if isinstance(value, dict):
        for key, item in value.items():
            origins[f"{prefix}{key}"] = source
            _record(item, origins, source, f"{prefix}{key}.")


def _source_of(origins: dict, dotted: str, default: str) -> str:
    while dotted:
        if dotted in origins:
            return origins[dotted]
        dotted = dotted.rpartition(".")[0]
    return default


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is int:
        return "an integer such as 5_000_000 or 10e6 (no decimal point)"
    if tp is float:
        return "a number such as 6e-5 or 0.1"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is list:
        return "a list of " + _describe(typing.get_args(tp)[0]).removeprefix("a ")
    if origin is dict:
        return "a mapping of names to " + _describe(typing.get_args(tp)[1]).removeprefix("a ")
    if dataclasses.is_dataclass(tp):
        return "a mapping with keys " + ", ".join(_public_fields(tp))
    return str(tp)


def _public_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


def _coerce(tp: Any, value: Any, dotted: str, origins: dict, default_source: str, text: str = PLAIN) -> Any:
    def fail(allowed: str | None = None) -> ConfigError:
        return ConfigError(_source_of(origins, dotted, default_source), dotted, value, allowed or f"expected {_describe(tp)}")

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, dotted, origins, default_source, text)
    if value is None:
        raise fail(f"a value is required: expected {_describe(tp)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail()
    if tp is int:
        number = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and _INT_TEXT.fullmatch(value.strip()):
            mantissa, _, exponent = value.strip().replace("_", "").lower().partition("e")
            if len(mantissa) > 20 or len(exponent) > 2 or int(exponent or 0) > 19:  # 1e100000000 never gets computed
                raise fail(f"an integer of at most {len(str(MAX_INT))} digits (|value| <= {MAX_INT})")
            number = int(mantissa) * 10 ** int(exponent or 0)
        if number is None:
            raise fail()
        if abs(number) > MAX_INT:
            raise fail(f"an integer of at most {len(str(MAX_INT))} digits (|value| <= {MAX_INT})")
        return number
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if abs(value) < 1e308 else math.inf
        elif isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            number = float(value.strip().replace("_", ""))
        if number is None:
            raise fail()
        if not math.isfinite(number):
            raise fail("a finite number (not .inf, .nan or beyond 1e308)")
        return number
    if tp is str:
        if isinstance(value, str):
            bad = control_character(value, text)
            if bad is not None:
                raise fail(f"{bad}; {control_allowed(text)}")
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise fail()
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed and type(value) in {type(a) for a in allowed}:
            return value
        raise fail()
    if origin is list:
        if not isinstance(value, list):
            raise fail()
        (item_tp,) = typing.get_args(tp)
        return [_coerce(item_tp, item, f"{dotted}[{i}]", origins, default_source, text) for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise fail()
        key_tp, item_tp = typing.get_args(tp)
        return {_coerce(key_tp, key, f"{dotted} (key {key!r})", origins, default_source, text):
                _coerce(item_tp, item, f"{dotted}.{key}", origins, default_source, text) for key, item in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise fail()
        return build(tp, value, dotted, origins, default_source)
    raise TypeError(f"unsupported config type {tp!r} at {dotted}")


def build(cls: type, data: dict, prefix: str, origins: dict, default_source: str) -> Any:
    hints = typing.get_type_hints(cls)
    valid = _public_fields(cls)
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in valid:
            raise ConfigError(_source_of(origins, dotted, default_source), dotted, value,
                              f"unknown key; valid keys{' of ' + prefix if prefix else ''}: {', '.join(valid)}")
        text = next(f.metadata.get("text", PLAIN) for f in dataclasses.fields(cls) if f.name == key)
        kwargs[key] = _coerce(hints[key], value, dotted, origins, default_source, text)
        bounds = next(f.metadata.get("bounds") for f in dataclasses.fields(cls) if f.name == key)
        if bounds and kwargs[key] is not None:
            # A mapping's bounds hold for each of its values (eval.alert_drop: a margin per metric), and for each
            # value of a mapping of mappings (eval.references: model -> metric -> value).
            for name, number, written in _bounded_values(kwargs[key], value):
                if not _within(number, bounds):
                    where = dotted if name is None else f"{dotted}.{name}"
                    raise ConfigError(_source_of(origins, where, default_source), where, written, bounds_text(bounds))
        charset = next(f.metadata.get("charset") for f in dataclasses.fields(cls) if f.name == key)
        refused = check_charset(charset, kwargs[key]) if charset and kwargs[key] is not None else None
        if refused is not None:
            raise ConfigError(_source_of(origins, dotted, default_source), dotted, value, refused)
    for f in dataclasses.fields(cls):
        if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            dotted = f"{prefix}.{f.name}" if prefix else f.name
            raise ConfigError(default_source, dotted, None, f"required: {f.metadata.get('doc', '')} ({_describe(hints[f.name])})")
    return cls(**kwargs)


def _bounded_values(value: Any, written: Any, name: str | None = None) -> Iterator[tuple[str | None, float, Any]]:
    """(dotted name under the field, number, as written) of each number a field holds: itself, or each value of its
    mapping, however deep."""
    if not isinstance(value, dict):
        yield name, value, written
        return
    raw = list(written.values()) if isinstance(written, dict) and len(written) == len(value) else list(value.values())
    for (key, item), as_written in zip(value.items(), raw):  # in the file's order (a key may be coerced: 5 -> "5")
        yield from _bounded_values(item, as_written, key if name is None else f"{name}.{key}")


def _within(value: float, bounds: dict[str, float]) -> bool:
    """Whether `value` meets every bound that is set (and only those: `value + 1` is `value` past 2**53)."""
    checks = {"at_least": lambda b: value >= b, "above": lambda b: value > b,
              "below": lambda b: value < b, "at_most": lambda b: value <= b}
    return all(checks[kind](bound) for kind, bound in bounds.items())


def bounds_text(bounds: dict[str, float]) -> str:
    """What a field's bounds allow, in words: 'must be in [1, 65,536)', 'must be in (0, 1]', 'must be at least 1'."""
    low = ("[", bounds["at_least"]) if "at_least" in bounds else ("(", bounds["above"]) if "above" in bounds else None
    high = (")", bounds["below"]) if "below" in bounds else ("]", bounds["at_most"]) if "at_most" in bounds else None
    if low and high:
        return f"must be in {low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}"
    if low:
        return f"must be {'at least' if low[0] == '[' else 'above'} {_num(low[1])}"
    if high:
        return f"must be {'below' if high[0] == ')' else 'at most'} {_num(high[1])}"
    return "any number"


def _num(x: float) -> str:
    """A bound as people read it: 65,536 or 4,194,304, 0.5 or 1e-08."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e18 else f"{x:g}"
