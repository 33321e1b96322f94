/* numpy's legacy RandomState.shuffle of a 1-D contiguous array, with the same draws and result.
 *
 * RandomState.shuffle (numpy/random/mtrand.pyx, _shuffle_raw) is Fisher-Yates:
 *     for i in reversed(range(1, n)): j = random_interval(bitgen, i); swap(a[i], a[j])
 * with random_interval from numpy/random/src/distributions/distributions.c and MT19937 from
 * numpy/random/src/mt19937/mt19937.{c,h}; both are transcribed below. At hundreds of millions of
 * entries numpy's loop waits on a cache miss at every a[j]. The j's depend only on i and the RNG,
 * never on the data, so this loop draws them WINDOW steps ahead and prefetches a[j]; the swaps
 * still happen strictly in numpy's order, so the result never depends on the prefetch.
 *
 * The MT19937 state travels as numpy's RandomState.get_state() holds it: key (624 uint32, updated
 * in place) and pos (passed in, returned). index_files.py reads it from, and writes it back to,
 * the RandomState, so the same generator goes on exactly as after numpy's own shuffle.
 *
 *   shuffle(array, key, pos) -> pos     array: writable C-contiguous 1-D buffer of 4- or 8-byte items
 *   advance(n, key, pos) -> pos         the draws of a shuffle of n items, with no array
 *   interval(max, key, pos) -> (j, pos) one random_interval(max) draw (a test hook: max > 2**32 too)
 *
 * All three release the GIL while they run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MT_N 624
#define MT_M 397
#define MATRIX_A 0x9908b0dfUL
#define UPPER_MASK 0x80000000UL
#define LOWER_MASK 0x7fffffffUL
/* Draws ahead of the swap, a power of two. 210M int32 here: 3.7 s at 8, 2.0 s at 32, 1.75 s at 64,
 * 1.85 s at 128. */
#define WINDOW 64

typedef struct {
    uint32_t key[MT_N];
    int pos;
} mt_state;

/* mt19937.c: mt19937_gen */
static void mt_gen(mt_state *st) {
    uint32_t y;
    int i;
    for (i = 0; i < MT_N - MT_M; i++) {
        y = (st->key[i] & UPPER_MASK) | (st->key[i + 1] & LOWER_MASK);
        st->key[i] = st->key[i + MT_M] ^ (y >> 1) ^ (-(y & 1) & MATRIX_A);
    }
    for (; i < MT_N - 1; i++) {
        y = (st->key[i] & UPPER_MASK) | (st->key[i + 1] & LOWER_MASK);
        st->key[i] = st->key[i + (MT_M - MT_N)] ^ (y >> 1) ^ (-(y & 1) & MATRIX_A);
    }
    y = (st->key[MT_N - 1] & UPPER_MASK) | (st->key[0] & LOWER_MASK);
    st->key[MT_N - 1] = st->key[MT_M - 1] ^ (y >> 1) ^ (-(y & 1) & MATRIX_A);
    st->pos = 0;
}

/* mt19937.h: mt19937_next */
static inline uint32_t mt_next32(mt_state *st) {
    uint32_t y;
    if (st->pos == MT_N) {
        mt_gen(st);
    }
    y = st->key[st->pos++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680UL;
    y ^= (y << 15) & 0xefc60000UL;
    y ^= (y >> 18);
    return y;
}

/* mt19937.h: mt19937_next64 is `(uint64_t)next << 32 | next`; the first draw is the high word. */
static inline uint64_t mt_next64(mt_state *st) {
    uint64_t hi = mt_next32(st);
    return hi << 32 | mt_next32(st);
}

/* distributions.c: random_interval (the legacy bounded draw RandomState.shuffle uses) */
static inline uint64_t random_interval(mt_state *st, uint64_t max) {
    uint64_t mask, value;
    if (max == 0) {
        return 0;
    }
    mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    if (max <= 0xffffffffUL) {
        while ((value = (mt_next32(st) & mask)) > max)
            ;
    } else {
        while ((value = (mt_next64(st) & mask)) > max)
            ;
    }
    return value;
}

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p), 1, 0)
#else
#define PREFETCH(p) ((void)(p))
#endif

/* Fisher-Yates in numpy's order; js[] holds the draws for the next WINDOW values of i. */
#define SHUFFLE_BODY(T)                                                          \
    {                                                                            \
        T *a = (T *)data;                                                        \
        uint64_t js[WINDOW];                                                     \
        uint64_t i, t, ahead = n - 1 < WINDOW ? n - 1 : WINDOW;                  \
        for (t = 0; t < ahead; t++) {                                            \
            js[t] = random_interval(st, n - 1 - t);                              \
            PREFETCH(&a[js[t]]);                                                 \
        }                                                                        \
        for (i = n - 1, t = 0; i >= 1; i--, t++) {                               \
            uint64_t j = js[t % WINDOW];                                         \
            T tmp;                                                               \
            if (i > WINDOW) { /* the draw for i - WINDOW, which comes next */    \
                uint64_t k = random_interval(st, i - WINDOW);                    \
                js[t % WINDOW] = k;                                              \
                PREFETCH(&a[k]);                                                 \
            }                                                                    \
            tmp = a[j];                                                          \
            a[j] = a[i];                                                         \
            a[i] = tmp;                                                          \
        }                                                                        \
    }

