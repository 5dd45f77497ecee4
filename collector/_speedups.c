/* Fast paths for the envelope validator (collector/envelope.py).
 *
 * Both functions only ever answer "fine, here are the counts" or "look closer":
 * every error message comes from the Python walk in envelope.py, which is the
 * single definition of the rules. These exist because a Python-level walk
 * costs several microseconds per output, more than orjson's parse itself, and
 * bulk import must run within a few times the parse floor.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <stdint.h>
#include <structmember.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* walk(obj, max_depth, max_array, max_key, max_leaves) -> (keys, leaves, huge) | None
 * None means: a limit is crossed or a value is of an unexpected kind; the Python
 * walk must run to name the field. `huge` is 1 when a float that may be a
 * rounded huge integer literal was seen. */
typedef struct {
    Py_ssize_t max_depth, max_array, max_key, max_leaves;
    Py_ssize_t keys, leaves;
    int huge;
} walk_state;

static int walk_value(PyObject *v, Py_ssize_t depth, walk_state *st);

static inline int walk_item(PyObject *x, Py_ssize_t depth, walk_state *st) {
    if (PyDict_CheckExact(x) || PyList_CheckExact(x))
        return walk_value(x, depth + 1, st);
    if (PyFloat_CheckExact(x)) {
        double d = PyFloat_AS_DOUBLE(x);
        if (!isfinite(d)) return -1; /* NaN or infinity: the Python walk names it */
        if (d >= 9.2e18 || d <= -9.2e18) st->huge = 1;
    } else if (!(PyUnicode_CheckExact(x) || PyLong_CheckExact(x) || PyBool_Check(x) || x == Py_None)) {
        return -1;
    }
    st->leaves++;
    return 0;
}

static int walk_value(PyObject *v, Py_ssize_t depth, walk_state *st) {
    if (depth > st->max_depth) return -1;
    if (PyDict_CheckExact(v)) {
        Py_ssize_t pos = 0;
        PyObject *k, *x;
        st->keys += PyDict_GET_SIZE(v);
        while (PyDict_Next(v, &pos, &k, &x)) {
            if (!PyUnicode_CheckExact(k) || PyUnicode_GET_LENGTH(k) > st->max_key) return -1;
            if (walk_item(x, depth, st) < 0) return -1;
        }
    } else if (PyList_CheckExact(v)) {
        Py_ssize_t n = PyList_GET_SIZE(v);
        if (n > st->max_array) return -1;
        for (Py_ssize_t i = 0; i < n; i++)
            if (walk_item(PyList_GET_ITEM(v, i), depth, st) < 0) return -1;
    } else {
        return -1;
    }
    if (st->leaves > st->max_leaves) return -1;
    return 0;
}

static PyObject *py_walk(PyObject *self, PyObject *args) {
    PyObject *obj;
    walk_state st = {0};
    if (!PyArg_ParseTuple(args, "Onnnn", &obj, &st.max_depth, &st.max_array, &st.max_key, &st.max_leaves))
        return NULL;
    if (walk_value(obj, 1, &st) < 0) Py_RETURN_NONE;
    return Py_BuildValue("nni", st.keys, st.leaves, st.huge);
}

/* count_keys(raw: bytes) -> int
 * The number of object keys in JSON text that orjson already accepted: string tokens
 * followed (after optional blanks) by a colon. Strings are skipped with their escapes,
 * so quotes and colons inside values never count. Compared with the keys orjson kept,
 * a difference means a duplicate key was merged. */
static PyObject *py_count_keys(PyObject *self, PyObject *arg) {
    char *buf;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(arg, &buf, &len) < 0) return NULL;
    const char *p = buf, *end = buf + len;
    long count = 0;
    while (p < end) {
        const char *q = memchr(p, '"', (size_t)(end - p));
        if (q == NULL) break;
        /* inside a string: find its closing quote, stepping over escapes */
        const char *r = q + 1;
        for (;;) {
            const char *e = r;
            while (e < end && *e != '"' && *e != '\\') e++;
            if (e >= end) { r = end; break; }
            if (*e == '"') { r = e + 1; break; }
            r = (end - e > 2) ? e + 2 : end; /* a backslash escapes the next character */
        }
        while (r < end && (*r == ' ' || *r == '\t' || *r == '\n' || *r == '\r')) r++;
        if (r < end && *r == ':') count++;
        p = r;
    }
    return PyLong_FromLong(count);
}

/* item_spans(raw: bytes) -> list[tuple[int, int]] | None: the [start, end) byte offsets of
 * each item of a JSON array body (whitespace around an item left out), or None when the text
 * is not an array whose brackets and strings close. Used only to re-parse the items one by one
 * when the whole body cannot be re-parsed (envelope.parse_body); the items were parsed by orjson
 * already, so this only has to find where each starts and ends. */
static PyObject *py_item_spans(PyObject *self, PyObject *arg) {
    char *buf;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(arg, &buf, &len) < 0) return NULL;
    Py_ssize_t i = 0, depth = 0, start = -1, last = -1;
    while (i < len && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r')) i++;
    if (i >= len || buf[i] != '[') Py_RETURN_NONE;
    PyObject *spans = PyList_New(0);
    if (spans == NULL) return NULL;
    depth = 1;
    for (i++; i < len; i++) {
        char c = buf[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
        if (depth == 1 && (c == ',' || c == ']')) {
            if (start >= 0) {
                PyObject *span = Py_BuildValue("(nn)", start, last + 1);
                if (span == NULL || PyList_Append(spans, span) < 0) { Py_XDECREF(span); Py_DECREF(spans); return NULL; }
                Py_DECREF(span);
                start = -1;
            }
            if (c == ']') { depth = 0; break; }
            continue;
        }
        if (start < 0) start = i;
        if (c == '"') {
            for (i++; i < len && buf[i] != '"'; i++)
                if (buf[i] == '\\') i++;
            if (i >= len) break;
        } else if (c == '[' || c == '{') {
            depth++;
        } else if (c == ']' || c == '}') {
            depth--;
        }
        last = i;
    }
    if (depth != 0) { Py_DECREF(spans); Py_RETURN_NONE; }
    return spans;
}

/* ---------------------------------------------------------------------------------------
 * check_envelope(obj, max_tag, max_depth, max_array, max_key, max_leaves) -> tuple | None
 *
 * The common case of envelope.validate_envelope in one call: a dict with known fields
 * only, every tag a short string with a non-blank character and no NUL, no attributes,
 * `ts` absent or in the RFC 3339 form `YYYY-MM-DDTHH:MM:SS[.f{1,6}](Z|+HH:MM|-HH:MM)`,
 * and an output object within the limits. It answers
 *   (event_id | None, ts | None, model, prompt_version, contract | None, served_model,
 *    contract_version, source, run_id, agent_release, finish_reason, output, keys, huge)
 * with ts as an aware UTC datetime, or None for anything else: the Python validator then
 * runs and names every fault. So this never decides that an envelope is wrong; it only
 * recognises, exactly as the Python rules would, one that is right. A test holds the two
 * to the same answers.
 * ------------------------------------------------------------------------------------- */

#include <datetime.h>

/* The envelope rules the C paths apply, each stated here once. Their definitions are the Python
 * ones (envelope.py, ingest.py, rollup.py): tests/collector/test_speedups_rules.py reads these
 * lines and holds them to those, so that a rule changed in Python and not here fails a test
 * instead of letting the fast path accept what the reference refuses. */
enum { K_EVENT_ID, K_TS, K_MODEL, K_PROMPT_VERSION, K_CONTRACT, K_SERVED_MODEL, K_CONTRACT_VERSION,
       K_SOURCE, K_RUN_ID, K_AGENT_RELEASE, K_FINISH_REASON, K_OUTPUT, K_ATTRIBUTES, NKEYS };
/* the known fields (envelope._KNOWN), in the order of the K_ names */
static const char *key_names[NKEYS] = {"event_id", "ts", "model", "prompt_version", "contract", "served_model",
    "contract_version", "source", "run_id", "agent_release", "finish_reason", "output", "attributes"};
static PyObject *key_objs[NKEYS];
static const char *sources[] = {"production", "probe", "shadow"}; /* envelope.SOURCES */
#define EVENT_ID_MAX 128            /* characters of a client's event_id */
#define DEFAULT_CONTRACT "default"  /* the contract of an envelope that names none */
#define PAYLOAD_DIGEST_SIZE 16      /* envelope.payload_hash: blake2b(digest_size=16) */
#define LINE_ID_DIGEST_SIZE 8       /* ingest._line_id: blake2b(line, digest_size=8) */
#define LINE_ID_FORMAT "%U:%zd:%U"  /* ingest._line_id: f"{prefix}:{n}:{hexdigest}" */
#define ENVELOPE_ITEMS 16           /* the fields of envelope.Envelope, built by scan_lines */
/* Numbers orjson writes back exactly as they were read (its float format is repr's shortest
 * round trip): the scanner takes only these and declines any other literal. */
#define FLOAT_MAX_DIGITS 15         /* significant digits: sys.float_info.dig, all a double keeps */
#define FLOAT_MAX_LEADING_ZEROS 3   /* 0.0001 comes back as such (orjson turns to an exponent
                                     * below 1e-5; taking fewer than it could is only slower) */
#define INT_MAX_DIGITS 18           /* any such integer is an int64, written as it is */

/* A tag the Python rule (envelope._tag) accepts: str, 1..max characters, no NUL, not only
 * white space (str.isspace is Py_UNICODE_ISSPACE over every character). */
static int good_tag(PyObject *v, Py_ssize_t max_tag) {
    if (!PyUnicode_CheckExact(v)) return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(v);
    if (n == 0 || n > max_tag) return 0;
    if (PyUnicode_FindChar(v, 0, 0, n, 1) != -1) return 0;
    int kind = PyUnicode_KIND(v);
    const void *data = PyUnicode_DATA(v);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, i))) return 1;
    return 0;
}

static int digits(const char *s, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static int64_t days_from_civil(int64_t y, int m, int d) { /* days since 1970-01-01 (H. Hinnant) */
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static void civil_from_days(int64_t z, int *y, int *m, int *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = (int)(yoe + era * 400 + (*m <= 2));
}

/* The accepted range of ts, [ts_min_us, ts_end_us) in microseconds since the epoch: set by
 * set_ts_range from envelope.py, which defines it. Until then it is empty, so every ts is
 * declined (the reference then decides): forgetting to set it costs speed, never a wrong answer. */
static int64_t ts_min_us = 0, ts_end_us = 0;

static PyObject *py_set_ts_range(PyObject *self, PyObject *args) {
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "LL", &lo, &hi)) return NULL;
    if (lo < 0) {  /* scan_core writes ts_us for the payload hash as an unsigned number */
        PyErr_SetString(PyExc_ValueError, "the range of ts must start at or after the epoch");
        return NULL;
    }
    ts_min_us = lo;
    ts_end_us = hi;
    Py_RETURN_NONE;
}

/* The UTC datetime of an RFC 3339 timestamp, and its microseconds since the epoch in *epoch_us
 * (when not NULL), or NULL without an exception when the text is in any other form or names a
 * time outside the accepted range (datetime.fromisoformat, the reference, then decides). */
static PyObject *parse_ts(PyObject *v, int64_t *epoch_us) {
    static const int dim[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (!PyUnicode_CheckExact(v) || !PyUnicode_IS_ASCII(v)) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(v);
    const char *s = (const char *)PyUnicode_1BYTE_DATA(v);
    if (n < 20 || n > 32) return NULL;
    if (s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't') || s[13] != ':' || s[16] != ':') return NULL;
    int y = digits(s, 4), mo = digits(s + 5, 2), d = digits(s + 8, 2);
    int h = digits(s + 11, 2), mi = digits(s + 14, 2), se = digits(s + 17, 2);
    if (y < 1000 || y > 9998 || mo < 1 || mo > 12 || d < 1 || h < 0 || h > 23 || mi < 0 || mi > 59 || se < 0 || se > 59)
        return NULL;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (d > dim[mo - 1] + (mo == 2 && leap)) return NULL;
    Py_ssize_t i = 19;
    int us = 0;
    if (s[i] == '.') {
        int nd = 0;
        i++;
        while (i < n && s[i] >= '0' && s[i] <= '9' && nd < 7) { us = us * 10 + (s[i] - '0'); i++; nd++; }
        if (nd == 0 || nd > 6) return NULL;
        for (; nd < 6; nd++) us *= 10;
    }
    int off = 0; /* minutes east of UTC */
    if (i == n - 1 && (s[i] == 'Z' || s[i] == 'z')) {
        off = 0;
    } else if (i == n - 6 && (s[i] == '+' || s[i] == '-') && s[i + 3] == ':') {
        int oh = digits(s + i + 1, 2), om = digits(s + i + 4, 2);
        if (oh < 0 || oh > 23 || om < 0 || om > 59) return NULL;
        off = (oh * 60 + om) * (s[i] == '-' ? -1 : 1);
    } else {
        return NULL;
    }
    int64_t secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se - (int64_t)off * 60;
    int64_t at_us = secs * 1000000 + us;
    if (at_us < ts_min_us || at_us >= ts_end_us) return NULL;
    if (epoch_us != NULL) *epoch_us = at_us;
    int64_t days = secs >= 0 ? secs / 86400 : -((-secs + 86399) / 86400);
    int64_t rest = secs - days * 86400;
    int uy, um, ud;
    civil_from_days(days, &uy, &um, &ud);
    return PyDateTimeAPI->DateTime_FromDateAndTime(uy, um, ud, (int)(rest / 3600), (int)(rest % 3600 / 60),
                                                   (int)(rest % 60), us, PyDateTime_TimeZone_UTC,
                                                   PyDateTimeAPI->DateTimeType);
}

