/* The envelope's plain case, recognised in C: walk (an output's limits), check_envelope (a
 * parsed envelope), scan_envelope and scan_lines (an envelope's text, read in one pass, with its
 * canonical output text and payload hash). Each only ever answers "fine, here it is" or "look
 * closer": every error message comes from envelope.py, the one definition of the rules (their
 * copies here are in rules.h and the arrays below, checked against it by a test). */
#include "speedups.h"

/* the known fields (rules.KNOWN_FIELDS), in the order of the K_ names */
static const char *key_names[NKEYS] = {"event_id", "ts", "model", "prompt_version", "contract", "served_model",
    "contract_version", "source", "run_id", "agent_release", "finish_reason", "output", "attributes"};
static const char *sources[] = {"production", "probe", "shadow"}; /* envelope.SOURCES */

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

PyObject *py_walk(PyObject *self, PyObject *args) {
    PyObject *obj;
    walk_state st = {0};
    if (!PyArg_ParseTuple(args, "Onnnn", &obj, &st.max_depth, &st.max_array, &st.max_key, &st.max_leaves))
        return NULL;
    if (walk_value(obj, 1, &st) < 0) Py_RETURN_NONE;
    return Py_BuildValue("nni", st.keys, st.leaves, st.huge);
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

/* A tag the Python rule (rules.check_tag) accepts: str, 1..max characters, no NUL, not only
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

PyObject *py_check_envelope(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t max_tag;
    walk_state st = {0};
    if (!PyArg_ParseTuple(args, "Onnnnn", &obj, &max_tag, &st.max_depth, &st.max_array, &st.max_key,
                          &st.max_leaves))
        return NULL;
    if (!PyDict_CheckExact(obj)) Py_RETURN_NONE;
    const speedups_state *ms = get_state(self);
    PyObject *val[NKEYS];
    Py_ssize_t found = 0;
    for (int k = 0; k < NKEYS; k++) {
        val[k] = PyDict_GetItemWithError(obj, ms->key_objs[k]); /* borrowed */
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
        ts = parse_ts(ms, val[K_TS], NULL);
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
/* The hex digest (a str) of BLAKE2b with digest_size 8 or 16 over `data` (a bytes object, not
 * stolen), or NULL with an exception set. */
static PyObject *b2_hex(const speedups_state *ms, PyObject *data, int size) {
    PyObject *args[3] = {NULL, data, ms->b2_sizes[size == 16]};
    PyObject *h = PyObject_Vectorcall(ms->b2_new, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, ms->b2_kwnames);
    if (h == NULL) return NULL;
    PyObject *hex = PyObject_CallMethodNoArgs(h, ms->str_hexdigest);
    Py_DECREF(h);
    return hex;
}

static PyObject *b2_hex_of(const speedups_state *ms, const void *p, Py_ssize_t n, int size) {
    PyObject *data = PyBytes_FromStringAndSize(p, n);
    if (data == NULL) return NULL;
    PyObject *hex = b2_hex(ms, data, size);
    Py_DECREF(data);
    return hex;
}

static int b2_setup(speedups_state *ms) {
    PyObject *hashlib = PyImport_ImportModule("hashlib");
    if (hashlib == NULL) return -1;
    ms->b2_new = PyObject_GetAttrString(hashlib, "blake2b");
    Py_DECREF(hashlib);
    if (ms->b2_new == NULL) return -1;
    if ((ms->b2_kwnames = Py_BuildValue("(s)", "digest_size")) == NULL) return -1;
    if ((ms->b2_sizes[0] = PyLong_FromLong(8)) == NULL || (ms->b2_sizes[1] = PyLong_FromLong(16)) == NULL) return -1;
    if ((ms->str_hexdigest = PyUnicode_InternFromString("hexdigest")) == NULL) return -1;
    return 0;
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

/* What the first phase of a scan found in one envelope's text (pointers into that text and
 * into w): the second phase makes the envelope's Python objects from it. */
typedef struct {
    const unsigned char *span[NKEYS][2];  /* a tag's text between its quotes; NULL: absent or null */
    const unsigned char *out_start, *out_end;  /* the output's text as sent */
    char *w;         /* the output's text with its keys in order, w[0..wo) (see scan_t) */
    Py_ssize_t wo;
    int ws, unsorted;
} scanned_text;

/* The first phase: one envelope's text read in one pass, its tags located and its output checked
 * and written in key order into w. No Python object is touched, so it runs without the GIL.
 * w and tmp each have room for len bytes (the output's text is no longer). 1 with *t set; 0 when
 * it is not the plain case. */
static int scan_text(const unsigned char *buf, Py_ssize_t len, const scan_limits *lim, char *w, char *tmp,
                     scanned_text *t) {
    scan_t s = {0};
    s.max_depth = lim->max_depth;
    s.max_array = lim->max_array;
    s.max_key = lim->max_key;
    s.max_leaves = lim->max_leaves;
    s.p = buf;
    s.end = s.p + len;
    s.w = w;
    s.tmp = tmp;
    int seen[NKEYS] = {0};
    memset(t, 0, sizeof *t);
    sc_ws(&s);
    if (s.p >= s.end || *s.p != '{') return 0;
    s.p++;
    sc_ws(&s);
    if (s.p < s.end && *s.p == '}') return 0; /* no output */
    for (;;) {
        sc_ws(&s);
        if (s.p >= s.end || *s.p != '"') return 0;
        const unsigned char *a, *b;
        Py_ssize_t chars;
        if (sc_string(&s, &a, &b, &chars, 0) < 0) return 0;
        int k = -1;
        for (int i = 0; i < NKEYS; i++)
            if ((size_t)(b - a - 2) == strlen(key_names[i]) && memcmp(a + 1, key_names[i], (size_t)(b - a - 2)) == 0) {
                k = i;
                break;
            }
        if (k < 0 || k == K_ATTRIBUTES || seen[k]) return 0;
        seen[k] = 1;
        sc_ws(&s);
        if (s.p >= s.end || *s.p != ':') return 0;
        s.p++;
        sc_ws(&s);
        if (s.p >= s.end) return 0;
        if (k == K_OUTPUT) {
            if (*s.p != '{') return 0;
            t->out_start = s.p;
            if (sc_container(&s, 1) < 0) return 0;
            t->out_end = s.p;
        } else if (*s.p == '"') {
            if (sc_string(&s, &a, &b, &chars, 0) < 0) return 0;
            t->span[k][0] = a + 1;
            t->span[k][1] = b - 1;
        } else if (s.end - s.p >= 4 && memcmp(s.p, "null", 4) == 0) {
            s.p += 4; /* as if absent (model and prompt_version are required: refused below) */
        } else {
            return 0;
        }
        sc_ws(&s);
        if (s.p < s.end && *s.p == ',') { s.p++; continue; }
        if (s.p < s.end && *s.p == '}') { s.p++; break; }
        return 0;
    }
    sc_ws(&s);
    if (s.p != s.end || !seen[K_OUTPUT] || t->span[K_MODEL][0] == NULL || t->span[K_PROMPT_VERSION][0] == NULL)
        return 0;
    t->w = s.w;
    t->wo = s.wo;
    t->ws = s.ws;
    t->unsorted = s.unsorted;
    return 1;
}

/* The second phase, with the GIL: the envelope's fields from what scan_text found. 1 with
 * f[0..NFIELDS) set (new references, NULL for None) in scan_envelope's order; 0 when it is not
 * the plain case after all (a tag's rules, ts); -1 with an exception set. cache: see tag_value. */
static int scan_fields(const speedups_state *ms, const scanned_text *t, const scan_limits *lim, PyObject **cache,
                       PyObject **f) {
    PyObject *val[NKEYS] = {0}, *ts = NULL;
    char *compact = NULL;
    int r = 0;
    for (int k = 0; k < NKEYS; k++) {
        if (t->span[k][0] == NULL) continue;
        val[k] = tag_value(cache, k, t->span[k][0], t->span[k][1]);
        if (val[k] == NULL) { r = -1; goto done; }
    }
    if (!plain_fields(val, lim->max_tag)) goto done;
    int64_t ts_us = 0;
    if (val[K_TS] != NULL && (ts = parse_ts(ms, val[K_TS], &ts_us)) == NULL) {
        if (PyErr_Occurred()) r = -1;
        goto done;
    }
    /* the payload hash: the output's text with its keys in order, then the tags as
     * orjson.dumps writes the list [model, prompt_version, contract or DEFAULT_CONTRACT, ts in
     * microseconds since the epoch or null, source, attributes, served_model,
     * contract_version, run_id, agent_release, finish_reason] (envelope._finish) */
    static const int order[] = {K_MODEL, K_PROMPT_VERSION, K_CONTRACT, K_TS, K_SOURCE, K_ATTRIBUTES,
                                K_SERVED_MODEL, K_CONTRACT_VERSION, K_RUN_ID, K_AGENT_RELEASE, K_FINISH_REASON};
    const char *text_at = (const char *)t->out_start;
    Py_ssize_t text_len = t->out_end - t->out_start;
    if (t->ws && !t->unsorted) {  /* written with white space: the canonical text is the same without it */
        text_at = t->w;
        text_len = t->wo;
    } else if (t->ws) {  /* and its keys out of order too: w is not the text as sent */
        if ((compact = PyMem_Malloc((size_t)text_len)) == NULL) { PyErr_NoMemory(); r = -1; goto done; }
        text_len = sc_compact(t->out_start, text_len, compact);
        text_at = compact;
    }
    /* ts_us is positive (in the accepted range): written as an unsigned number */
    char num[24];
    int nn = 24;
    if (t->span[K_TS][0] != NULL) {
        uint64_t v = (uint64_t)ts_us;
        do { num[--nn] = (char)('0' + v % 10); v /= 10; } while (v);
    }
    /* the hashed text's length first, then the text itself, written once into a bytes */
    Py_ssize_t hn = t->wo + 1;
    for (size_t j = 0; j < sizeof order / sizeof order[0]; j++) {
        int k = order[j];
        hn += 1;
        if (k == K_TS && t->span[k][0] != NULL) hn += 24 - nn;
        else if (t->span[k][0] != NULL) hn += t->span[k][1] - t->span[k][0] + 2;
        else if (k == K_CONTRACT) hn += sizeof DEFAULT_CONTRACT + 1;
        else hn += 4;
    }
    PyObject *hashed = PyBytes_FromStringAndSize(NULL, hn);
    if (hashed == NULL) { r = -1; goto done; }
    char *o = PyBytes_AS_STRING(hashed);
#define PUT(src, n) (memcpy(o, (src), (size_t)(n)), o += (n))
    PUT(t->w, t->wo);  /* the keys in order; the text is stored as sent */
    for (size_t j = 0; j < sizeof order / sizeof order[0]; j++) {
        int k = order[j];
        *o++ = j ? ',' : '[';
        if (k == K_TS && t->span[k][0] != NULL) {
            PUT(num + nn, 24 - nn);
        } else if (t->span[k][0] != NULL) {
            *o++ = '"';
            PUT(t->span[k][0], t->span[k][1] - t->span[k][0]);
            *o++ = '"';
        } else if (k == K_CONTRACT) {
            PUT("\"" DEFAULT_CONTRACT "\"", sizeof DEFAULT_CONTRACT + 1);
        } else {
            PUT("null", 4);
        }
    }
    *o++ = ']';
#undef PUT
    PyObject *digest = b2_hex(ms, hashed, PAYLOAD_DIGEST_SIZE);
    Py_DECREF(hashed);
    if (digest == NULL) { r = -1; goto done; }
    PyObject *text = PyUnicode_DecodeUTF8(text_at, text_len, "strict");
    if (text == NULL) {
        Py_DECREF(digest);
        r = -1;
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
    r = 1;
done:
    for (int k = 0; k < NKEYS; k++) Py_XDECREF(val[k]);
    Py_XDECREF(ts);
    PyMem_Free(compact);
    return r;
}

/* One envelope's text, both phases with the GIL held (scan_envelope, scan_lines): 1 with f set
 * as scan_fields sets it; 0 when it is not the plain case; -1 with an exception set. */
static int scan_core(const speedups_state *ms, const unsigned char *buf, Py_ssize_t len, const scan_limits *lim,
                     PyObject **cache, PyObject **f) {
    char wbuf[8192], *w = wbuf;
    if (2 * len > (Py_ssize_t)sizeof wbuf && (w = PyMem_Malloc(2 * (size_t)len)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    scanned_text t;
    int r = scan_text(buf, len, lim, w, w + len, &t) ? scan_fields(ms, &t, lim, cache, f) : 0;
    if (w != wbuf) PyMem_Free(w);
    return r;
}

PyObject *py_scan_envelope(PyObject *self, PyObject *args) {
    Py_buffer raw;
    scan_limits lim;
    PyObject *f[NFIELDS] = {0};
    if (!PyArg_ParseTuple(args, "y*nnnnn", &raw, &lim.max_tag, &lim.max_depth, &lim.max_array, &lim.max_key,
                          &lim.max_leaves))
        return NULL;
    int r = scan_core(get_state(self), raw.buf, raw.len, &lim, NULL, f);
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


/* An Envelope (envelope_type) of f (references taken, f cleared), as envelope._scanned makes
 * it: ts `now` and contract DEFAULT_CONTRACT when absent; f[F_EVENT_ID] set by the caller. */
static PyObject *envelope_of(const speedups_state *ms, PyTypeObject *tp, PyObject *now, int generated,
                             PyObject **f) {
    PyObject *env = tp->tp_alloc(tp, ENVELOPE_ITEMS);
    if (env != NULL) {
        PyObject *items[ENVELOPE_ITEMS] = {
            f[F_EVENT_ID], generated ? Py_True : Py_False, f[F_TS] ? f[F_TS] : now, f[F_MODEL],
            f[F_PROMPT_VERSION], f[F_CONTRACT] ? f[F_CONTRACT] : ms->str_default, f[F_TEXT], f[F_HASH],
            f[F_SERVED_MODEL], f[F_CONTRACT_VERSION], f[F_SOURCE], f[F_RUN_ID], f[F_AGENT_RELEASE],
            f[F_FINISH_REASON], NULL, NULL};
        for (int j = 0; j < ENVELOPE_ITEMS; j++) {
            PyObject *v = items[j] ? items[j] : Py_None;
            Py_INCREF(v);
            PyTuple_SET_ITEM(env, j, v);
        }
    }
    for (int j = 0; j < NFIELDS; j++) Py_CLEAR(f[j]);
    return env;
}

/* One line scan_lines read in its first phase. */
typedef struct {
    scanned_text t;
    Py_ssize_t start, len;         /* the line stripped: text[start:start + len] */
    Py_ssize_t line_at, line_end;  /* the line as split, without its newline */
    Py_ssize_t next, line_no;      /* the offset of the line after it; its number */
} line_read;

/* scan_lines(text, pos, line_no, id_prefix, envelope_type, now, room, out, origin, max_event_bytes,
 *            max_tag, max_depth, max_array, max_key, max_leaves) -> (next, line_no, start, end)
 *
 * Bulk import's envelopes from a block of whole lines (bytes split at b"\n" only; the last may
 * have no newline), from offset pos on (the line before it numbered line_no): each line,
 * stripped as bytes.strip() does and skipped when blank, is read by scan_core, and its Envelope
 * (envelope_type; ts now when it has none; an event_id made from id_prefix, its number and its
 * bytes when it has none, as rules.line_id does) appended to out and its number to origin,
 * until room envelopes were added, the text ends, or a line is not the plain case (or is over
 * max_event_bytes). Returns the offset of the next line, the number of the last line read, and
 * [start, end) of that last line when it was declined (-1, -1 otherwise): the caller's to read
 * the reference way before going on from next. No Python object is made for a line itself.
 * The lines are read without the GIL (scan_text), then their envelopes made with it: the
 * import's storing and merging threads run their Python meanwhile. The text must not change
 * while the call runs (the import's reading thread owns its block). */
PyObject *py_scan_lines(PyObject *self, PyObject *args) {
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
    const speedups_state *ms = get_state(self);
    const unsigned char *base = text.buf, *end = base + text.len;
    /* The first phase, without the GIL: up to room lines read (scan_text), until the text ends or
     * a line is declined. Each line's output is written in key order at the line's own offset of
     * w; tmp is the scratch of one line at a time. */
    line_read *lines = NULL;
    char *w = NULL, *tmp = NULL;
    Py_ssize_t nlines = 0, dstart = -1, dend = -1, from = pos;
    int oom = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t left = text.len - pos;
    Py_ssize_t most = room < left + 1 ? room : left + 1;  /* a line holds a byte at least */
    lines = PyMem_RawMalloc((size_t)(most < 1 ? 1 : most) * sizeof *lines);
    w = PyMem_RawMalloc((size_t)(left ? left : 1));
    tmp = PyMem_RawMalloc((size_t)(left ? left : 1));
    if (lines == NULL || w == NULL || tmp == NULL) oom = 1;
    while (!oom && pos < text.len && nlines < room) {
        const unsigned char *p = base + pos;
        const unsigned char *nl = memchr(p, '\n', (size_t)(end - p));
        Py_ssize_t a = 0, b = (nl ? nl : end) - p;
        Py_ssize_t line_at = pos;
        pos += b + (nl != NULL);
        line_no++;
        while (a < b && ascii_space(p[a])) a++;
        while (b > a && ascii_space(p[b - 1])) b--;
        if (a == b) continue;
        line_read *l = &lines[nlines];
        Py_ssize_t at = line_at + a - from;  /* the line's offset in w */
        if (b - a > max_bytes || !scan_text(p + a, b - a, &lim, w + at, tmp, &l->t)) {
            dstart = line_at;
            dend = line_at + (nl ? nl : end) - p;
            break;
        }
        l->start = line_at + a;
        l->len = b - a;
        l->line_at = line_at;
        l->line_end = line_at + ((nl ? nl : end) - p);
        l->next = pos;
        l->line_no = line_no;
        nlines++;
    }
    Py_END_ALLOW_THREADS
    /* The second phase: each line's envelope. A line it declines (a tag's rules, ts) is the last:
     * the caller reads it the reference way and calls again from the line after it. */
    PyObject *cache[NKEYS] = {0}, *f[NFIELDS] = {0};
    int failed = oom;
    if (oom) PyErr_NoMemory();
    for (Py_ssize_t i = 0; !failed && i < nlines; i++) {
        const line_read *l = &lines[i];
        int r = scan_fields(ms, &l->t, &lim, cache, f);
        if (r < 0) { failed = 1; break; }
        if (r == 0) {
            pos = l->next;
            line_no = l->line_no;
            dstart = l->line_at;
            dend = l->line_end;
            break;
        }
        PyObject *env = NULL, *where = NULL;
        int generated = f[F_EVENT_ID] == NULL;
        if (generated) {
            PyObject *hex = b2_hex_of(ms, base + l->start, l->len, LINE_ID_DIGEST_SIZE);
            if (hex != NULL) {
                f[F_EVENT_ID] = PyUnicode_FromFormat(LINE_ID_FORMAT, prefix, l->line_no, hex);
                Py_DECREF(hex);
            }
        }
        if (f[F_EVENT_ID] != NULL && (env = envelope_of(ms, tp, now, generated, f)) != NULL)
            where = PyLong_FromSsize_t(l->line_no);
        for (int j = 0; j < NFIELDS; j++) Py_CLEAR(f[j]);
        if (where == NULL || PyList_Append(out, env) < 0 || PyList_Append(origin, where) < 0) failed = 1;
        Py_XDECREF(env);
        Py_XDECREF(where);
    }
    for (int k = 0; k < NKEYS; k++) Py_XDECREF(cache[k]);
    PyMem_RawFree(lines);
    PyMem_RawFree(w);
    PyMem_RawFree(tmp);
    PyBuffer_Release(&text);
    if (failed) return NULL;
    return Py_BuildValue("(nnnn)", pos, line_no, dstart, dend);
}

/* scan_items(raw, max_items, envelope_type, now, new_id, max_event_bytes, max_tag, max_depth,
 *            max_array, max_key, max_leaves) -> list[Envelope] | None
 *
 * The envelopes of a JSON array body (bytes) when every item is the plain case, in order (ts
 * `now` when absent; event_id new_id() when absent, generated True); None for anything else
 * (more than max_items items, one over max_event_bytes, one declined, a body of another shape:
 * array_items): the reference path then answers each item. The first phase (the items found,
 * each read and its output written in key order) runs without the GIL, so other threads (the
 * service's writer above all) go on meanwhile; the second makes the Python objects. */
PyObject *py_scan_items(PyObject *self, PyObject *args) {
    PyObject *body, *type, *now, *new_id;
    Py_ssize_t max_items, max_bytes;
    scan_limits lim;
    if (!PyArg_ParseTuple(args, "O!nOOOnnnnnn", &PyBytes_Type, &body, &max_items, &type, &now, &new_id,
                          &max_bytes, &lim.max_tag, &lim.max_depth, &lim.max_array, &lim.max_key, &lim.max_leaves))
        return NULL;
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "envelope_type must be a tuple type");
        return NULL;
    }
    if (!PyCallable_Check(new_id)) {
        PyErr_SetString(PyExc_TypeError, "new_id must be callable");
        return NULL;
    }
    const speedups_state *ms = get_state(self);
    /* bytes are immutable: the text cannot change while the GIL is let go */
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t len = PyBytes_GET_SIZE(body);
    Py_ssize_t *spans = NULL, n = 0, plain = 0;
    scanned_text *found = NULL;
    char *w = NULL, *tmp = NULL;
    int oom = 0;
    Py_BEGIN_ALLOW_THREADS
    n = array_items(base, len, max_items, &spans);
    if (n < 0) {
        oom = 1;
    } else if (n > 0) {
        Py_ssize_t longest = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t item = spans[2 * i + 1] - spans[2 * i];
            if (item > max_bytes) { n = 0; break; }
            if (item > longest) longest = item;
        }
        if (n > 0) {
            /* each item's output is written in key order at its own offset of w (it is no
             * longer than the item); tmp is the scratch of one item at a time */
            found = PyMem_RawMalloc((size_t)n * sizeof *found);
            w = PyMem_RawMalloc((size_t)len);
            tmp = PyMem_RawMalloc((size_t)longest);
            if (found == NULL || w == NULL || tmp == NULL) oom = 1;
            for (Py_ssize_t i = 0; !oom && i < n; i++) {
                Py_ssize_t at = spans[2 * i];
                if (!scan_text(base + at, spans[2 * i + 1] - at, &lim, w + at, tmp, &found[i])) break;
                plain++;
            }
        }
    }
    Py_END_ALLOW_THREADS
    PyObject *result = NULL, *cache[NKEYS] = {0}, *f[NFIELDS] = {0};
    if (oom) {
        PyErr_NoMemory();
        goto done;
    }
    if (n == 0 || plain < n) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if ((result = PyList_New(n)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int r = scan_fields(ms, &found[i], &lim, cache, f);
        if (r <= 0) {  /* an exception, or a tag the second phase declines: the reference decides */
            Py_SETREF(result, r < 0 ? NULL : Py_NewRef(Py_None));
            goto done;
        }
        /* an item without an event_id gets its made-up id below, once every item is taken: a
         * body the reference path answers made none (as the twin) */
        int generated = f[F_EVENT_ID] == NULL;
        if (generated) f[F_EVENT_ID] = Py_NewRef(Py_None);
        PyObject *env = envelope_of(ms, (PyTypeObject *)type, now, generated, f);
        if (env == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, env);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *env = PyList_GET_ITEM(result, i);  /* new, and seen by no one else yet */
        if (PyTuple_GET_ITEM(env, 1) != Py_True) continue;  /* generated_id */
        PyObject *id = PyObject_CallNoArgs(new_id);
        if (id != NULL && !PyUnicode_Check(id)) {
            PyErr_SetString(PyExc_TypeError, "new_id must return a str");
            Py_CLEAR(id);
        }
        if (id == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyObject *placeholder = PyTuple_GET_ITEM(env, 0);
        PyTuple_SET_ITEM(env, 0, id);
        Py_DECREF(placeholder);
    }
done:
    for (int j = 0; j < NFIELDS; j++) Py_XDECREF(f[j]);
    for (int k = 0; k < NKEYS; k++) Py_XDECREF(cache[k]);
    PyMem_RawFree(found);
    PyMem_RawFree(w);
    PyMem_RawFree(tmp);
    PyMem_RawFree(spans);
    return result;
}

int envelope_setup(speedups_state *ms) {
    if (b2_setup(ms) < 0) return -1;
    for (int k = 0; k < NKEYS; k++)
        if ((ms->key_objs[k] = PyUnicode_InternFromString(key_names[k])) == NULL) return -1;
    if ((ms->str_default = PyUnicode_InternFromString(DEFAULT_CONTRACT)) == NULL) return -1;
    return 0;
}
