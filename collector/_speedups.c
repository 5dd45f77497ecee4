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

enum { K_EVENT_ID, K_TS, K_MODEL, K_PROMPT_VERSION, K_CONTRACT, K_SERVED_MODEL, K_CONTRACT_VERSION,
       K_SOURCE, K_RUN_ID, K_AGENT_RELEASE, K_FINISH_REASON, K_OUTPUT, K_ATTRIBUTES, NKEYS };
static const char *key_names[NKEYS] = {"event_id", "ts", "model", "prompt_version", "contract", "served_model",
    "contract_version", "source", "run_id", "agent_release", "finish_reason", "output", "attributes"};
static PyObject *key_objs[NKEYS];
static const char *sources[] = {"production", "probe", "shadow"};

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

/* The UTC datetime of an RFC 3339 timestamp, or NULL without an exception when the text
 * is in any other form (datetime.fromisoformat, the reference, then decides). */
static PyObject *parse_ts(PyObject *v) {
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
    int64_t days = secs >= 0 ? secs / 86400 : -((-secs + 86399) / 86400);
    int64_t rest = secs - days * 86400;
    int uy, um, ud;
    civil_from_days(days, &uy, &um, &ud);
    return PyDateTimeAPI->DateTime_FromDateAndTime(uy, um, ud, (int)(rest / 3600), (int)(rest % 3600 / 60),
                                                   (int)(rest % 60), us, PyDateTime_TimeZone_UTC,
                                                   PyDateTimeAPI->DateTimeType);
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
    if (val[K_MODEL] == NULL || !good_tag(val[K_MODEL], max_tag)) Py_RETURN_NONE;
    if (val[K_PROMPT_VERSION] == NULL || !good_tag(val[K_PROMPT_VERSION], max_tag)) Py_RETURN_NONE;
    static const int optional[] = {K_CONTRACT, K_SERVED_MODEL, K_CONTRACT_VERSION, K_SOURCE, K_RUN_ID,
                                   K_AGENT_RELEASE, K_FINISH_REASON};
    for (size_t j = 0; j < sizeof optional / sizeof optional[0]; j++) {
        PyObject *t = val[optional[j]];
        if (t != NULL && !good_tag(t, max_tag)) Py_RETURN_NONE;
    }
    if (val[K_SOURCE] != NULL) {
        int known = 0;
        for (size_t j = 0; j < sizeof sources / sizeof sources[0]; j++)
            if (PyUnicode_CompareWithASCIIString(val[K_SOURCE], sources[j]) == 0) known = 1;
        if (!known) Py_RETURN_NONE;
    }
    PyObject *id = val[K_EVENT_ID];
    if (id != NULL) {
        if (!PyUnicode_CheckExact(id) || PyUnicode_GET_LENGTH(id) > 128) Py_RETURN_NONE;
        int kind = PyUnicode_KIND(id), blank = 1;
        const void *data = PyUnicode_DATA(id);
        for (Py_ssize_t i = 0; i < PyUnicode_GET_LENGTH(id) && blank; i++)
            if (!Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, i))) blank = 0;
        if (blank) Py_RETURN_NONE;
    }
    PyObject *output = val[K_OUTPUT];
    if (output == NULL || !PyDict_CheckExact(output)) Py_RETURN_NONE;
    if (walk_value(output, 1, &st) < 0) Py_RETURN_NONE;
    PyObject *ts = NULL;
    if (val[K_TS] != NULL) {
        ts = parse_ts(val[K_TS]);
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
    PyObject_HEAD
    PyObject *namer;
    PyObject *children;   /* list: parent id + 1 -> dict key -> int id */
    Py_ssize_t *items;    /* parent id + 1 -> items id + 1 (0: none yet) */
    Py_ssize_t items_cap;
    group_map *groups;
    Py_ssize_t ngroups;
    long long *counts;    /* slot * NCOUNT */
    Py_ssize_t *slot_group, *slot_path;
    PyObject *values;     /* list: slot -> dict str -> int */
    PyObject *lengths;    /* list: slot -> dict int -> int */
    Py_ssize_t nslots, cap;
    Py_ssize_t max_value_length;
    /* slot -> number bin code -> count. Numbers are the most frequent leaves, so unlike
     * values and lengths they get no dict (and no boxed key or count). */
    nb_table *numbers;
    Py_ssize_t nnumbers;  /* bins over all slots */
} Acc;