/* The fields of an envelope other than output, ts and attributes (val[k]: the value of key k,
 * NULL when absent or null) as the Python rules accept them plainly: model and prompt_version
 * present, every tag good, source one of the known ones, event_id a non-blank str of at most
 * EVENT_ID_MAX characters. Shared by check_envelope and scan_envelope. */
static int plain_fields(PyObject **val, Py_ssize_t max_tag) {
    if (val[K_MODEL] == NULL || !good_tag(val[K_MODEL], max_tag)) return 0;
    if (val[K_PROMPT_VERSION] == NULL || !good_tag(val[K_PROMPT_VERSION], max_tag)) return 0;
    static const int optional[] = {K_CONTRACT, K_SERVED_MODEL, K_CONTRACT_VERSION, K_SOURCE, K_RUN_ID,
                                   K_AGENT_RELEASE, K_FINISH_REASON};
    for (size_t j = 0; j < sizeof optional / sizeof optional[0]; j++) {
        PyObject *t = val[optional[j]];
        if (t != NULL && !good_tag(t, max_tag)) return 0;
    }
    if (val[K_SOURCE] != NULL) {
        int known = 0;
        for (size_t j = 0; j < sizeof sources / sizeof sources[0]; j++)
            if (PyUnicode_CompareWithASCIIString(val[K_SOURCE], sources[j]) == 0) known = 1;
        if (!known) return 0;
    }
    PyObject *id = val[K_EVENT_ID];
    if (id != NULL) {
        if (!PyUnicode_CheckExact(id) || PyUnicode_GET_LENGTH(id) > EVENT_ID_MAX) return 0;
        int kind = PyUnicode_KIND(id), blank = 1;
        const void *data = PyUnicode_DATA(id);
        for (Py_ssize_t i = 0; i < PyUnicode_GET_LENGTH(id) && blank; i++)
            if (!Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, i))) blank = 0;
        if (blank) return 0;
    }
    return 1;
}

static PyObject *py_check_envelope(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t max_tag;
    walk_state st = {0};
    if (!PyArg_ParseTuple(args, "Onnnnn", &obj, &max_tag, &st.max_depth, &st.max_array, &st.max_key,
                          &st.max_leaves))
        return NULL;
    if (!PyDict_CheckExact(obj)) Py_RETURN_NONE;
    PyObject *val[NKEYS];
    Py_ssize_t found = 0;
    for (int k = 0; k < NKEYS; k++) {
        val[k] = PyDict_GetItemWithError(obj, key_objs[k]); /* borrowed */
        if (val[k] == NULL && PyErr_Occurred()) return NULL;
        if (val[k] != NULL) found++;
        if (val[k] == Py_None && k != K_MODEL && k != K_PROMPT_VERSION && k != K_OUTPUT) val[k] = NULL;
    }
    if (found != PyDict_GET_SIZE(obj)) Py_RETURN_NONE; /* an unknown field */
    if (val[K_ATTRIBUTES] != NULL) Py_RETURN_NONE;
    if (!plain_fields(val, max_tag)) Py_RETURN_NONE;
    PyObject *id = val[K_EVENT_ID];
    PyObject *output = val[K_OUTPUT];
    if (output == NULL || !PyDict_CheckExact(output)) Py_RETURN_NONE;
    if (walk_value(output, 1, &st) < 0) Py_RETURN_NONE;
    PyObject *ts = NULL;
    if (val[K_TS] != NULL) {
        ts = parse_ts(val[K_TS], NULL);
        if (ts == NULL) {
            if (PyErr_Occurred()) return NULL;
            Py_RETURN_NONE;
        }
    }
#define OR_NONE(x) ((x) != NULL ? (x) : Py_None)
    PyObject *res = Py_BuildValue("(OOOOOOOOOOOOni)", OR_NONE(id), OR_NONE(ts), val[K_MODEL],
                                  val[K_PROMPT_VERSION], OR_NONE(val[K_CONTRACT]), OR_NONE(val[K_SERVED_MODEL]),
                                  OR_NONE(val[K_CONTRACT_VERSION]), OR_NONE(val[K_SOURCE]), OR_NONE(val[K_RUN_ID]),
                                  OR_NONE(val[K_AGENT_RELEASE]), OR_NONE(val[K_FINISH_REASON]), output,
                                  PyDict_GET_SIZE(obj) + st.keys, st.huge);
#undef OR_NONE
    Py_XDECREF(ts);
    return res;
}

/* ---------------------------------------------------------------------------------------
 * Accumulator: flattens parsed outputs into mergeable rollup counts.
 *
 * Acc(namer, max_value_length). add(output, group) walks one output (already
 * validated) and counts, per (group, path): presence, each JSON type, long
 * strings; per (group, path, short string), per (group, path, array length)
 * and per (group, path, number bin): occurrences. Paths are interned per
 * parent: children[parent + 1] is a dict key -> id (str keys carry their hash,
 * so no tuple is built per node) and items[parent + 1] the id of the parent's
 * array items; parent -1 is the output itself. On a miss `namer(parent_id, key)`
 * (Python, which owns the path syntax and escaping; key None for items) returns
 * the new id. The reference definition of all of this is flatten.flatten_output
 * (and rollup.number_bin for numbers); tests hold the two to each other.
 * ------------------------------------------------------------------------------------- */

enum { C_PRESENT, C_NULL, C_BOOLEAN, C_INTEGER, C_NUMBER, C_STRING, C_ARRAY, C_OBJECT, C_LONG, NCOUNT };

typedef struct {
    Py_ssize_t *slot_of_path; /* path id -> slot + 1 (0: none yet) */
    Py_ssize_t cap;
} group_map;

/* Number bins, the same as rollup.number_bin (the reference; a property test holds the
 * two together): an int with |x| <= NB_EXACT is its own bin, |x| < NB_TINY is 0, every
 * other number falls in the logarithmic bin k = ceil(log|x| / log(gamma)), whose
 * representative is sign(x) * 2 * gamma**k / (gamma + 1).
 *
 * While counting, a bin is named by a small integer code, so a number costs a log() and
 * a probe in its slot's small C hash table: no Python object, no pow(). Per slot, not one
 * table for all: a batch holds hundreds of thousands of (slot, bin) pairs, and a slot's
 * bins then stay within a few kilobytes instead of each probe landing on its own cache
 * line and page of one large table. Codes: the exact ints themselves
 * (0 is also the tiny bin); sign * (NB_BASE + k) for bin k (k is in [-1047, 35843] for
 * finite doubles, so these never meet the exact codes); sign * NB_INF for infinities
 * (JSON has none, but a Python int too large for a double lands there). NaN has no bin. */
#define NB_EXACT 100
#define NB_TINY 1e-9
#define NB_GAMMA 1.02
#define NB_BASE (1 << 20)
#define NB_INF (1 << 30)
#define NB_NONE INT32_MIN /* "not counted" (NaN) */

/* log(gamma) from the same libm call as Python's math.log(1.02), set at import: a
 * constant the compiler folds itself could differ in the last bit and move bin edges. */
static double nb_log_gamma;

typedef struct {
    int32_t code;
    long long n;      /* 0: an empty entry */
} nb_entry;

typedef struct {
    nb_entry *entries; /* open addressing, linear probing, at most half full */
    uint32_t cap;      /* 0 or a power of two */
    uint32_t used;
} nb_table;

typedef struct {
    char *key;
    Py_ssize_t len, child;
} kc_entry;

typedef struct {
    uint64_t hash;
    Py_ssize_t off, len;  /* the value's bytes: arena[off:off + len] */
    long long n;
} vt_entry;

struct vt_table {
    vt_entry *e;    /* in order of first appearance */
    uint32_t *idx;  /* open addressing over e: entry index + 1 (0: empty), at most half full */
    uint32_t n, cap, icap;
};

struct kc_list {
    kc_entry *e;
    int n, cap, next;  /* next: where the last hit ended (keys come back in the same order) */
};

typedef struct {
    PyObject_HEAD
    PyObject *namer;
    PyObject *children;   /* list: parent id + 1 -> dict key -> int id */
    Py_ssize_t *items;    /* parent id + 1 -> items id + 1 (0: none yet) */
    Py_ssize_t items_cap;
    group_map *groups;
    Py_ssize_t ngroups;
    long long *counts;    /* slot * NCOUNT */
    Py_ssize_t *slot_group, *slot_path;
    /* slot -> short string value (its UTF-8 bytes, kept in `arena`) -> count, in order of first
     * appearance: counting a value makes no Python object (a str and a dict update per value
     * were most of add_json's time) */
    struct vt_table *vals;
    char *arena;
    Py_ssize_t arena_len, arena_cap, nvalues;
    nb_table *lens;       /* slot -> array length -> count (a table as for number bins) */
    Py_ssize_t nlens;     /* lengths over all slots */
    Py_ssize_t nslots, cap;
    Py_ssize_t max_value_length;
    /* slot -> number bin code -> count: a C table, no dict (and no boxed key or count), as for
     * values and lengths. */
    nb_table *numbers;
    Py_ssize_t nnumbers;  /* bins over all slots */
    /* add_json's cache of keys as written: parent id + 1 -> (key text, child id), so a key seen
     * before costs a memcmp instead of a str and a dict lookup (children stays the truth). */
    struct kc_list *kc;
    Py_ssize_t kc_cap;
} Acc;

static void acc_dealloc(Acc *self) {
    for (Py_ssize_t i = 0; i < self->kc_cap; i++) {
        for (int j = 0; j < self->kc[i].n; j++) PyMem_Free(self->kc[i].e[j].key);
        PyMem_Free(self->kc[i].e);
    }
    PyMem_Free(self->kc);
    Py_XDECREF(self->namer);
    Py_XDECREF(self->children);
    for (Py_ssize_t s = 0; s < self->nslots; s++) {
        PyMem_Free(self->lens[s].entries);
        PyMem_Free(self->vals[s].e);
        PyMem_Free(self->vals[s].idx);
    }
    PyMem_Free(self->vals);
    PyMem_Free(self->lens);
    PyMem_Free(self->arena);
    for (Py_ssize_t g = 0; g < self->ngroups; g++) PyMem_Free(self->groups[g].slot_of_path);
    for (Py_ssize_t s = 0; s < self->nslots; s++) PyMem_Free(self->numbers[s].entries);
    PyMem_Free(self->numbers);
    PyMem_Free(self->groups);
    PyMem_Free(self->items);
    PyMem_Free(self->counts);
    PyMem_Free(self->slot_group);
    PyMem_Free(self->slot_path);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int acc_init(Acc *self, PyObject *args, PyObject *kw) {
    PyObject *namer;
    Py_ssize_t maxlen;
    if (self->namer != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Acc is initialised once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "On", &namer, &maxlen)) return -1;
    Py_INCREF(namer);
    self->namer = namer;
    self->max_value_length = maxlen;
    self->children = PyList_New(0);
    if (!self->children) return -1;
    return 0;
}

static Py_ssize_t new_path(Acc *self, Py_ssize_t parent, PyObject *key) {
    PyObject *id = PyObject_CallFunction(self->namer, "nO", parent, key);
    if (id == NULL) return -2;
    Py_ssize_t r = PyLong_AsSsize_t(id);
    Py_DECREF(id);
    if (r < 0) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "namer returned a negative id"); return -2; }
    /* make room for the new path's own children dict and items entry */
    while (PyList_GET_SIZE(self->children) < r + 2) {
        PyObject *d = PyDict_New();
        if (!d || PyList_Append(self->children, d) < 0) { Py_XDECREF(d); return -2; }
        Py_DECREF(d);
    }
    if (self->items_cap < r + 2) {
        Py_ssize_t cap = (r + 2) * 2;
        Py_ssize_t *it = PyMem_Realloc(self->items, sizeof(Py_ssize_t) * cap);
        if (!it) { PyErr_NoMemory(); return -2; }
        memset(it + self->items_cap, 0, sizeof(Py_ssize_t) * (cap - self->items_cap));
        self->items = it;
        self->items_cap = cap;
    }
    return r;
}

static int ensure_root(Acc *self) {
    if (PyList_GET_SIZE(self->children) > 0) return 0;
    PyObject *d = PyDict_New();
    if (!d || PyList_Append(self->children, d) < 0) { Py_XDECREF(d); return -1; }
    Py_DECREF(d);
    if (self->items_cap < 1) {
        self->items = PyMem_Calloc(16, sizeof(Py_ssize_t));
        if (!self->items) { PyErr_NoMemory(); return -1; }
        self->items_cap = 16;
    }
    return 0;
}

static Py_ssize_t child_id(Acc *self, Py_ssize_t parent, PyObject *key) {
    PyObject *d = PyList_GET_ITEM(self->children, parent + 1);
    PyObject *id = PyDict_GetItemWithError(d, key);
    if (id != NULL) return PyLong_AsSsize_t(id);
    if (PyErr_Occurred()) return -2;
    Py_ssize_t r = new_path(self, parent, key);
    if (r < 0) return -2;
    PyObject *v = PyLong_FromSsize_t(r);
    d = PyList_GET_ITEM(self->children, parent + 1); /* the list may have grown */
    if (!v || PyDict_SetItem(d, key, v) < 0) { Py_XDECREF(v); return -2; }
    Py_DECREF(v);
    return r;
}

