/* What the files of the C accelerator (collector/_speedups_src/) share: see module.c for which
 * file holds what. Only PyInit__speedups is exported from the built module (setup.py builds with
 * -fvisibility=hidden), so these names stay inside it. */
#ifndef SHAPEWATCH_SPEEDUPS_H
#define SHAPEWATCH_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <stdint.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "rules.h"

/* The module's state (multi-phase init: each module object has its own, freed with it): the
 * accepted range of ts, set by set_ts_range, and the Python objects the functions use, made
 * once when the module starts. What stays static is constant for the process: byte-class
 * tables, log(gamma), the datetime C API, the Acc type. */
typedef struct {
    /* [ts_min_us, ts_end_us) in microseconds since the epoch: set by set_ts_range from
     * envelope.py, which defines it. Until then it is empty, so every ts is declined (the
     * reference then decides): forgetting to set it costs speed, never a wrong answer. */
    int64_t ts_min_us, ts_end_us;
    PyObject *key_objs[NKEYS];  /* the known fields' names, interned */
    PyObject *str_default;      /* DEFAULT_CONTRACT */
    PyObject *b2_new;           /* hashlib.blake2b */
    PyObject *b2_kwnames;       /* ("digest_size",) */
    PyObject *b2_sizes[2];      /* 8 and 16 */
    PyObject *str_hexdigest;
} speedups_state;

static inline speedups_state *get_state(PyObject *module) {
    return (speedups_state *)PyModule_GetState(module);
}

/* Reading JSON text, the steps every reader here shares (the scanner, Acc.add_json's reader,
 * count_keys, item_spans): JSON's white space skipped, and a string's next quote or backslash
 * found, 16 bytes at a time where SSE2 is there. */
static inline const unsigned char *json_skip_ws(const unsigned char *p, const unsigned char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

static inline const unsigned char *json_quote_or_backslash(const unsigned char *p, const unsigned char *end) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        int mask = _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
        if (mask) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < end && *p != '"' && *p != '\\') p++;
    return p;
}

/* The end of the string whose opening quote is at p[-1]: just past its closing quote, its
 * escapes stepped over; NULL when it does not close. */
static inline const unsigned char *json_string_end(const unsigned char *p, const unsigned char *end) {
    for (;;) {
        p = json_quote_or_backslash(p, end);
        if (p >= end) return NULL;
        if (*p == '"') return p + 1;
        p += 2; /* a backslash escapes the next character */
    }
}

/* json.c: the envelope scanner's tokenizer */
typedef struct {
    const unsigned char *p, *end;
    int ws;  /* white space was skipped inside the output: its canonical text must be compacted */
    int unsorted;  /* an object's keys were not in order: w differs from the canonical text */
    /* The output's text as written with the keys of every object in order (what orjson.dumps
     * makes of it with OPT_SORT_KEYS: the payload hash covers that, so that a retry whose keys
     * come in another order is the same payload), at w[0..wo), written as it is read: the
     * members of an object whose keys are out of order are moved into order through tmp. Both
     * have room for the output's text. */
    char *w, *tmp;
    Py_ssize_t wo;
    Py_ssize_t max_depth, max_array, max_key, max_leaves, leaves;
} scan_t;

#define SC_NO (-1)   /* not the plain case: the reference path decides */
#define SC_ERR (-2)  /* an exception is set */

static inline int sc_ws(scan_t *s) {
    const unsigned char *p0 = s->p;
    s->p = json_skip_ws(s->p, s->end);
    return s->p != p0;
}
void sc_init_classes(void);
int sc_string(scan_t *s, const unsigned char **start, const unsigned char **stop, Py_ssize_t *chars,
              int allow_escapes);
int sc_container(scan_t *s, Py_ssize_t depth);
Py_ssize_t sc_compact(const unsigned char *p, Py_ssize_t n, char *out);
Py_ssize_t array_items(const unsigned char *p, Py_ssize_t len, Py_ssize_t max_items, Py_ssize_t **spans);
PyObject *py_count_keys(PyObject *self, PyObject *arg);
PyObject *py_item_spans(PyObject *self, PyObject *arg);

/* time.c */
int time_setup(void);
PyObject *parse_ts(const speedups_state *ms, PyObject *v, int64_t *epoch_us);
PyObject *py_set_ts_range(PyObject *self, PyObject *args);
PyObject *py_epoch_micros(PyObject *self, PyObject *args);
PyObject *py_bucket_starts(PyObject *self, PyObject *args);

/* envelope.c */
int envelope_setup(speedups_state *ms);
PyObject *py_walk(PyObject *self, PyObject *args);
PyObject *py_check_envelope(PyObject *self, PyObject *args);
PyObject *py_scan_envelope(PyObject *self, PyObject *args);
PyObject *py_scan_lines(PyObject *self, PyObject *args);
PyObject *py_scan_items(PyObject *self, PyObject *args);

/* rollup.c */
extern PyTypeObject AccType;
int rollup_setup(void);
PyObject *py_group_ids(PyObject *self, PyObject *args);

/* arrow.c */
PyObject *py_string_column(PyObject *self, PyObject *args);

#endif