static void acc_dealloc(Acc *self) {
    Py_XDECREF(self->namer);
    Py_XDECREF(self->children);
    Py_XDECREF(self->values);
    Py_XDECREF(self->lengths);
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
    self->values = PyList_New(0);
    self->lengths = PyList_New(0);
    if (!self->children || !self->values || !self->lengths) return -1;
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
        self->cap = cap;
    }
    s = self->nslots;
    PyObject *vd = PyDict_New(), *ld = PyDict_New();
    if (!vd || !ld || PyList_Append(self->values, vd) < 0 || PyList_Append(self->lengths, ld) < 0) {
        Py_XDECREF(vd); Py_XDECREF(ld); return -1;
    }
    Py_DECREF(vd);
    Py_DECREF(ld);
    self->nslots++;
    memset(self->counts + s * NCOUNT, 0, sizeof(long long) * NCOUNT);
    memset(self->numbers + s, 0, sizeof(nb_table));
    self->slot_group[s] = group;
    self->slot_path[s] = path;
    gm->slot_of_path[path] = s + 1;
    return s;
}

static int bump(PyObject *dict, PyObject *key) {
    PyObject *n = PyDict_GetItemWithError(dict, key);
    long long v = 0;
    if (n != NULL) v = PyLong_AsLongLong(n);
    else if (PyErr_Occurred()) return -1;
    PyObject *nv = PyLong_FromLongLong(v + 1);
    int r = nv ? PyDict_SetItem(dict, key, nv) : -1;
    Py_XDECREF(nv);
    return r;
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

static int nb_count(Acc *self, Py_ssize_t slot, int32_t code) {
    if (code == NB_NONE) return 0;
    nb_table *t = &self->numbers[slot];
    if (t->used * 2 >= t->cap && nb_grow(t) < 0) return -1;
    uint32_t mask = t->cap - 1, i = nb_hash(code) & mask;
    for (;;) {
        nb_entry *e = &t->entries[i];
        if (e->n == 0) {
            e->code = code;
            e->n = 1;
            t->used++;
            self->nnumbers++;
            return 0;
        }
        if (e->code == code) { e->n++; return 0; }
        i = (i + 1) & mask;
    }
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
            if (bump(PyList_GET_ITEM(self->values, slot), v) < 0) return -1;
        } else {
            c[C_LONG]++;
        }
    } else if (PyList_CheckExact(v)) {
        c[C_ARRAY]++;
        PyObject *len = PyLong_FromSsize_t(PyList_GET_SIZE(v));
        if (!len) return -1;
        int r = bump(PyList_GET_ITEM(self->lengths, slot), len);
        Py_DECREF(len);
        if (r < 0) return -1;
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

static PyObject *acc_add(Acc *self, PyObject *args) {
    PyObject *output;
    Py_ssize_t group;
    if (!PyArg_ParseTuple(args, "O!n", &PyDict_Type, &output, &group)) return NULL;
    if (group < 0) { PyErr_SetString(PyExc_ValueError, "group must be >= 0"); return NULL; }
    if (self->namer == NULL) { PyErr_SetString(PyExc_RuntimeError, "Acc is not initialised"); return NULL; }
    if (ensure_root(self) < 0) return NULL;
    if (group >= self->ngroups) {
        group_map *gs = PyMem_Realloc(self->groups, sizeof(group_map) * (group + 1));
        if (!gs) return PyErr_NoMemory();
        memset(gs + self->ngroups, 0, sizeof(group_map) * (group + 1 - self->ngroups));
        self->groups = gs;
        self->ngroups = group + 1;
    }
    if (acc_children(self, output, group, -1) < 0) return NULL;
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

/* The number bins as three packed native arrays (bytes): slots (int64), representative
 * values (float64) and counts (int64), by slot. Not lists: a batch has several bins per
 * event, and boxing each slot, value and count cost more than counting them (Arrow
 * wraps these buffers without a copy). */
static PyObject *acc_number_rows(Acc *self) {
    Py_ssize_t n = self->nnumbers;
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
    Py_ssize_t row = 0;
    for (Py_ssize_t s = 0; s < self->nslots; s++) {
        nb_table *t = &self->numbers[s];
        for (uint32_t i = 0; i < t->cap; i++) {
            nb_entry *e = &t->entries[i];
            if (e->n == 0) continue;
            ps[row] = s;
            pv[row] = nb_value(e->code);
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
    Py_ssize_t n = 0, nbytes = 0;
    PyObject *k, *v;
    for (Py_ssize_t s = 0; s < self->nslots; s++) {
        PyObject *d = PyList_GET_ITEM(self->values, s);
        Py_ssize_t pos = 0;
        while (PyDict_Next(d, &pos, &k, &v)) {
            Py_ssize_t len;
            if (PyUnicode_AsUTF8AndSize(k, &len) == NULL) return NULL;
            n++;
            nbytes += len;
        }
    }
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
        PyObject *d = PyList_GET_ITEM(self->values, s);
        Py_ssize_t pos = 0;
        while (PyDict_Next(d, &pos, &k, &v)) {
            Py_ssize_t len;
            const char *u = PyUnicode_AsUTF8AndSize(k, &len);  /* cached by the first pass */
            long long c = PyLong_AsLongLong(v);
            if (u == NULL || (c == -1 && PyErr_Occurred())) goto fail;
            if (row >= n || at + len > nbytes) {  /* the dicts changed between the passes */
                PyErr_SetString(PyExc_RuntimeError, "value counts changed while being read");
                goto fail;
            }
            memcpy(pd + at, u, (size_t)len);
            at += len;
            ps[row] = s;
            pn[row] = c;
            po[row + 1] = (int32_t)at;
            row++;
        }
    }
    if (row != n) { PyErr_SetString(PyExc_RuntimeError, "value counts changed while being read"); goto fail; }
    return Py_BuildValue("(NNNN)", slots, offsets, data, counts);
fail:
    Py_XDECREF(slots);
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    Py_XDECREF(counts);
    return NULL;
}

/* rows(which) -> (slots, keys, counts): the per-slot dicts of `values` (which=0) or
 * `lengths` (which=1) flattened into three parallel lists, for building columns; or the
 * number bins (which=2) as three packed arrays (see acc_number_rows). */
static PyObject *acc_rows(Acc *self, PyObject *arg) {
    if (self->namer == NULL) { PyErr_SetString(PyExc_RuntimeError, "Acc is not initialised"); return NULL; }
    long which = PyLong_AsLong(arg);
    if (which == -1 && PyErr_Occurred()) return NULL;
    if (which < 0 || which > 2) { PyErr_SetString(PyExc_ValueError, "rows(which): which is 0, 1 or 2"); return NULL; }
    if (which == 2) return acc_number_rows(self);
    PyObject *src = which ? self->lengths : self->values;
    PyObject *slots = PyList_New(0), *keys = PyList_New(0), *counts = PyList_New(0);
    if (!slots || !keys || !counts) goto fail;
    for (Py_ssize_t s = 0; s < self->nslots; s++) {
        PyObject *d = PyList_GET_ITEM(src, s);
        if (PyDict_GET_SIZE(d) == 0) continue;
        PyObject *sv = PyLong_FromSsize_t(s);
        if (!sv) goto fail;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(d, &pos, &k, &v)) {
            if (PyList_Append(slots, sv) < 0 || PyList_Append(keys, k) < 0 || PyList_Append(counts, v) < 0) {
                Py_DECREF(sv);
                goto fail;
            }
        }
        Py_DECREF(sv);
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
     "rows(0|1|2) -> (slots, keys, counts) of values (0), lengths (1) or number bins (2, packed)."},
    {"add", (PyCFunction)acc_add, METH_VARARGS, "add(output: dict, group: int): count one output."},
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

static PyMethodDef methods[] = {
    {"walk", py_walk, METH_VARARGS, "Count keys and leaves of a parsed output within limits, or None."},
    {"count_keys", py_count_keys, METH_O, "Count the object keys in JSON text (strings followed by a colon)."},
    {"item_spans", py_item_spans, METH_O, "The [start, end) offsets of each item of a JSON array, or None."},
    {"check_envelope", py_check_envelope, METH_VARARGS, "The fields of an envelope that is plainly valid, or None."},
    {"string_column", py_string_column, METH_VARARGS,
     "string_column(rows, index) -> (validity, offsets, data, nulls): a str-or-None item as Arrow buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "collector._speedups", NULL, -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    volatile double gamma = NB_GAMMA; /* volatile: computed by libm here, not folded at compile time */
    nb_log_gamma = log(gamma);
    if (PyType_Ready(&AccType) < 0) return NULL;
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL) return NULL;
    for (int k = 0; k < NKEYS; k++)
        if ((key_objs[k] = PyUnicode_InternFromString(key_names[k])) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&AccType);
    if (PyModule_AddObject(m, "Acc", (PyObject *)&AccType) < 0) { Py_DECREF(&AccType); Py_DECREF(m); return NULL; }
    return m;
}