static Py_ssize_t items_id(Acc *self, Py_ssize_t parent) {
    Py_ssize_t known = self->items[parent + 1];
    if (known) return known - 1;
    Py_ssize_t r = new_path(self, parent, Py_None);
    if (r < 0) return -2;
    self->items[parent + 1] = r + 1;
    return r;
}

static Py_ssize_t slot_of(Acc *self, Py_ssize_t group, Py_ssize_t path) {
    group_map *gm = &self->groups[group];
    if (path >= gm->cap) {
        Py_ssize_t cap = (path + 1) * 2;
        Py_ssize_t *m = PyMem_Realloc(gm->slot_of_path, sizeof(Py_ssize_t) * cap);
        if (!m) { PyErr_NoMemory(); return -1; }
        memset(m + gm->cap, 0, sizeof(Py_ssize_t) * (cap - gm->cap));
        gm->slot_of_path = m;
        gm->cap = cap;
    }
    Py_ssize_t s = gm->slot_of_path[path];
    if (s) return s - 1;
    if (self->nslots == self->cap) {
        Py_ssize_t cap = self->cap ? self->cap * 2 : 256;
        long long *c = PyMem_Realloc(self->counts, sizeof(long long) * NCOUNT * cap);
        if (!c) { PyErr_NoMemory(); return -1; }
        self->counts = c;
        Py_ssize_t *sg = PyMem_Realloc(self->slot_group, sizeof(Py_ssize_t) * cap);
        if (!sg) { PyErr_NoMemory(); return -1; }
        self->slot_group = sg;
        Py_ssize_t *sp = PyMem_Realloc(self->slot_path, sizeof(Py_ssize_t) * cap);
        if (!sp) { PyErr_NoMemory(); return -1; }
        self->slot_path = sp;
        nb_table *nt = PyMem_Realloc(self->numbers, sizeof(nb_table) * cap);
        if (!nt) { PyErr_NoMemory(); return -1; }
        self->numbers = nt;
        struct vt_table *vt = PyMem_Realloc(self->vals, sizeof(struct vt_table) * cap);
        if (!vt) { PyErr_NoMemory(); return -1; }
        self->vals = vt;
        nb_table *lt = PyMem_Realloc(self->lens, sizeof(nb_table) * cap);
        if (!lt) { PyErr_NoMemory(); return -1; }
        self->lens = lt;
        self->cap = cap;
    }
    s = self->nslots;
    memset(self->vals + s, 0, sizeof(struct vt_table));
    memset(self->lens + s, 0, sizeof(nb_table));
    self->nslots++;
    memset(self->counts + s * NCOUNT, 0, sizeof(long long) * NCOUNT);
    memset(self->numbers + s, 0, sizeof(nb_table));
    self->slot_group[s] = group;
    self->slot_path[s] = path;
    gm->slot_of_path[path] = s + 1;
    return s;
}

static inline uint64_t vt_hash(const char *p, Py_ssize_t n) {  /* FNV-1a */
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

/* Count one short string value (its UTF-8 bytes) in its slot. */
static int vt_bump(Acc *self, Py_ssize_t slot, const char *p, Py_ssize_t len) {
    struct vt_table *t = &self->vals[slot];
    uint64_t h = vt_hash(p, len);
    uint32_t mask = t->icap - 1, i = (uint32_t)h & mask;
    if (t->icap) {
        for (uint32_t j; (j = t->idx[i]) != 0; i = (i + 1) & mask) {
            vt_entry *e = &t->e[j - 1];
            if (e->hash == h && e->len == len && (len == 0 || memcmp(self->arena + e->off, p, (size_t)len) == 0)) {
                e->n++;
                return 0;
            }
        }
    }
    /* a new value: its text must be UTF-8 (it becomes an Arrow string) */
    PyObject *check = PyUnicode_DecodeUTF8(p, len, "strict");
    if (check == NULL) return -1;
    Py_DECREF(check);
    if (self->arena_len + len > self->arena_cap) {
        Py_ssize_t cap = self->arena_cap ? self->arena_cap * 2 : 4096;
        while (cap < self->arena_len + len) cap *= 2;
        char *a = PyMem_Realloc(self->arena, (size_t)cap);
        if (!a) { PyErr_NoMemory(); return -1; }
        self->arena = a;
        self->arena_cap = cap;
    }
    if (len) memcpy(self->arena + self->arena_len, p, (size_t)len);  /* "" first: no arena yet (NULL) */
    if (t->n == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 4;
        vt_entry *e = PyMem_Realloc(t->e, sizeof(vt_entry) * cap);
        if (!e) { PyErr_NoMemory(); return -1; }
        t->e = e;
        t->cap = cap;
    }
    t->e[t->n] = (vt_entry){h, self->arena_len, len, 1};
    self->arena_len += len;
    t->n++;
    self->nvalues++;
    if (t->n * 2 > t->icap) {  /* (re)build the index */
        uint32_t icap = t->icap ? t->icap * 2 : 8;
        while (t->n * 2 > icap) icap *= 2;
        uint32_t *idx = PyMem_Calloc(icap, sizeof(uint32_t));
        if (!idx) { PyErr_NoMemory(); return -1; }
        for (uint32_t j = 0; j < t->n; j++) {
            uint32_t k = (uint32_t)t->e[j].hash & (icap - 1);
            while (idx[k]) k = (k + 1) & (icap - 1);
            idx[k] = j + 1;
        }
        PyMem_Free(t->idx);
        t->idx = idx;
        t->icap = icap;
    } else {
        t->idx[i] = t->n;  /* i: the empty place the probe ended at */
    }
    return 0;
}

/* --- number bins ------------------------------------------------------------------------ */

static inline int32_t nb_code_of_double(double d) {
    double a = fabs(d);
    if (a < NB_TINY) return 0;
    if (isnan(a)) return NB_NONE;
    if (isinf(a)) return d < 0 ? -NB_INF : NB_INF;
    int32_t k = (int32_t)ceil(log(a) / nb_log_gamma);
    return d < 0 ? -(NB_BASE + k) : NB_BASE + k;
}

/* The code of an exact int (not a bool); -1 with an exception set on failure. */
static inline int nb_code_of_long(PyObject *v, int32_t *code) {
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow == 0) {
        if (x == -1 && PyErr_Occurred()) return -1;
        if (x >= -NB_EXACT && x <= NB_EXACT) { *code = (int32_t)x; return 0; }
        /* Rounds to nearest even, as float(int) does: the same double as the reference. */
        *code = nb_code_of_double((double)x);
        return 0;
    }
    double d = PyLong_AsDouble(v);
    if (d == -1.0 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear(); /* beyond any double: the infinite bin of its sign */
        *code = overflow < 0 ? -NB_INF : NB_INF;
        return 0;
    }
    *code = nb_code_of_double(d);
    return 0;
}

/* The representative value of a bin code: what rollup.number_bin returns. */
static double nb_value(int32_t code) {
    if (code >= -NB_EXACT && code <= NB_EXACT) return (double)code;
    int32_t m = code < 0 ? -code : code;
    double r;
    if (m == NB_INF) {
        r = Py_HUGE_VAL;
    } else {
        double k = (double)(m - NB_BASE);
        r = 2.0 * pow(NB_GAMMA, k) / (NB_GAMMA + 1.0);
        if (isinf(r)) {
            /* In the top bin gamma**k overflows a double: the same value from gamma**(k-1),
             * which does not (and, defensively, kept finite). */
            r = pow(NB_GAMMA, k - 1.0) * (2.0 * NB_GAMMA / (NB_GAMMA + 1.0));
            if (isinf(r)) r = DBL_MAX;
        }
    }
    return code < 0 ? -r : r;
}

static inline uint32_t nb_hash(int32_t code) {
    uint32_t h = (uint32_t)code * 0x9E3779B1u; /* neighbouring bins have neighbouring codes */
    return h ^ (h >> 15);
}

static int nb_grow(nb_table *t) {
    uint32_t cap = t->cap ? t->cap * 2 : 8;
    nb_entry *e = PyMem_Calloc(cap, sizeof(nb_entry));
    if (!e) { PyErr_NoMemory(); return -1; }
    for (uint32_t j = 0; j < t->cap; j++) {
        nb_entry *old = &t->entries[j];
        if (old->n == 0) continue;
        uint32_t i = nb_hash(old->code) & (cap - 1);
        while (e[i].n) i = (i + 1) & (cap - 1);
        e[i] = *old;
    }
    PyMem_Free(t->entries);
    t->entries = e;
    t->cap = cap;
    return 0;
}

/* One more of `code` in table t (*total counts the entries of all tables of its kind). */
static int tb_count(nb_table *t, int32_t code, Py_ssize_t *total) {
    if (t->used * 2 >= t->cap && nb_grow(t) < 0) return -1;
    uint32_t mask = t->cap - 1, i = nb_hash(code) & mask;
    for (;;) {
        nb_entry *e = &t->entries[i];
        if (e->n == 0) {
            e->code = code;
            e->n = 1;
            t->used++;
            (*total)++;
            return 0;
        }
        if (e->code == code) { e->n++; return 0; }
        i = (i + 1) & mask;
    }
}

static int nb_count(Acc *self, Py_ssize_t slot, int32_t code) {
    if (code == NB_NONE) return 0;
    return tb_count(&self->numbers[slot], code, &self->nnumbers);
}

static int len_count(Acc *self, Py_ssize_t slot, Py_ssize_t n) {
    if (n > INT32_MAX) { PyErr_SetString(PyExc_OverflowError, "an array too long to count"); return -1; }
    return tb_count(&self->lens[slot], (int32_t)n, &self->nlens);
}

static int acc_value(Acc *self, PyObject *v, Py_ssize_t group, Py_ssize_t path);

static int acc_children(Acc *self, PyObject *v, Py_ssize_t group, Py_ssize_t path) {
    if (PyDict_CheckExact(v)) {
        Py_ssize_t pos = 0;
        PyObject *k, *x;
        while (PyDict_Next(v, &pos, &k, &x)) {
            /* the namer is Python code: keep the key and value alive across it */
            Py_INCREF(k);
            Py_INCREF(x);
            Py_ssize_t child = child_id(self, path, k);
            int r = child < 0 ? -1 : acc_value(self, x, group, child);
            Py_DECREF(k);
            Py_DECREF(x);
            if (r < 0) return -1;
        }
        return 0;
    }
    Py_ssize_t n = PyList_GET_SIZE(v);
    if (n == 0) return 0;
    Py_ssize_t child = items_id(self, path);
    if (child < 0) return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        if (acc_value(self, PyList_GET_ITEM(v, i), group, child) < 0) return -1;
    return 0;
}