static void shuffle_raw(mt_state *st, char *data, uint64_t n, Py_ssize_t itemsize) {
    if (n < 2) {
        return;
    }
    if (itemsize == 4) {
        SHUFFLE_BODY(uint32_t)
    } else {
        SHUFFLE_BODY(uint64_t)
    }
}

static void advance_raw(mt_state *st, uint64_t n) {
    uint64_t i;
    for (i = n - 1; n >= 2 && i >= 1; i--) {
        (void)random_interval(st, i);
    }
}

/* key: a writable buffer of 624 4-byte items; pos in [0, 624]. */
static int load_state(PyObject *key, Py_ssize_t pos, Py_buffer *view, mt_state *st) {
    if (PyObject_GetBuffer(key, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view->len != (Py_ssize_t)sizeof(st->key)) {
        PyErr_Format(PyExc_ValueError,
                     "MT19937 key must be %d uint32 values (%d bytes), got %zd bytes",
                     MT_N, (int)sizeof(st->key), view->len);
        PyBuffer_Release(view);
        return -1;
    }
    if (pos < 0 || pos > MT_N) {
        PyErr_Format(PyExc_ValueError, "MT19937 pos must be in [0, %d], got %zd", MT_N, pos);
        PyBuffer_Release(view);
        return -1;
    }
    memcpy(st->key, view->buf, sizeof(st->key));
    st->pos = (int)pos;
    return 0;
}

static PyObject *store_state(Py_buffer *view, mt_state *st) {
    memcpy(view->buf, st->key, sizeof(st->key));
    PyBuffer_Release(view);
    return PyLong_FromLong(st->pos);
}

static PyObject *py_shuffle(PyObject *self, PyObject *args) {
    PyObject *array, *key;
    Py_ssize_t pos;
    Py_buffer abuf, kbuf;
    mt_state st;
    uint64_t n;
    if (!PyArg_ParseTuple(args, "OOn:shuffle", &array, &key, &pos)) {
        return NULL;
    }
    if (PyObject_GetBuffer(array, &abuf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (abuf.ndim != 1 || (abuf.itemsize != 4 && abuf.itemsize != 8)) {
        PyErr_Format(PyExc_ValueError,
                     "shuffle needs a 1-D array of 4- or 8-byte items, got %d dimensions of %zd-byte items",
                     abuf.ndim, abuf.itemsize);
        PyBuffer_Release(&abuf);
        return NULL;
    }
    if (load_state(key, pos, &kbuf, &st) < 0) {
        PyBuffer_Release(&abuf);
        return NULL;
    }
    n = (uint64_t)(abuf.len / abuf.itemsize);
    Py_BEGIN_ALLOW_THREADS
    shuffle_raw(&st, (char *)abuf.buf, n, abuf.itemsize);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&abuf);
    return store_state(&kbuf, &st);
}

static PyObject *py_advance(PyObject *self, PyObject *args) {
    PyObject *key;
    Py_ssize_t pos;
    unsigned long long n;
    Py_buffer kbuf;
    mt_state st;
    if (!PyArg_ParseTuple(args, "KOn:advance", &n, &key, &pos)) {
        return NULL;
    }
    if (load_state(key, pos, &kbuf, &st) < 0) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    advance_raw(&st, (uint64_t)n);
    Py_END_ALLOW_THREADS
    return store_state(&kbuf, &st);
}

static PyObject *py_interval(PyObject *self, PyObject *args) {
    PyObject *key, *new_pos;
    Py_ssize_t pos;
    unsigned long long max;
    uint64_t value;
    Py_buffer kbuf;
    mt_state st;
    if (!PyArg_ParseTuple(args, "KOn:interval", &max, &key, &pos)) {
        return NULL;
    }
    if (load_state(key, pos, &kbuf, &st) < 0) {
        return NULL;
    }
    value = random_interval(&st, (uint64_t)max);
    new_pos = store_state(&kbuf, &st);
    if (new_pos == NULL) {
        return NULL;
    }
    return Py_BuildValue("(KN)", (unsigned long long)value, new_pos);
}

static PyMethodDef methods[] = {
    {"shuffle", py_shuffle, METH_VARARGS,
     "shuffle(array, key, pos) -> pos: numpy RandomState.shuffle of a 1-D contiguous array of 4- or "
     "8-byte items, from the MT19937 state (key: 624 uint32, updated in place; pos)."},
    {"advance", py_advance, METH_VARARGS,
     "advance(n, key, pos) -> pos: the MT19937 state after shuffling n items, with no array."},
    {"interval", py_interval, METH_VARARGS,
     "interval(max, key, pos) -> (value, pos): numpy's legacy random_interval(max), for tests."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_shuffle",
    "numpy's legacy RandomState.shuffle with software prefetch (same draws, same result).", -1, methods,
};

PyMODINIT_FUNC PyInit__shuffle(void) { return PyModule_Create(&module); }
