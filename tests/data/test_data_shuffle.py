"""The compiled shuffle (bigscience_ops/data/_shuffle.c) against numpy's RandomState.shuffle.

Same bytes, same RNG state afterwards, and the same draws from then on; its 64-bit draw path
(only reached by arrays over 2**32 entries) against a transcription of numpy's random_interval.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigscience_ops.data import _shuffle
from bigscience_ops.data import index_files as ixf
from bigscience_ops.data import index_mappings as im


def assert_same_rng(got: np.random.RandomState, want: np.random.RandomState) -> None:
    g, w = got.get_state(), want.get_state()
    assert g[0] == w[0] and g[2:] == w[2:], (g[0], g[2:], w[0], w[2:])
    assert np.array_equal(g[1], w[1])
    assert np.array_equal(got.randint(0, 2**32, 5, dtype=np.uint32), want.randint(0, 2**32, 5, dtype=np.uint32))
    assert got.standard_normal() == want.standard_normal()


def rng_pair(seed: int, warm: int) -> tuple[np.random.RandomState, np.random.RandomState]:
    """Two equal generators; `warm` draws first put pos mid-state, an odd count leaves a cached gauss."""
    pair = np.random.RandomState(seed), np.random.RandomState(seed)
    for rng in pair:
        rng.randint(0, 2**32, warm, dtype=np.uint32)
        if warm % 2:
            rng.standard_normal()
    return pair


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 64, 65, 1000, 2**16 + 3, 3_000_017])  # 64: the prefetch window
@pytest.mark.parametrize("seed,warm", [(0, 0), (1234, 7), (2**32 - 1, 700)])
def test_compiled_shuffle_equals_numpy(dtype, n, seed, warm):
    assert ixf._compiled is _shuffle  # else _shuffle below would be numpy's own
    mine, numpys = rng_pair(seed, warm)
    a = np.arange(n, dtype=dtype) * 3 + 1
    b = a.copy()
    ixf._shuffle(mine, a)
    numpys.shuffle(b)
    assert a.tobytes() == b.tobytes()
    assert_same_rng(mine, numpys)


@pytest.mark.parametrize("n", [0, 1, 2, 5, 2**16 + 3, 3_000_017])
def test_advance_leaves_the_state_of_a_real_shuffle(n):
    mine, numpys = rng_pair(99, 3)
    ixf._skip_shuffle(mine, n)
    numpys.shuffle(np.zeros(n, dtype=np.int8))
    assert_same_rng(mine, numpys)


def test_arrays_the_helper_cannot_take_fall_back_to_numpy():
    for make in (lambda: np.arange(1001, dtype=np.int16), lambda: np.arange(2002, dtype=np.int64)[::2]):
        mine, numpys = rng_pair(5, 1)
        a, b = make(), make()
        ixf._shuffle(mine, a)
        numpys.shuffle(b)
        assert np.array_equal(a, b)
        assert_same_rng(mine, numpys)


def test_helper_refuses_bad_arguments_naming_them():
    key = np.zeros(624, dtype=np.uint32)
    with pytest.raises(ValueError, match="4- or 8-byte items, got 1 dimensions of 2-byte"):
        _shuffle.shuffle(np.zeros(10, dtype=np.int16), key, 624)
    with pytest.raises(ValueError, match=r"624 uint32 values \(2496 bytes\), got 2492 bytes"):
        _shuffle.shuffle(np.zeros(10, dtype=np.int32), key[1:], 624)
    with pytest.raises(ValueError, match=r"pos must be in \[0, 624\], got 625"):
        _shuffle.advance(10, key, 625)
    frozen = np.zeros(10, dtype=np.int32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _shuffle.shuffle(frozen, key, 624)


# --- numpy's random_interval, transcribed, fed by the generator's raw 32-bit outputs ------------

def raw32(rng: np.random.RandomState) -> int:
    """One MT19937 output: a full-range uint32 randint is next_uint32 itself."""
    return int(rng.randint(0, 2**32, dtype=np.uint32))


def random_interval(rng: np.random.RandomState, max_: int) -> int:
    """numpy/random/src/distributions/distributions.c random_interval; MT19937's next_uint64 is
    the first 32-bit output shifted up, or'ed with the second (mt19937.h mt19937_next64)."""
    if max_ == 0:
        return 0
    mask = max_
    for shift in (1, 2, 4, 8, 16, 32):
        mask |= mask >> shift
    while True:
        value = (raw32(rng) if max_ <= 0xFFFFFFFF else raw32(rng) << 32 | raw32(rng)) & mask
        if value <= max_:
            return value


def test_transcription_matches_numpy():
    # The reference itself: its 32-bit path reproduces numpy's shuffle, and the 64-bit word is
    # numpy's own next_uint64 (a full-range uint64 randint returns it unchanged).
    ref, numpys = rng_pair(11, 0)
    a = list(range(5000))
    for i in reversed(range(1, len(a))):
        j = random_interval(ref, i)
        a[i], a[j] = a[j], a[i]
    b = np.arange(5000)
    numpys.shuffle(b)
    assert a == b.tolist()
    words = [raw32(ref) << 32 | raw32(ref) for _ in range(4)]
    assert words == [int(numpys.randint(0, 2**64, dtype=np.uint64)) for _ in range(4)]


@pytest.mark.parametrize("max_", [0, 1, 6, 2**32 - 1, 2**32, 2**32 + 5, 3 * 2**33 + 1, 2**40 + 123,
                                  2**63 + 1, 2**64 - 1])
def test_interval_equals_transcription_in_both_branches(max_):
    ref, mine = rng_pair(2024, 5)
    name, key, pos, has_gauss, gauss = mine.get_state()
    key = np.array(key, dtype=np.uint32)
    got = []
    for _ in range(700):  # crosses a state regeneration (every 624 outputs)
        value, pos = _shuffle.interval(max_, key, pos)
        got.append(value)
    mine.set_state((name, key, pos, has_gauss, gauss))
    assert got == [random_interval(ref, max_) for _ in range(700)]
    assert all(v <= max_ for v in got) and (max_ < 2 or len(set(got)) > 1)
    assert_same_rng(mine, ref)


# --- the index build with and without the helper ---------------------------------------------

def test_index_files_without_helper_are_the_same_bytes_and_say_so_once(tmp_path, monkeypatch, capsys):
    sizes = np.random.default_rng(1).integers(1, 300, 500, dtype=np.int32)
    args = (sizes, 100, 400, 1500, 32, 7)  # several epochs, the last one shuffled separately
    assert im.index_plan(*args[:5])[2]
    compiled = tuple(tmp_path / f"c_{n}.npy" for n in ("doc", "sample", "shuffle"))
    ixf.write_index_mappings(*args, compiled)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(ixf, "_compiled", None)
    monkeypatch.setattr(ixf, "_told_fallback", False)
    for attempt in range(2):
        plain = tuple(tmp_path / f"n{attempt}_{n}.npy" for n in ("doc", "sample", "shuffle"))
        ixf.write_index_mappings(*args, plain)
        for c, p in zip(compiled, plain):
            assert c.read_bytes() == p.read_bytes(), p.name
    err = capsys.readouterr().err
    assert err.count("the compiled shuffle helper") == 1 and "numpy's shuffle (same bytes" in err, err