static int acc_value(Acc *self, PyObject *v, Py_ssize_t group, Py_ssize_t path) {
    Py_ssize_t slot = slot_of(self, group, path);
    if (slot < 0) return -1;
    long long *c = self->counts + slot * NCOUNT;
    c[C_PRESENT]++;
    if (v == Py_None) {
        c[C_NULL]++;
    } else if (PyBool_Check(v)) {
        c[C_BOOLEAN]++;
    } else if (PyLong_CheckExact(v)) {
        c[C_INTEGER]++;
        int32_t code;
        if (nb_code_of_long(v, &code) < 0 || nb_count(self, slot, code) < 0) return -1;
    } else if (PyFloat_CheckExact(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        if (d == floor(d)) c[C_INTEGER]++; else c[C_NUMBER]++;
        if (nb_count(self, slot, nb_code_of_double(d)) < 0) return -1;
    } else if (PyUnicode_CheckExact(v)) {
        c[C_STRING]++;
        if (PyUnicode_GET_LENGTH(v) <= self->max_value_length) {
            Py_ssize_t len;
            const char *u = PyUnicode_AsUTF8AndSize(v, &len);
            if (u == NULL || vt_bump(self, slot, u, len) < 0) return -1;
        } else {
            c[C_LONG]++;
        }
    } else if (PyList_CheckExact(v)) {
        c[C_ARRAY]++;
        if (len_count(self, slot, PyList_GET_SIZE(v)) < 0) return -1;
        return acc_children(self, v, group, path);
    } else if (PyDict_CheckExact(v)) {
        c[C_OBJECT]++;
        return acc_children(self, v, group, path);
    } else {
        PyErr_Format(PyExc_TypeError, "unexpected %s in an output", Py_TYPE(v)->tp_name);
        return -1;
    }
    return 0;
}

static int acc_group(Acc *self, Py_ssize_t group) {
    if (group < 0) { PyErr_SetString(PyExc_ValueError, "group must be >= 0"); return -1; }
    if (self->namer == NULL) { PyErr_SetString(PyExc_RuntimeError, "Acc is not initialised"); return -1; }
    if (ensure_root(self) < 0) return -1;
    if (group >= self->ngroups) {
        group_map *gs = PyMem_Realloc(self->groups, sizeof(group_map) * (group + 1));
        if (!gs) { PyErr_NoMemory(); return -1; }
        memset(gs + self->ngroups, 0, sizeof(group_map) * (group + 1 - self->ngroups));
        self->groups = gs;
        self->ngroups = group + 1;
    }
    return 0;
}

/* Count one parsed output (a dict, not a subclass: acc_children walks anything else as a list). */
static int acc_count_dict(Acc *self, PyObject *output, Py_ssize_t group) {
    if (!PyDict_CheckExact(output)) {
        PyErr_Format(PyExc_TypeError, "an output is a dict or its JSON text, not %s", Py_TYPE(output)->tp_name);
        return -1;
    }
    if (acc_group(self, group) < 0) return -1;
    Py_INCREF(output);  /* the namer is Python code: keep the output alive across it */
    int r = acc_children(self, output, group, -1);
    Py_DECREF(output);
    return r;
}

static PyObject *acc_add(Acc *self, PyObject *args) {
    PyObject *output;
    Py_ssize_t group;
    if (!PyArg_ParseTuple(args, "On", &output, &group)) return NULL;
    if (acc_count_dict(self, output, group) < 0) return NULL;
    Py_RETURN_NONE;
}

/* --- counting from JSON text ------------------------------------------------------------ *
 * add_json(text, group) counts one output given as JSON text, exactly as add(json.loads(text),
 * group) would (a property test holds the two together): the same paths, in the same order of
 * first appearance, the same counts, values, lengths and number bins. Bulk import and the
 * service hand over the canonical output text scan_envelope made, so no output is parsed into
 * Python objects at all. The text must be valid JSON (an object); it is not validated here. */

typedef struct {
    const unsigned char *p, *end;
    char *tmp;            /* scratch for strings with escapes and number literals */
    Py_ssize_t tmp_cap;
} jtext;

static int jt_room(jtext *t, Py_ssize_t n) {
    if (n <= t->tmp_cap) return 0;
    Py_ssize_t cap = n < 256 ? 256 : n * 2;
    char *b = PyMem_Realloc(t->tmp, (size_t)cap);
    if (!b) { PyErr_NoMemory(); return -1; }
    t->tmp = b;
    t->tmp_cap = cap;
    return 0;
}

static inline void jt_ws(jtext *t) {
    while (t->p < t->end && (*t->p == ' ' || *t->p == '\t' || *t->p == '\n' || *t->p == '\r')) t->p++;
}

static int jt_bad(const char *what) {
    PyErr_Format(PyExc_ValueError, "add_json: %s", what);
    return -1;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The string at t->p (its opening quote) as a new str; *chars gets its length in code points. */
/* The string at t->p (its opening quote) as UTF-8: *out points into the text itself when it
 * has no escape, else into t->tmp; *chars counts its code points. -1 with an exception set. */
static int jt_unescape(jtext *t, const char **out, Py_ssize_t *outlen, Py_ssize_t *chars) {
    const unsigned char *s = ++t->p, *p = s;
    int escaped = 0;
    Py_ssize_t n = 0;
    while (p < t->end && *p != '"') {
        if (*p == '\\') { escaped = 1; p += 2; continue; }
        if ((*p & 0xC0) != 0x80) n++;
        p++;
    }
    if (p >= t->end) return jt_bad("unterminated string");
    t->p = p + 1;
    if (!escaped) {
        *chars = n;
        *out = (const char *)s;
        *outlen = p - s;
        return 0;
    }
    if (jt_room(t, (p - s) + 4) < 0) return -1;
    char *o = t->tmp;
    for (const unsigned char *q = s; q < p;) {
        if (*q != '\\') { *o++ = (char)*q++; continue; }
        q++;
        switch (*q++) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            if (p - q < 4) return jt_bad("short \\u escape");
            uint32_t cp = 0;
            for (int i = 0; i < 4; i++) {
                int h = hexval(q[i]);
                if (h < 0) return jt_bad("bad \\u escape");
                cp = cp * 16 + (uint32_t)h;
            }
            q += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && p - q >= 6 && q[0] == '\\' && q[1] == 'u') {
                uint32_t lo = 0;
                int ok = 1;
                for (int i = 0; i < 4; i++) {
                    int h = hexval(q[2 + i]);
                    if (h < 0) { ok = 0; break; }
                    lo = lo * 16 + (uint32_t)h;
                }
                if (ok && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    q += 6;
                }
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) return jt_bad("lone surrogate");
            if (cp < 0x80) *o++ = (char)cp;
            else if (cp < 0x800) { *o++ = (char)(0xC0 | (cp >> 6)); *o++ = (char)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                *o++ = (char)(0xE0 | (cp >> 12)); *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *o++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *o++ = (char)(0xF0 | (cp >> 18)); *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *o++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: return jt_bad("bad escape");
        }
    }
    *out = t->tmp;
    *outlen = o - t->tmp;
    n = 0;
    for (const char *q = t->tmp; q < o; q++) n += (*q & 0xC0) != 0x80;
    *chars = n;
    return 0;
}

static PyObject *jt_string(jtext *t, Py_ssize_t *chars) {
    const char *u;
    Py_ssize_t len;
    if (jt_unescape(t, &u, &len, chars) < 0) return NULL;
    return PyUnicode_DecodeUTF8(u, len, "strict");
}

/* The bin code of the number at t->p, and whether it counts as an integer (as add() counts
 * the int or float json.loads makes of it). */
static int jt_number(jtext *t, int32_t *code, int *integer) {
    const unsigned char *s = t->p, *p = s;
    int frac = 0;
    if (p < t->end && *p == '-') p++;
    while (p < t->end && ((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' || *p == '-')) {
        if (*p == '.' || *p == 'e' || *p == 'E') frac = 1;
        p++;
    }
    t->p = p;
    Py_ssize_t len = p - s;
    if (len == 0 || len > 4096) return jt_bad("bad number");
    if (!frac) {
        *integer = 1;
        Py_ssize_t digits = len - (*s == '-');
        if (digits <= 18) {
            long long x = 0;
            for (const unsigned char *q = s + (*s == '-'); q < p; q++) x = x * 10 + (*q - '0');
            if (*s == '-') x = -x;
            *code = (x >= -NB_EXACT && x <= NB_EXACT) ? (int32_t)x : nb_code_of_double((double)x);
            return 0;
        }
        if (jt_room(t, len + 1) < 0) return -1;
        memcpy(t->tmp, s, (size_t)len);
        t->tmp[len] = 0;
        PyObject *v = PyLong_FromString(t->tmp, NULL, 10);
        if (!v) return -1;
        int r = nb_code_of_long(v, code);
        Py_DECREF(v);
        return r;
    }
    {
        /* A plain decimal of at most 15 significant digits: its digits as an integer divided
         * by a power of ten, both exact doubles, is the correctly rounded value, the double
         * PyOS_string_to_double makes of it (Clinger's fast path). */
        static const double pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                       1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
        const unsigned char *q = s + (*s == '-');
        long long mant = 0;
        int sig = 0, fracd = 0, dot = 0, ok = q < p;
        for (; ok && q < p; q++) {
            if (*q == '.') { if (dot) ok = 0; dot = 1; continue; }
            if (*q < '0' || *q > '9') { ok = 0; break; }
            if (mant || *q != '0') sig++;
            mant = mant * 10 + (*q - '0');
            fracd += dot;
        }
        if (ok && sig <= 15 && fracd <= 22) {
            double d = (double)mant / pow10[fracd];
            if (*s == '-') d = -d;
            *integer = d == floor(d);
            *code = nb_code_of_double(d);
            return 0;
        }
    }
    if (jt_room(t, len + 1) < 0) return -1;
    memcpy(t->tmp, s, (size_t)len);
    t->tmp[len] = 0;
    double d = PyOS_string_to_double(t->tmp, NULL, NULL);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    *integer = d == floor(d);
    *code = nb_code_of_double(d);
    return 0;
}

static int jt_members(Acc *self, jtext *t, Py_ssize_t group, Py_ssize_t path);

/* The first '"' or '\\' at or after p (end if none). */
static inline const unsigned char *jt_quote_or_backslash(const unsigned char *p, const unsigned char *end) {
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

/* The code points of n bytes of valid UTF-8: the bytes that are not continuation bytes. */
static inline Py_ssize_t utf8_chars(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t cont = 0, i = 0;
#ifdef __SSE2__
    const __m128i lim = _mm_set1_epi8((char)0xC0);  /* signed: 0x80..0xBF are the bytes below -64 */
    for (; i + 16 <= n; i += 16)
        cont += __builtin_popcount((unsigned)_mm_movemask_epi8(
            _mm_cmplt_epi8(_mm_loadu_si128((const __m128i *)(p + i)), lim)));
#endif
    for (; i < n; i++) cont += (p[i] & 0xC0) == 0x80;
    return n - cont;
}

static int jt_value(Acc *self, jtext *t, Py_ssize_t group, Py_ssize_t path) {
    Py_ssize_t slot = slot_of(self, group, path);
    if (slot < 0) return -1;
    long long *c = self->counts + slot * NCOUNT;
    c[C_PRESENT]++;
    jt_ws(t);
    if (t->p >= t->end) return jt_bad("text ends early");
    unsigned char ch = *t->p;
    if (ch == 'n') { c[C_NULL]++; t->p += 4; return 0; }
    if (ch == 't') { c[C_BOOLEAN]++; t->p += 4; return 0; }
    if (ch == 'f') { c[C_BOOLEAN]++; t->p += 5; return 0; }
    if (ch == '"') {
        c[C_STRING]++;
        /* without escapes (the usual case), the string is its bytes: a short one is counted
         * from them, a long one only counted */
        const unsigned char *a = t->p + 1, *q = jt_quote_or_backslash(a, t->end);
        if (q < t->end && *q == '"') {
            Py_ssize_t len = q - a;
            t->p = q + 1;
            if (len <= self->max_value_length || utf8_chars(a, len) <= self->max_value_length)
                return vt_bump(self, slot, (const char *)a, len);
            c[C_LONG]++;
            return 0;
        }
        Py_ssize_t chars, len;
        const char *u;
        if (jt_unescape(t, &u, &len, &chars) < 0) return -1;
        if (chars <= self->max_value_length) return vt_bump(self, slot, u, len);
        c = self->counts + slot * NCOUNT;
        c[C_LONG]++;
        return 0;
    }
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        int32_t code;
        int integer;
        if (jt_number(t, &code, &integer) < 0) return -1;
        c = self->counts + slot * NCOUNT;
        c[integer ? C_INTEGER : C_NUMBER]++;
        return nb_count(self, slot, code);
    }
    if (ch == '[') {
        c[C_ARRAY]++;
        t->p++;
        Py_ssize_t n = 0, child = -1;
        jt_ws(t);
        if (t->p < t->end && *t->p == ']') {
            t->p++;
        } else {
            for (;;) {
                if (child < 0 && (child = items_id(self, path)) < 0) return -1;
                if (jt_value(self, t, group, child) < 0) return -1;
                n++;
                jt_ws(t);
                if (t->p < t->end && *t->p == ',') { t->p++; continue; }
                if (t->p < t->end && *t->p == ']') { t->p++; break; }
                return jt_bad("bad array");
            }
        }
        return len_count(self, slot, n);
    }
    if (ch == '{') {
        c[C_OBJECT]++;
        t->p++;
        return jt_members(self, t, group, path);
    }
    return jt_bad("unexpected character");
}

static Py_ssize_t kc_find(Acc *self, Py_ssize_t parent, const unsigned char *key, Py_ssize_t len) {
    if (parent + 1 >= self->kc_cap) return -1;
    struct kc_list *l = &self->kc[parent + 1];
    for (int j = 0, i = l->next; j < l->n; j++, i = i + 1 == l->n ? 0 : i + 1) {
        kc_entry *e = &l->e[i];
        if (e->len == len && memcmp(e->key, key, (size_t)len) == 0) {
            l->next = i + 1 == l->n ? 0 : i + 1;
            return e->child;
        }
    }
    return -1;
}

static int kc_add(Acc *self, Py_ssize_t parent, const unsigned char *key, Py_ssize_t len, Py_ssize_t child) {
    if (parent + 1 >= self->kc_cap) {
        Py_ssize_t cap = (parent + 1) * 2 + 16;
        struct kc_list *kc = PyMem_Realloc(self->kc, sizeof(struct kc_list) * (size_t)cap);
        if (!kc) { PyErr_NoMemory(); return -1; }
        memset(kc + self->kc_cap, 0, sizeof(struct kc_list) * (size_t)(cap - self->kc_cap));
        self->kc = kc;
        self->kc_cap = cap;
    }
    struct kc_list *l = &self->kc[parent + 1];
    if (l->n >= 64) return 0; /* a wide object: its keys go through the dict alone */
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        kc_entry *e = PyMem_Realloc(l->e, sizeof(kc_entry) * (size_t)cap);
        if (!e) { PyErr_NoMemory(); return -1; }
        l->e = e;
        l->cap = cap;
    }
    char *copy = PyMem_Malloc(len ? (size_t)len : 1);
    if (!copy) { PyErr_NoMemory(); return -1; }
    memcpy(copy, key, (size_t)len);
    l->e[l->n++] = (kc_entry){copy, len, child};
    return 0;
}

/* The members of an object whose '{' is read. */
static int jt_members(Acc *self, jtext *t, Py_ssize_t group, Py_ssize_t path) {
    jt_ws(t);
    if (t->p < t->end && *t->p == '}') { t->p++; return 0; }
    for (;;) {
        jt_ws(t);
        if (t->p >= t->end || *t->p != '"') return jt_bad("expected a key");
        const unsigned char *key = t->p + 1, *q = key;
        while (q < t->end && *q != '"') q += *q == '\\' ? 2 : 1;
        if (q >= t->end) return jt_bad("unterminated string");
        Py_ssize_t child = kc_find(self, path, key, q - key);
        if (child >= 0) {
            t->p = q + 1;
        } else {
            Py_ssize_t chars;
            PyObject *k = jt_string(t, &chars);
            if (!k) return -1;
            child = child_id(self, path, k);
            Py_DECREF(k);
            if (child < 0 || kc_add(self, path, key, q - key, child) < 0) return -1;
        }
        jt_ws(t);
        if (t->p >= t->end || *t->p != ':') return jt_bad("expected ':'");
        t->p++;
        if (jt_value(self, t, group, child) < 0) return -1;
        jt_ws(t);
        if (t->p < t->end && *t->p == ',') { t->p++; continue; }
        if (t->p < t->end && *t->p == '}') { t->p++; return 0; }
        return jt_bad("bad object");
    }
}

/* Count one output's JSON text in its group (the text as add_json takes it). */
static int acc_count_text(Acc *self, const char *text, Py_ssize_t len, Py_ssize_t group) {
    if (acc_group(self, group) < 0) return -1;
    jtext t = {(const unsigned char *)text, (const unsigned char *)text + len, NULL, 0};
    jt_ws(&t);
    int r;
    if (t.p >= t.end || *t.p != '{') r = jt_bad("an output is a JSON object");
    else { t.p++; r = jt_members(self, &t, group, -1); }
    PyMem_Free(t.tmp);
    return r;
}

static PyObject *acc_add_json(Acc *self, PyObject *args) {
    const char *text;
    Py_ssize_t len, group;
    if (!PyArg_ParseTuple(args, "s#n", &text, &len, &group)) return NULL;
    if (acc_count_text(self, text, len, group) < 0) return NULL;
    Py_RETURN_NONE;
}

/* add_many(outputs, groups): add_json(text, group) or add(dict, group) of each pair, in order. */
static PyObject *acc_add_many(Acc *self, PyObject *args) {
    PyObject *outputs, *groups;
    if (!PyArg_ParseTuple(args, "OO", &outputs, &groups)) return NULL;
    PyObject *fo = PySequence_Fast(outputs, "outputs must be a sequence");
    if (fo == NULL) return NULL;
    PyObject *fg = PySequence_Fast(groups, "groups must be a sequence");
    if (fg == NULL) { Py_DECREF(fo); return NULL; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fo);
    int r = 0;
    if (PySequence_Fast_GET_SIZE(fg) != n) {
        PyErr_SetString(PyExc_ValueError, "outputs and groups differ in length");
        r = -1;
    }
    for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(fo, i);
        Py_ssize_t g = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fg, i));
        if (g == -1 && PyErr_Occurred()) { r = -1; break; }
        if (PyUnicode_Check(o)) {
            Py_ssize_t len;
            const char *text = PyUnicode_AsUTF8AndSize(o, &len);
            r = text == NULL ? -1 : acc_count_text(self, text, len, g);
        } else {
            r = acc_count_dict(self, o, g);
        }
    }
    Py_DECREF(fo);
    Py_DECREF(fg);
    if (r < 0) return NULL;
    Py_RETURN_NONE;
}

/* counts() -> list of (group, path, present, null, boolean, integer, number, string, array, object, long) */
static PyObject *acc_counts(Acc *self, PyObject *unused) {
    PyObject *out = PyList_New(self->nslots);
    if (!out) return NULL;
    for (Py_ssize_t s = 0; s < self->nslots; s++) {
        long long *c = self->counts + s * NCOUNT;
        PyObject *row = Py_BuildValue("(nnLLLLLLLLL)", self->slot_group[s], self->slot_path[s],
                                      c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]);
        if (!row) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, s, row);
    }
    return out;
}

/* The number bins (bins 1) or array lengths (bins 0) as three packed native arrays (bytes):
 * slots (int64), representative values (float64) or lengths (int64), and counts (int64), by
 * slot. Not lists: a batch has several bins per event, and boxing each slot, value and count
 * cost more than counting them (Arrow wraps these buffers without a copy). */
static PyObject *acc_table_rows(Acc *self, int bins) {
    Py_ssize_t n = bins ? self->nnumbers : self->nlens;
    PyObject *slots = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *values = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *counts = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!slots || !values || !counts) {
        Py_XDECREF(slots);
        Py_XDECREF(values);
        Py_XDECREF(counts);
        return NULL;
    }
    int64_t *ps = (int64_t *)PyBytes_AS_STRING(slots), *pn = (int64_t *)PyBytes_AS_STRING(counts);
    double *pv = (double *)PyBytes_AS_STRING(values);
    int64_t *pl = (int64_t *)PyBytes_AS_STRING(values);
    Py_ssize_t row = 0;
    for (Py_ssize_t s = 0; s < self->nslots; s++) {
        nb_table *t = bins ? &self->numbers[s] : &self->lens[s];
        for (uint32_t i = 0; i < t->cap; i++) {
            nb_entry *e = &t->entries[i];
            if (e->n == 0) continue;
            ps[row] = s;
            if (bins)
                pv[row] = nb_value(e->code);
            else
                pl[row] = e->code;
            pn[row] = e->n;
            row++;
        }
    }
    return Py_BuildValue("(NNN)", slots, values, counts);
}

/* value_rows() -> (slots, offsets, data, counts): the short string values of every slot as
 * the buffers of Arrow columns: slots int64, offsets int32 (one more than the rows) and
 * UTF-8 data of a string column, counts int64. A batch keeps about as many value rows as
 * events, and boxing each into lists that Arrow then converts cost about 1 us per event. */
static PyObject *acc_value_rows(Acc *self, PyObject *Py_UNUSED(ignored)) {
    if (self->namer == NULL) { PyErr_SetString(PyExc_RuntimeError, "Acc is not initialised"); return NULL; }
    Py_ssize_t n = self->nvalues, nbytes = self->arena_len;
    if (nbytes > INT32_MAX) { PyErr_SetString(PyExc_OverflowError, "value rows exceed 2 GiB of text"); return NULL; }
    PyObject *slots = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    PyObject *data = PyBytes_FromStringAndSize(NULL, nbytes);
    PyObject *counts = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!slots || !offsets || !data || !counts) goto fail;
    int64_t *ps = (int64_t *)PyBytes_AS_STRING(slots), *pn = (int64_t *)PyBytes_AS_STRING(counts);
    int32_t *po = (int32_t *)PyBytes_AS_STRING(offsets);
    char *pd = PyBytes_AS_STRING(data);
    Py_ssize_t row = 0, at = 0;
    po[0] = 0;
    for (Py_ssize_t s = 0; s < self->nslots; s++) {
        struct vt_table *t = &self->vals[s];
        for (uint32_t j = 0; j < t->n; j++) {
            vt_entry *e = &t->e[j];
            if (e->len) memcpy(pd + at, self->arena + e->off, (size_t)e->len);  /* arena NULL if only "" */
            at += e->len;
            ps[row] = s;
            pn[row] = e->n;
            po[row + 1] = (int32_t)at;
            row++;
        }
    }
    return Py_BuildValue("(NNNN)", slots, offsets, data, counts);
fail:
    Py_XDECREF(slots);
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    Py_XDECREF(counts);
    return NULL;
}

/* rows(which) -> (slots, keys, counts): the values (which=0) as three parallel lists; the array
 * lengths (which=1) or number bins (which=2) as three packed arrays (see acc_table_rows). */
static PyObject *acc_rows(Acc *self, PyObject *arg) {
    if (self->namer == NULL) { PyErr_SetString(PyExc_RuntimeError, "Acc is not initialised"); return NULL; }
    long which = PyLong_AsLong(arg);
    if (which == -1 && PyErr_Occurred()) return NULL;
    if (which < 0 || which > 2) { PyErr_SetString(PyExc_ValueError, "rows(which): which is 0, 1 or 2"); return NULL; }
    if (which > 0) return acc_table_rows(self, which == 2);
    PyObject *slots = PyList_New(0), *keys = PyList_New(0), *counts = PyList_New(0);
    if (!slots || !keys || !counts) goto fail;
    for (Py_ssize_t s = 0; s < self->nslots; s++) {
        struct vt_table *t = &self->vals[s];
        for (uint32_t j = 0; j < t->n; j++) {
            PyObject *sv = PyLong_FromSsize_t(s);
            PyObject *k = PyUnicode_DecodeUTF8(self->arena + t->e[j].off, t->e[j].len, "strict");
            PyObject *v = PyLong_FromLongLong(t->e[j].n);
            int r = sv && k && v && PyList_Append(slots, sv) == 0 && PyList_Append(keys, k) == 0 &&
                    PyList_Append(counts, v) == 0;
            Py_XDECREF(sv);
            Py_XDECREF(k);
            Py_XDECREF(v);
            if (!r) goto fail;
        }
    }
    return Py_BuildValue("(NNN)", slots, keys, counts);
fail:
    Py_XDECREF(slots);
    Py_XDECREF(keys);
    Py_XDECREF(counts);
    return NULL;
}

static PyMethodDef acc_methods[] = {
    {"rows", (PyCFunction)acc_rows, METH_O,
     "rows(0|1|2) -> (slots, keys, counts) of values (0, lists), lengths (1, packed) or number bins (2, packed)."},
    {"add", (PyCFunction)acc_add, METH_VARARGS, "add(output: dict, group: int): count one output."},
    {"add_many", (PyCFunction)acc_add_many, METH_VARARGS,
     "add_many(outputs, groups): count each output (a dict, or its JSON text) in its group, in order."},
    {"add_json", (PyCFunction)acc_add_json, METH_VARARGS,
     "add_json(text, group): count one output given as JSON text, as add(json.loads(text), group)."},
    {"value_rows", (PyCFunction)acc_value_rows, METH_NOARGS,
     "value_rows() -> (slots, offsets, data, counts): the values as packed Arrow buffers."},
    {"counts", (PyCFunction)acc_counts, METH_NOARGS, "Per slot: (group, path, nine counts); slot i is row i."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AccType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collector._speedups.Acc",
    .tp_basicsize = sizeof(Acc),
    .tp_dealloc = (destructor)acc_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Rollup accumulator: flattens outputs into counts per (group, path).",
    .tp_methods = acc_methods,
    .tp_init = (initproc)acc_init,
    .tp_new = PyType_GenericNew,
};

/* string_column(rows, index) -> (validity, offsets, data, nulls): item `index` of every tuple
 * in the list `rows`, a str or None, as the buffers of an Arrow string column: validity
 * (a bitmap, None when nothing is null), offsets int32 (one more than the rows), UTF-8 data,
 * and the number of nulls. Building the store's event columns this way instead of a list
 * per column that Arrow then converts halves what they cost per event. */
static PyObject *py_string_column(PyObject *self, PyObject *args) {
    PyObject *rows;
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &rows, &index)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows), nbytes = 0, nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || index < 0 || index >= PyTuple_GET_SIZE(row)) {
            PyErr_Format(PyExc_TypeError, "row %zd is not a tuple with an item %zd", i, index);
            return NULL;
        }
        PyObject *v = PyTuple_GET_ITEM(row, index);
        if (v == Py_None) { nulls++; continue; }
        if (!PyUnicode_Check(v)) { PyErr_Format(PyExc_TypeError, "row %zd: item %zd is not a str or None", i, index); return NULL; }
        Py_ssize_t len;
        if (PyUnicode_AsUTF8AndSize(v, &len) == NULL) return NULL;
        nbytes += len;
    }
    if (nbytes > INT32_MAX) { PyErr_SetString(PyExc_OverflowError, "a string column over 2 GiB"); return NULL; }
    PyObject *validity = NULL, *offsets = NULL, *data = NULL;
    if (nulls) {
        validity = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (!validity) return NULL;
        memset(PyBytes_AS_STRING(validity), 0, (size_t)((n + 7) / 8));
    }
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    data = PyBytes_FromStringAndSize(NULL, nbytes);
    if (!offsets || !data) goto fail;
    {
        unsigned char *pv = validity ? (unsigned char *)PyBytes_AS_STRING(validity) : NULL;
        int32_t *po = (int32_t *)PyBytes_AS_STRING(offsets);
        char *pd = PyBytes_AS_STRING(data);
        Py_ssize_t at = 0;
        po[0] = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyTuple_GET_ITEM(PyList_GET_ITEM(rows, i), index);
            if (v != Py_None) {
                Py_ssize_t len;
                const char *u = PyUnicode_AsUTF8AndSize(v, &len);  /* cached by the first pass */
                if (u == NULL) goto fail;
                memcpy(pd + at, u, (size_t)len);
                at += len;
                if (pv) pv[i >> 3] |= (unsigned char)(1u << (i & 7));
            }
            po[i + 1] = (int32_t)at;
        }
    }
    if (validity == NULL) { validity = Py_None; Py_INCREF(Py_None); }
    return Py_BuildValue("(NNNn)", validity, offsets, data, nulls);
fail:
    Py_XDECREF(validity);
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    return NULL;
}

/* ---------------------------------------------------------------------------------------
 * scan_envelope: the whole envelope from its JSON text in one pass, for the common case.
 *
 * scan_envelope(raw, max_tag, max_depth, max_array, max_key, max_leaves) ->
 *   (event_id, ts, model, prompt_version, contract, served_model, contract_version, source,
 *    run_id, agent_release, finish_reason, output_text, payload_hash) | None
 *
 * It reads the text itself instead of orjson's objects, checks the same rules as
 * check_envelope and walk, writes the output's canonical text (what orjson.dumps makes of
 * the parsed output) and hashes it, its keys put in order when they were not, with the tags,
 * as envelope._finish does. It answers
 * only for text where all of that is plainly so, and None for anything else: unknown or
 * repeated fields, attributes, escapes other than \" \\ \b \f \n \r \t (none at all in the
 * tags), numbers whose canonical form it cannot tell without formatting a double (an
 * exponent, more than 15 significant digits, a trailing zero, under 1e-4, an integer of
 * more than 18 digits), a limit crossed, text that is not JSON or not UTF-8. None sends the
 * text to the reference path (orjson and envelope.validate_envelope), which then accepts
 * it or names the fault; a property test holds the two paths to the same envelopes.
 * ------------------------------------------------------------------------------------- */

/* BLAKE2b is hashlib's (hashlib.blake2b, set at import), called through the C API: the
 * stored hashes (payload hash, made-up event ids) are hex digests of it, so one implementation
 * of the hash, the standard library's, serves both the C and the Python paths. */
static PyObject *b2_new;          /* hashlib.blake2b */
static PyObject *b2_kwnames;      /* ("digest_size",) */
static PyObject *b2_sizes[2];     /* 8 and 16 */
static PyObject *str_hexdigest;

/* The hex digest (a str) of BLAKE2b with digest_size 8 or 16 over `data` (a bytes object, not
 * stolen), or NULL with an exception set. */
static PyObject *b2_hex(PyObject *data, int size) {
    PyObject *args[3] = {NULL, data, b2_sizes[size == 16]};
    PyObject *h = PyObject_Vectorcall(b2_new, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, b2_kwnames);
    if (h == NULL) return NULL;
    PyObject *hex = PyObject_CallMethodNoArgs(h, str_hexdigest);
    Py_DECREF(h);
    return hex;
}

static PyObject *b2_hex_of(const void *p, Py_ssize_t n, int size) {
    PyObject *data = PyBytes_FromStringAndSize(p, n);
    if (data == NULL) return NULL;
    PyObject *hex = b2_hex(data, size);
    Py_DECREF(data);
    return hex;
}

static int b2_setup(void) {
    PyObject *hashlib = PyImport_ImportModule("hashlib");
    if (hashlib == NULL) return -1;
    b2_new = PyObject_GetAttrString(hashlib, "blake2b");
    Py_DECREF(hashlib);
    if (b2_new == NULL) return -1;
    if ((b2_kwnames = Py_BuildValue("(s)", "digest_size")) == NULL) return -1;
    if ((b2_sizes[0] = PyLong_FromLong(8)) == NULL || (b2_sizes[1] = PyLong_FromLong(16)) == NULL) return -1;
    if ((str_hexdigest = PyUnicode_InternFromString("hexdigest")) == NULL) return -1;
    return 0;
}

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

/* Byte classes inside a string: 0 an ASCII character that stands for itself, 1 the closing
 * quote, 2 a backslash, 3 a control character (not JSON), 4 the lead byte of a UTF-8 sequence. */
static unsigned char sc_class[256];

static void sc_init_classes(void) {
    for (int c = 0; c < 256; c++) sc_class[c] = c < 0x20 ? 3 : c >= 0x80 ? 4 : 0;
    sc_class['"'] = 1;
    sc_class['\\'] = 2;
}

static inline int sc_ws(scan_t *s) {
    const unsigned char *p0 = s->p;
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
    return s->p != p0;
}

/* The character an escape the scanner allows (\" \\ \b \f \n \r \t) stands for. */
static inline unsigned char sc_unescape(unsigned char e) {
    switch (e) {
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return e;
    }
}

/* Two keys as sc_string spans them (quotes included; only the escapes it allows) compared by
 * what they stand for, byte by byte: UTF-8 in byte order is code point order, the order of
 * Python's sorted() and of orjson's OPT_SORT_KEYS. */
static inline int sc_key_cmp(const unsigned char *a, Py_ssize_t an, const unsigned char *b, Py_ssize_t bn) {
    unsigned char fa = a[1], fb = b[1];  /* keys mostly differ in their first byte: decided here */
    if (fa != fb && fa != '\\' && fb != '\\' && fa != '"' && fb != '"') return fa < fb ? -1 : 1;
    const unsigned char *ae = a + an - 1, *be = b + bn - 1;
    a++;
    b++;
    while (a < ae && b < be) {
        unsigned char ca = *a++, cb = *b++;
        if (ca == '\\') ca = sc_unescape(*a++);
        if (cb == '\\') cb = sc_unescape(*b++);
        if (ca != cb) return ca < cb ? -1 : 1;
    }
    return (a < ae) - (b < be);
}

/* The string at s->p (its opening quote): [*start, *stop) spans it with its quotes, *chars
 * counts its code points. SC_NO for invalid UTF-8, a raw control character or an escape orjson
 * would not write back the same (\/, \u); with allow_escapes 0, for any escape. */
static int sc_string(scan_t *s, const unsigned char **start, const unsigned char **stop, Py_ssize_t *chars,
                     int allow_escapes) {
    const unsigned char *p = s->p + 1, *end = s->end;
    Py_ssize_t n = 0;
    for (;;) {
        const unsigned char *q = p;
#ifdef __SSE2__
        /* 16 bytes at a time while none is a quote, a backslash, a control or non-ASCII byte */
        const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
        while (end - p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)p);
            /* signed: bytes >= 0x80 are negative, so "less than 0x20" catches them too */
            __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                           _mm_cmplt_epi8(v, space));
            int mask = _mm_movemask_epi8(special);
            if (mask) { p += __builtin_ctz((unsigned)mask); break; }
            p += 16;
        }
#endif
        while (p < end && sc_class[*p] == 0) p++;
        n += p - q;
        if (p >= end) return SC_NO;
        unsigned char c = *p;
        switch (sc_class[c]) {
        case 1:
            *start = s->p;
            *stop = p + 1;
            *chars = n;
            s->p = p + 1;
            return 0;
        case 2: {
            if (!allow_escapes || p + 1 >= end) return SC_NO;
            unsigned char e = p[1];
            if (e != '"' && e != '\\' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't') return SC_NO;
            p += 2;
            n++;
            break;
        }
        case 3:
            return SC_NO;
        default: {
            int more;
            if (c >= 0xC2 && c <= 0xDF) more = 1;
            else if (c >= 0xE0 && c <= 0xEF) more = 2;
            else if (c >= 0xF0 && c <= 0xF4) more = 3;
            else return SC_NO;
            if (end - p <= more) return SC_NO;
            unsigned char c1 = p[1];
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) ||
                (c == 0xF4 && c1 > 0x8F))
                return SC_NO;
            for (int i = 1; i <= more; i++)
                if ((p[i] & 0xC0) != 0x80) return SC_NO;
            p += more + 1;
            n++;
        }
        }
    }
}

/* A number literal in the form orjson writes back unchanged. */
static int sc_number(scan_t *s) {
    const unsigned char *p = s->p, *end = s->end;
    int neg = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    const unsigned char *ip = p;
    if (p < end && *p == '0') p++;
    else if (p < end && *p >= '1' && *p <= '9') while (p < end && *p >= '0' && *p <= '9') p++;
    else return SC_NO;
    Py_ssize_t idig = p - ip;
    if (p < end && (*p == 'e' || *p == 'E')) return SC_NO;
    if (p < end && *p == '.') {
        const unsigned char *fp = ++p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        Py_ssize_t fdig = p - fp;
        if (fdig == 0 || (p < end && (*p == 'e' || *p == 'E'))) return SC_NO;
        if (fdig == 1 && fp[0] == '0') {          /* X.0: a whole float, written as such */
            if (idig > FLOAT_MAX_DIGITS) return SC_NO;
        } else {
            if (fp[fdig - 1] == '0') return SC_NO; /* 1.50 comes back as 1.5 */
            Py_ssize_t sig;
            if (idig == 1 && ip[0] == '0') {
                Py_ssize_t lead = 0;
                while (lead < fdig && fp[lead] == '0') lead++;
                if (lead > FLOAT_MAX_LEADING_ZEROS) return SC_NO;         /* under 1e-4: declined (see the rule) */
                sig = fdig - lead;
            } else {
                sig = idig + fdig;
            }
            if (sig > FLOAT_MAX_DIGITS) return SC_NO;            /* more digits than a double keeps */
        }
    } else {
        if (idig > INT_MAX_DIGITS) return SC_NO;               /* beyond any doubt of int64 */
        if (neg && idig == 1 && ip[0] == '0') return SC_NO; /* -0 comes back as 0 */
    }
    if (p < end && !(*p == ',' || *p == '}' || *p == ']' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        return SC_NO;
    s->p = p;
    return 0;
}

static int sc_value(scan_t *s, Py_ssize_t depth);

/* n bytes to w[wo..], wo moved on: most tokens are short, and a call to memcpy for each cost
 * more than the copy (measured); fixed-size copies of the first and last bytes compile to moves. */
static inline void sc_put(scan_t *s, const void *src, Py_ssize_t n) {
    char *d = s->w + s->wo;
    const char *c = src;
    if (n >= 8 && n <= 16) {
        uint64_t x, y;
        memcpy(&x, c, 8);
        memcpy(&y, c + n - 8, 8);
        memcpy(d, &x, 8);
        memcpy(d + n - 8, &y, 8);
    } else if (n >= 4 && n < 8) {
        uint32_t x, y;
        memcpy(&x, c, 4);
        memcpy(&y, c + n - 4, 4);
        memcpy(d, &x, 4);
        memcpy(d + n - 4, &y, 4);
    } else if (n < 4) {
        for (Py_ssize_t i = 0; i < n; i++) d[i] = c[i];
    } else {
        memcpy(d, c, (size_t)n);
    }
    s->wo += n;
}

/* The object or array at s->p, at `depth` (the output itself is 1), as walk() checks it. */
static int sc_container(scan_t *s, Py_ssize_t depth) {
    if (depth > s->max_depth) return SC_NO;
    int r;
    char *w = s->w;
    if (*s->p == '{') {
        /* keys of this object, to refuse a repeated one (raw spans: with only the escapes
         * allowed, equal text is an equal key); at[i], len[i]: where member i is in s->w */
        const unsigned char *ks[64];
        Py_ssize_t kl[64], at[64], len[64];
        int nk = 0, in_order = 1;
        s->p++;
        w[s->wo++] = '{';
        if (sc_ws(s)) s->ws = 1;
        if (s->p < s->end && *s->p == '}') { s->p++; w[s->wo++] = '}'; return 0; }
        Py_ssize_t region = s->wo;
        for (;;) {
            if (sc_ws(s)) s->ws = 1;
            if (s->p >= s->end || *s->p != '"') return SC_NO;
            const unsigned char *a, *b;
            Py_ssize_t chars;
            if ((r = sc_string(s, &a, &b, &chars, 1)) < 0) return r;
            if (chars > s->max_key || nk == 64) return SC_NO;
            for (int i = 0; i < nk; i++)
                if (kl[i] == b - a && memcmp(ks[i], a, (size_t)(b - a)) == 0) return SC_NO;
            if (nk && in_order && sc_key_cmp(ks[nk - 1], kl[nk - 1], a, b - a) > 0) in_order = 0;
            ks[nk] = a;
            kl[nk] = b - a;
            at[nk] = s->wo;
            sc_put(s, a, b - a);
            w[s->wo++] = ':';
            if (sc_ws(s)) s->ws = 1;
            if (s->p >= s->end || *s->p != ':') return SC_NO;
            s->p++;
            if ((r = sc_value(s, depth)) < 0) return r;
            len[nk] = s->wo - at[nk];
            nk++;
            if (sc_ws(s)) s->ws = 1;
            if (s->p < s->end && *s->p == ',') { s->p++; w[s->wo++] = ','; continue; }
            if (s->p < s->end && *s->p == '}') { s->p++; break; }
            return SC_NO;
        }
        if (!in_order) {  /* the members written, moved into the order of their keys */
            int idx[64];
            for (int i = 0; i < nk; i++) {  /* insertion sort: a few keys */
                int j = i;
                while (j > 0 && sc_key_cmp(ks[idx[j - 1]], kl[idx[j - 1]], ks[i], kl[i]) > 0) {
                    idx[j] = idx[j - 1];
                    j--;
                }
                idx[j] = i;
            }
            memcpy(s->tmp, w + region, (size_t)(s->wo - region));
            Py_ssize_t o = region;
            for (int i = 0; i < nk; i++) {
                if (i) w[o++] = ',';
                memcpy(w + o, s->tmp + (at[idx[i]] - region), (size_t)len[idx[i]]);
                o += len[idx[i]];
            }
            s->unsorted = 1;
        }
        w[s->wo++] = '}';
    } else {
        Py_ssize_t n = 0;
        s->p++;
        w[s->wo++] = '[';
        if (sc_ws(s)) s->ws = 1;
        if (s->p < s->end && *s->p == ']') { s->p++; w[s->wo++] = ']'; return 0; }
        for (;;) {
            if (++n > s->max_array) return SC_NO;
            if ((r = sc_value(s, depth)) < 0) return r;
            if (sc_ws(s)) s->ws = 1;
            if (s->p < s->end && *s->p == ',') { s->p++; w[s->wo++] = ','; continue; }
            if (s->p < s->end && *s->p == ']') { s->p++; break; }
            return SC_NO;
        }
        w[s->wo++] = ']';
    }
    return s->leaves > s->max_leaves ? SC_NO : 0;
}

/* A member's value or an item, inside a container at `depth`; a scalar is written as it is. */
static int sc_value(scan_t *s, Py_ssize_t depth) {
    if (sc_ws(s)) s->ws = 1;
    if (s->p >= s->end) return SC_NO;
    const unsigned char *start = s->p;
    unsigned char c = *s->p;
    if (c == '{' || c == '[') return sc_container(s, depth + 1);
    s->leaves++;
    int r = SC_NO;
    Py_ssize_t left = s->end - s->p;
    if (c == '"') {
        const unsigned char *a, *b;
        Py_ssize_t chars;
        r = sc_string(s, &a, &b, &chars, 1);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        r = sc_number(s);
    } else if (c == 't' && left >= 4 && memcmp(s->p, "true", 4) == 0) {
        s->p += 4;
        r = 0;
    } else if (c == 'f' && left >= 5 && memcmp(s->p, "false", 5) == 0) {
        s->p += 5;
        r = 0;
    } else if (c == 'n' && left >= 4 && memcmp(s->p, "null", 4) == 0) {
        s->p += 4;
        r = 0;
    }
    if (r == 0) sc_put(s, start, s->p - start);
    return r;
}

/* The canonical text of a scanned output that had white space: the same without it (outside
 * strings). `out` has room for n bytes; returns the length written. */
static Py_ssize_t sc_compact(const unsigned char *p, Py_ssize_t n, char *out) {
    Py_ssize_t o = 0;
    int in_string = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (in_string) {
            out[o++] = (char)c;
            if (c == '\\') out[o++] = (char)p[++i];
            else if (c == '"') in_string = 0;
        } else if (c == '"') {
            in_string = 1;
            out[o++] = (char)c;
        } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            out[o++] = (char)c;
        }
    }
    return o;
}

typedef struct {
    Py_ssize_t max_tag, max_depth, max_array, max_key, max_leaves;
} scan_limits;

enum { F_EVENT_ID, F_TS, F_MODEL, F_PROMPT_VERSION, F_CONTRACT, F_SERVED_MODEL, F_CONTRACT_VERSION, F_SOURCE,
       F_RUN_ID, F_AGENT_RELEASE, F_FINISH_REASON, F_TEXT, F_HASH, NFIELDS };

/* A tag's value: the one in cache[k] when it is the same text (the envelopes of a file mostly
 * repeat their tags: one object then serves them all, and its hash is computed once), else a
 * new str that takes its place there. cache NULL: always a new str. */
static PyObject *tag_value(PyObject **cache, int k, const unsigned char *a, const unsigned char *b) {
    Py_ssize_t n = b - a;
    if (cache != NULL && k != K_EVENT_ID && k != K_TS) {
        PyObject *c = cache[k];
        if (c != NULL && PyUnicode_IS_ASCII(c) && PyUnicode_GET_LENGTH(c) == n &&
            memcmp(PyUnicode_1BYTE_DATA(c), a, (size_t)n) == 0) {
            Py_INCREF(c);
            return c;
        }
    }
    PyObject *v = PyUnicode_DecodeUTF8((const char *)a, n, "strict");
    if (v != NULL && cache != NULL && k != K_EVENT_ID && k != K_TS) {
        Py_XDECREF(cache[k]);
        Py_INCREF(v);
        cache[k] = v;
    }
    return v;
}

/* One envelope's text, read in one pass: 1 with f[0..NFIELDS) set (new references, NULL for
 * None) in scan_envelope's order; 0 when it is not the plain case (nothing set); -1 with an
 * exception set. cache: see tag_value. */
static int scan_core(const unsigned char *buf, Py_ssize_t len, const scan_limits *lim, PyObject **cache,
                     PyObject **f) {
    scan_t s = {0};
    const unsigned char *out_start = NULL, *out_end = NULL;
    char *compact = NULL, *sorted = NULL, wbuf[8192];
    s.max_depth = lim->max_depth;
    s.max_array = lim->max_array;
    s.max_key = lim->max_key;
    s.max_leaves = lim->max_leaves;
    s.p = buf;
    s.end = s.p + len;
    const unsigned char *span[NKEYS][2];  /* a tag's text between its quotes; NULL: absent or null */
    int seen[NKEYS] = {0};
    memset(span, 0, sizeof span);
    PyObject *val[NKEYS] = {0}, *ts = NULL;
    int r = SC_NO, done_ok = 0;
    sc_ws(&s);
    if (s.p >= s.end || *s.p != '{') goto done;
    s.p++;
    sc_ws(&s);
    if (s.p < s.end && *s.p == '}') goto done; /* no output */
    for (;;) {
        sc_ws(&s);
        if (s.p >= s.end || *s.p != '"') goto done;
        const unsigned char *a, *b;
        Py_ssize_t chars;
        if ((r = sc_string(&s, &a, &b, &chars, 0)) < 0) goto done;
        int k = -1;
        for (int i = 0; i < NKEYS; i++)
            if ((size_t)(b - a - 2) == strlen(key_names[i]) && memcmp(a + 1, key_names[i], (size_t)(b - a - 2)) == 0) {
                k = i;
                break;
            }
        r = SC_NO;
        if (k < 0 || k == K_ATTRIBUTES || seen[k]) goto done;
        seen[k] = 1;
        sc_ws(&s);
        if (s.p >= s.end || *s.p != ':') goto done;
        s.p++;
        sc_ws(&s);
        if (s.p >= s.end) goto done;
        if (k == K_OUTPUT) {
            if (*s.p != '{') goto done;
            out_start = s.p;
            Py_ssize_t room = s.end - s.p;  /* the output's text is no longer than what is left */
            if (2 * room <= (Py_ssize_t)sizeof wbuf) {
                s.w = wbuf;
            } else if ((s.w = sorted = PyMem_Malloc(2 * (size_t)room)) == NULL) {
                PyErr_NoMemory();
                r = SC_ERR;
                goto done;
            }
            s.tmp = s.w + room;
            if ((r = sc_container(&s, 1)) < 0) goto done;
            out_end = s.p;
        } else if (*s.p == '"') {
            if ((r = sc_string(&s, &a, &b, &chars, 0)) < 0) goto done;
            span[k][0] = a + 1;
            span[k][1] = b - 1;
        } else if (s.end - s.p >= 4 && memcmp(s.p, "null", 4) == 0) {
            s.p += 4; /* as if absent (model and prompt_version are required: refused below) */
        } else {
            goto done;
        }
        r = SC_NO;
        sc_ws(&s);
        if (s.p < s.end && *s.p == ',') { s.p++; continue; }
        if (s.p < s.end && *s.p == '}') { s.p++; break; }
        goto done;
    }
    sc_ws(&s);
    if (s.p != s.end || !seen[K_OUTPUT] || span[K_MODEL][0] == NULL || span[K_PROMPT_VERSION][0] == NULL) goto done;
    for (int k = 0; k < NKEYS; k++) {
        if (span[k][0] == NULL) continue;
        val[k] = tag_value(cache, k, span[k][0], span[k][1]);
        if (val[k] == NULL) { r = SC_ERR; goto done; }
    }
    if (!plain_fields(val, lim->max_tag)) goto done;
    int64_t ts_us = 0;
    if (val[K_TS] != NULL && (ts = parse_ts(val[K_TS], &ts_us)) == NULL) {
        if (PyErr_Occurred()) r = SC_ERR;
        goto done;
    }
    {
        /* the payload hash: the output's text with its keys in order, then the tags as
         * orjson.dumps writes the list [model, prompt_version, contract or DEFAULT_CONTRACT, ts in
         * microseconds since the epoch or null, source, attributes, served_model,
         * contract_version, run_id, agent_release, finish_reason] (envelope._finish) */
        static const int order[] = {K_MODEL, K_PROMPT_VERSION, K_CONTRACT, K_TS, K_SOURCE, K_ATTRIBUTES,
                                    K_SERVED_MODEL, K_CONTRACT_VERSION, K_RUN_ID, K_AGENT_RELEASE, K_FINISH_REASON};
        const char *text_at = (const char *)out_start;
        Py_ssize_t text_len = out_end - out_start;
        if (s.ws && !s.unsorted) {  /* written with white space: the canonical text is the same without it */
            text_at = s.w;
            text_len = s.wo;
        } else if (s.ws) {  /* and its keys out of order too: w is not the text as sent */
            if ((compact = PyMem_Malloc((size_t)text_len)) == NULL) { PyErr_NoMemory(); r = SC_ERR; goto done; }
            text_len = sc_compact(out_start, text_len, compact);
            text_at = compact;
        }
        /* ts_us is positive (in the accepted range): written as an unsigned number */
        char num[24];
        int nn = 24;
        if (span[K_TS][0] != NULL) {
            uint64_t v = (uint64_t)ts_us;
            do { num[--nn] = (char)('0' + v % 10); v /= 10; } while (v);
        }
        /* the hashed text's length first, then the text itself, written once into a bytes */
        Py_ssize_t hn = s.wo + 1;
        for (size_t j = 0; j < sizeof order / sizeof order[0]; j++) {
            int k = order[j];
            hn += 1;
            if (k == K_TS && span[k][0] != NULL) hn += 24 - nn;
            else if (span[k][0] != NULL) hn += span[k][1] - span[k][0] + 2;
            else if (k == K_CONTRACT) hn += sizeof DEFAULT_CONTRACT + 1;
            else hn += 4;
        }
        PyObject *hashed = PyBytes_FromStringAndSize(NULL, hn);
        if (hashed == NULL) { r = SC_ERR; goto done; }
        char *o = PyBytes_AS_STRING(hashed);
#define PUT(src, n) (memcpy(o, (src), (size_t)(n)), o += (n))
        PUT(s.w, s.wo);  /* the keys in order; the text is stored as sent */
        for (size_t j = 0; j < sizeof order / sizeof order[0]; j++) {
            int k = order[j];
            *o++ = j ? ',' : '[';
            if (k == K_TS && span[k][0] != NULL) {
                PUT(num + nn, 24 - nn);
            } else if (span[k][0] != NULL) {
                *o++ = '"';
                PUT(span[k][0], span[k][1] - span[k][0]);
                *o++ = '"';
            } else if (k == K_CONTRACT) {
                PUT("\"" DEFAULT_CONTRACT "\"", sizeof DEFAULT_CONTRACT + 1);
            } else {
                PUT("null", 4);
            }
        }
        *o++ = ']';
#undef PUT
        PyObject *digest = b2_hex(hashed, PAYLOAD_DIGEST_SIZE);
        Py_DECREF(hashed);
        if (digest == NULL) { r = SC_ERR; goto done; }
        PyObject *text = PyUnicode_DecodeUTF8(text_at, text_len, "strict");
        if (text == NULL) {
            Py_DECREF(digest);
            r = SC_ERR;
            goto done;
        }
        static const int from[] = {K_EVENT_ID, K_TS, K_MODEL, K_PROMPT_VERSION, K_CONTRACT, K_SERVED_MODEL,
                                   K_CONTRACT_VERSION, K_SOURCE, K_RUN_ID, K_AGENT_RELEASE, K_FINISH_REASON};
        for (int j = 0; j < F_TEXT; j++) {
            int k = from[j];
            if (k == K_TS) {
                f[j] = ts;
                ts = NULL;
            } else {
                f[j] = val[k];
                val[k] = NULL;
            }
        }
        f[F_TEXT] = text;
        f[F_HASH] = digest;
        done_ok = 1;
    }
done:
    for (int k = 0; k < NKEYS; k++) Py_XDECREF(val[k]);
    Py_XDECREF(ts);
    PyMem_Free(compact);
    PyMem_Free(sorted);
    if (done_ok) return 1;
    return r == SC_ERR ? -1 : 0;
}

static PyObject *py_scan_envelope(PyObject *self, PyObject *args) {
    Py_buffer raw;
    scan_limits lim;
    PyObject *f[NFIELDS] = {0};
    if (!PyArg_ParseTuple(args, "y*nnnnn", &raw, &lim.max_tag, &lim.max_depth, &lim.max_array, &lim.max_key,
                          &lim.max_leaves))
        return NULL;
    int r = scan_core(raw.buf, raw.len, &lim, NULL, f);
    PyBuffer_Release(&raw);
    if (r < 0) return NULL;
    if (r == 0) Py_RETURN_NONE;
    PyObject *res = PyTuple_New(NFIELDS);
    if (res == NULL) {
        for (int j = 0; j < NFIELDS; j++) Py_XDECREF(f[j]);
        return NULL;
    }
    for (int j = 0; j < NFIELDS; j++) {
        if (f[j] == NULL) {
            Py_INCREF(Py_None);
            f[j] = Py_None;
        }
        PyTuple_SET_ITEM(res, j, f[j]);
    }
    return res;
}

static inline int ascii_space(unsigned char c) {  /* what bytes.strip() strips */
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

static PyObject *str_default;

/* scan_lines(text, pos, line_no, id_prefix, envelope_type, now, room, out, origin, max_event_bytes,
 *            max_tag, max_depth, max_array, max_key, max_leaves) -> (next, line_no, start, end)
 *
 * Bulk import's envelopes from a block of whole lines (bytes split at b"\n" only; the last may
 * have no newline), from offset pos on (the line before it numbered line_no): each line,
 * stripped as bytes.strip() does and skipped when blank, is read by scan_core, and its Envelope
 * (envelope_type; ts now when it has none; an event_id made from id_prefix, its number and its
 * bytes when it has none, as ingest._line_id does) appended to out and its number to origin,
 * until room envelopes were added, the text ends, or a line is not the plain case (or is over
 * max_event_bytes). Returns the offset of the next line, the number of the last line read, and
 * [start, end) of that last line when it was declined (-1, -1 otherwise): the caller's to read
 * the reference way before going on from next. No Python object is made for a line itself. */
static PyObject *py_scan_lines(PyObject *self, PyObject *args) {
    Py_buffer text;
    PyObject *prefix, *type, *now, *out, *origin;
    Py_ssize_t pos, line_no, room, max_bytes;
    scan_limits lim;
    if (!PyArg_ParseTuple(args, "y*nnUOOnO!O!nnnnnn", &text, &pos, &line_no, &prefix, &type, &now, &room,
                          &PyList_Type, &out, &PyList_Type, &origin, &max_bytes, &lim.max_tag, &lim.max_depth,
                          &lim.max_array, &lim.max_key, &lim.max_leaves))
        return NULL;
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyBuffer_Release(&text);
        PyErr_SetString(PyExc_TypeError, "envelope_type must be a tuple type");
        return NULL;
    }
    if (pos < 0 || pos > text.len) {
        PyBuffer_Release(&text);
        PyErr_SetString(PyExc_ValueError, "pos is outside the text");
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)type;
    PyObject *cache[NKEYS] = {0};
    PyObject *f[NFIELDS] = {0};
    const unsigned char *base = text.buf, *end = base + text.len;
    Py_ssize_t added = 0, dstart = -1, dend = -1;
    int failed = 0;
    while (pos < text.len && added < room) {
        const unsigned char *p = base + pos;
        const unsigned char *nl = memchr(p, '\n', (size_t)(end - p));
        Py_ssize_t a = 0, b = (nl ? nl : end) - p;
        Py_ssize_t line_at = pos;
        pos += b + (nl != NULL);
        line_no++;
        while (a < b && ascii_space(p[a])) a++;
        while (b > a && ascii_space(p[b - 1])) b--;
        if (a == b) continue;
        int r = b - a > max_bytes ? 0 : scan_core(p + a, b - a, &lim, cache, f);
        if (r < 0) { failed = 1; break; }
        if (r == 0) {
            dstart = line_at;
            dend = line_at + (nl ? nl : end) - p;
            break;
        }
        PyObject *env = NULL, *where = NULL;
        int generated = f[F_EVENT_ID] == NULL;
        if (generated) {
            PyObject *hex = b2_hex_of(p + a, b - a, LINE_ID_DIGEST_SIZE);
            if (hex != NULL) {
                f[F_EVENT_ID] = PyUnicode_FromFormat(LINE_ID_FORMAT, prefix, line_no, hex);
                Py_DECREF(hex);
            }
        }
        if (f[F_EVENT_ID] != NULL) env = tp->tp_alloc(tp, ENVELOPE_ITEMS);
        if (env != NULL) {
            PyObject *items[ENVELOPE_ITEMS] = {
                f[F_EVENT_ID], generated ? Py_True : Py_False, f[F_TS] ? f[F_TS] : now, f[F_MODEL],
                f[F_PROMPT_VERSION], f[F_CONTRACT] ? f[F_CONTRACT] : str_default, f[F_TEXT], f[F_HASH],
                f[F_SERVED_MODEL], f[F_CONTRACT_VERSION], f[F_SOURCE], f[F_RUN_ID], f[F_AGENT_RELEASE],
                f[F_FINISH_REASON], NULL, NULL};
            for (int j = 0; j < ENVELOPE_ITEMS; j++) {
                PyObject *v = items[j] ? items[j] : Py_None;
                Py_INCREF(v);
                PyTuple_SET_ITEM(env, j, v);
            }
            where = PyLong_FromSsize_t(line_no);
        }
        for (int j = 0; j < NFIELDS; j++) Py_CLEAR(f[j]);
        if (where == NULL || PyList_Append(out, env) < 0 || PyList_Append(origin, where) < 0) failed = 1;
        Py_XDECREF(env);
        Py_XDECREF(where);
        if (failed) break;
        added++;
    }
    for (int k = 0; k < NKEYS; k++) Py_XDECREF(cache[k]);
    PyBuffer_Release(&text);
    if (failed) return NULL;
    return Py_BuildValue("(nnnn)", pos, line_no, dstart, dend);
}

/* The time of a datetime since the epoch: exactly, in microseconds (*us) and truncated to
 * whole seconds (*secs), for a UTC one (what the envelope rules make of every ts); through
 * its timestamp() method otherwise (naive: local time), as round(dt.timestamp() * 1_000_000)
 * and int(dt.timestamp()) compute them. -1 with an exception set. */
static int ts_parts(PyObject *dt, int64_t *us, int64_t *secs) {
    if (!PyDateTime_Check(dt)) {
        PyErr_Format(PyExc_TypeError, "a timestamp must be a datetime, not %s", Py_TYPE(dt)->tp_name);
        return -1;
    }
    if (PyDateTime_DATE_GET_TZINFO(dt) == PyDateTime_TimeZone_UTC) {
        int64_t days = days_from_civil(PyDateTime_GET_YEAR(dt), PyDateTime_GET_MONTH(dt), PyDateTime_GET_DAY(dt));
        *us = (days * 86400 + PyDateTime_DATE_GET_HOUR(dt) * 3600 + PyDateTime_DATE_GET_MINUTE(dt) * 60 +
               PyDateTime_DATE_GET_SECOND(dt)) * 1000000 + PyDateTime_DATE_GET_MICROSECOND(dt);
        *secs = *us / 1000000;  /* C division truncates toward zero, as int() does */
        return 0;
    }
    PyObject *f = PyObject_CallMethod(dt, "timestamp", NULL);
    if (f == NULL) return -1;
    double d = PyFloat_AsDouble(f);
    Py_DECREF(f);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    *us = (int64_t)nearbyint(d * 1000000.0);  /* round half to even, as round() */
    *secs = (int64_t)d;
    return 0;
}

/* epoch_micros(rows, index) -> bytes: item `index` (a datetime) of every tuple in `rows` as
 * microseconds since the epoch, packed int64 (an Arrow column's buffer). */
static PyObject *py_epoch_micros(PyObject *self, PyObject *args) {
    PyObject *rows;
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &rows, &index)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out == NULL) return NULL;
    int64_t *p = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || index < 0 || index >= PyTuple_GET_SIZE(row)) {
            PyErr_Format(PyExc_TypeError, "row %zd is not a tuple with an item %zd", i, index);
            Py_DECREF(out);
            return NULL;
        }
        int64_t secs;
        if (ts_parts(PyTuple_GET_ITEM(row, index), &p[i], &secs) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* bucket_starts(tss, width) -> list of int: the start, in seconds since the epoch, of the
 * width-second bucket of each datetime (e - e % width, e = int(ts.timestamp())). */
static PyObject *py_bucket_starts(PyObject *self, PyObject *args) {
    PyObject *seq;
    long long width;
    if (!PyArg_ParseTuple(args, "OL", &seq, &width)) return NULL;
    if (width <= 0) { PyErr_SetString(PyExc_ValueError, "width must be positive"); return NULL; }
    PyObject *fast = PySequence_Fast(seq, "tss must be a sequence");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    PyObject *out = PyList_New(n), *last = NULL;
    long long last_start = 0;
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        int64_t us, e;
        if (ts_parts(items[i], &us, &e) < 0) { Py_CLEAR(out); break; }
        long long start = e - (((e % width) + width) % width);  /* Python's floor modulo */
        if (last == NULL || start != last_start) {  /* a run of one bucket shares one int */
            PyObject *v = PyLong_FromLongLong(start);
            if (v == NULL) { Py_CLEAR(out); break; }
            Py_XDECREF(last);
            last = v;
            last_start = start;
        }
        Py_INCREF(last);
        PyList_SET_ITEM(out, i, last);
    }
    Py_XDECREF(last);
    Py_DECREF(fast);
    return out;
}

/* group_ids(groups, cohorts, served_models, starts) -> list of int: the id of each output's
 * rollup group in `groups` (a dict, grown with new ids 0, 1, ... as keys first appear): the
 * key (model, prompt_version, contract, served_model unless absent or the model itself, start)
 * of cohort (model, prompt_version, contract), served model and bucket start. */
static PyObject *py_group_ids(PyObject *self, PyObject *args) {
    PyObject *groups, *cohorts, *served, *starts;
    if (!PyArg_ParseTuple(args, "O!OOO", &PyDict_Type, &groups, &cohorts, &served, &starts)) return NULL;
    PyObject *fc = PySequence_Fast(cohorts, "cohorts must be a sequence");
    PyObject *fs = fc ? PySequence_Fast(served, "served_models must be a sequence") : NULL;
    PyObject *fb = fs ? PySequence_Fast(starts, "starts must be a sequence") : NULL;
    PyObject *out = NULL;
    if (fb == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fc);
    if (PySequence_Fast_GET_SIZE(fs) != n || PySequence_Fast_GET_SIZE(fb) != n) {
        PyErr_SetString(PyExc_ValueError, "cohorts, served_models and starts differ in length");
        goto done;
    }
    if ((out = PyList_New(n)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PySequence_Fast_GET_ITEM(fc, i), *s = PySequence_Fast_GET_ITEM(fs, i);
        if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 3) {
            PyErr_SetString(PyExc_TypeError, "a cohort is a (model, prompt_version, contract) tuple");
            Py_CLEAR(out);
            goto done;
        }
        PyObject *model = PyTuple_GET_ITEM(c, 0), *alias = Py_None;
        if (s != Py_None && s != model) {
            int same = PyObject_RichCompareBool(s, model, Py_EQ);
            if (same < 0) { Py_CLEAR(out); goto done; }
            if (!same) alias = s;
        }
        PyObject *key = PyTuple_Pack(5, model, PyTuple_GET_ITEM(c, 1), PyTuple_GET_ITEM(c, 2), alias,
                                     PySequence_Fast_GET_ITEM(fb, i));
        PyObject *id = key ? PyDict_GetItemWithError(groups, key) : NULL;
        if (id != NULL) {
            Py_INCREF(id);
        } else if (key != NULL && !PyErr_Occurred()) {
            id = PyLong_FromSsize_t(PyDict_GET_SIZE(groups));
            if (id != NULL && PyDict_SetItem(groups, key, id) < 0) Py_CLEAR(id);
        }
        Py_XDECREF(key);
        if (id == NULL) { Py_CLEAR(out); goto done; }
        PyList_SET_ITEM(out, i, id);
    }
done:
    Py_XDECREF(fc);
    Py_XDECREF(fs);
    Py_XDECREF(fb);
    return out;
}

static PyMethodDef methods[] = {
    {"walk", py_walk, METH_VARARGS, "Count keys and leaves of a parsed output within limits, or None."},
    {"count_keys", py_count_keys, METH_O, "Count the object keys in JSON text (strings followed by a colon)."},
    {"item_spans", py_item_spans, METH_O, "The [start, end) offsets of each item of a JSON array, or None."},
    {"check_envelope", py_check_envelope, METH_VARARGS, "The fields of an envelope that is plainly valid, or None."},
    {"set_ts_range", py_set_ts_range, METH_VARARGS,
     "set_ts_range(min_us, end_us): the accepted ts, [min_us, end_us) in microseconds since the epoch."},
    {"scan_envelope", py_scan_envelope, METH_VARARGS,
     "The fields, canonical output text and payload hash of an envelope's JSON text when it is plainly valid, or None."},
    {"scan_lines", py_scan_lines, METH_VARARGS,
     "Bulk import's envelopes from a block of lines, until one is not the plain case (see the C source)."},
    {"epoch_micros", py_epoch_micros, METH_VARARGS,
     "epoch_micros(rows, index) -> bytes: item index (a datetime) of each row as int64 microseconds since the epoch."},
    {"group_ids", py_group_ids, METH_VARARGS,
     "group_ids(groups, cohorts, served_models, starts) -> list of int: each output's rollup group in groups."},
    {"bucket_starts", py_bucket_starts, METH_VARARGS,
     "bucket_starts(tss, width) -> list of int: e - e % width for e = int(ts.timestamp()) of each datetime."},
    {"string_column", py_string_column, METH_VARARGS,
     "string_column(rows, index) -> (validity, offsets, data, nulls): a str-or-None item as Arrow buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "collector._speedups", NULL, -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    volatile double gamma = NB_GAMMA; /* volatile: computed by libm here, not folded at compile time */
    nb_log_gamma = log(gamma);
    sc_init_classes();
    if (PyType_Ready(&AccType) < 0) return NULL;
    if (b2_setup() < 0) return NULL;
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL) return NULL;
    for (int k = 0; k < NKEYS; k++)
        if ((key_objs[k] = PyUnicode_InternFromString(key_names[k])) == NULL) return NULL;
    if ((str_default = PyUnicode_InternFromString(DEFAULT_CONTRACT)) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&AccType);
    if (PyModule_AddObject(m, "Acc", (PyObject *)&AccType) < 0) { Py_DECREF(&AccType); Py_DECREF(m); return NULL; }
    return m;
}
