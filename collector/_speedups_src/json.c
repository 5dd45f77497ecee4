/* JSON text, read without building Python objects: the envelope scanner's tokenizer (sc_*:
 * strings, numbers in the form orjson writes back, objects and arrays within the limits, the
 * output's sorted text written as it is read), and the two walks envelope.parse_body makes over
 * a body orjson already accepted (count_keys, item_spans). Acc.add_json's own reader is in
 * rollup.c: it counts as it reads, so it is written against the accumulator. */
#include "speedups.h"

/* count_keys(raw: bytes) -> int
 * The number of object keys in JSON text that orjson already accepted: string tokens
 * followed (after optional blanks) by a colon. Strings are skipped with their escapes,
 * so quotes and colons inside values never count. Compared with the keys orjson kept,
 * a difference means a duplicate key was merged. */
PyObject *py_count_keys(PyObject *self, PyObject *arg) {
    char *buf;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(arg, &buf, &len) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)buf, *end = p + len;
    long count = 0;
    while (p < end) {
        const unsigned char *q = memchr(p, '"', (size_t)(end - p));
        if (q == NULL) break;
        const unsigned char *r = json_string_end(q + 1, end);
        if (r == NULL) break; /* a string that does not close: no colon after it */
        r = json_skip_ws(r, end);
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
PyObject *py_item_spans(PyObject *self, PyObject *arg) {
    char *buf;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(arg, &buf, &len) < 0) return NULL;
    Py_ssize_t i = 0, depth = 0, start = -1, last = -1;
    i = json_skip_ws((const unsigned char *)buf, (const unsigned char *)buf + len) - (const unsigned char *)buf;
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
            const unsigned char *text = (const unsigned char *)buf;
            const unsigned char *after = json_string_end(text + i + 1, text + len);
            if (after == NULL) break; /* it does not close */
            i = after - text - 1;     /* its closing quote */
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

/* The objects of a JSON array body: (*spans)[2i], (*spans)[2i + 1] are the [start, end) offsets of
 * item i, for text that is white space, "[", objects separated by commas and white space, "]" and
 * white space (JSON's white space only). Returns the number of items; 0 for text of another
 * shape (an empty array, an item that is not an object, text around it: the reference path
 * reads those), or when there are more than max_items; -1 when memory ran out. An item's end is
 * found by counting brackets outside strings: the scanner then reads each item whole, and
 * declines any that is not one JSON object. No Python object is touched (it runs without the
 * GIL); *spans is the caller's to free with PyMem_RawFree. */
Py_ssize_t array_items(const unsigned char *p, Py_ssize_t len, Py_ssize_t max_items, Py_ssize_t **spans) {
    const unsigned char *base = p, *end = p + len;
    Py_ssize_t n = 0, cap = 0, *out = NULL;
    *spans = NULL;
    p = json_skip_ws(p, end);
    if (p >= end || *p != '[') return 0;
    p = json_skip_ws(p + 1, end);
    for (;;) {
        if (p >= end || *p != '{' || n >= max_items) goto other;
        const unsigned char *start = p;
        Py_ssize_t depth = 0;
        do {
            unsigned char c = *p++;
            if (c == '"') {
                if ((p = json_string_end(p, end)) == NULL) goto other;
            } else if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                depth--;
            }
        } while (depth > 0 && p < end);
        if (depth != 0) goto other;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            Py_ssize_t *grown = PyMem_RawRealloc(out, 2 * (size_t)cap * sizeof *out);
            if (grown == NULL) {
                PyMem_RawFree(out);
                return -1;
            }
            out = grown;
        }
        out[2 * n] = start - base;
        out[2 * n + 1] = p - base;
        n++;
        p = json_skip_ws(p, end);
        if (p < end && *p == ',') {
            p = json_skip_ws(p + 1, end);
            continue;
        }
        if (p < end && *p == ']' && json_skip_ws(p + 1, end) == end) break;
        goto other;
    }
    *spans = out;
    return n;
other:
    PyMem_RawFree(out);
    return 0;
}

/* Byte classes inside a string: 0 an ASCII character that stands for itself, 1 the closing
 * quote, 2 a backslash, 3 a control character (not JSON), 4 the lead byte of a UTF-8 sequence. */
static unsigned char sc_class[256];

void sc_init_classes(void) {
    for (int c = 0; c < 256; c++) sc_class[c] = c < 0x20 ? 3 : c >= 0x80 ? 4 : 0;
    sc_class['"'] = 1;
    sc_class['\\'] = 2;
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
int sc_string(scan_t *s, const unsigned char **start, const unsigned char **stop, Py_ssize_t *chars,
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
int sc_container(scan_t *s, Py_ssize_t depth) {
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
 * strings). `out` has room for n bytes; returns the length written. The text was checked in the
 * scan's first phase; a backslash as its last byte (which that check rules out) is copied alone,
 * so that even a text changed since never writes past n. */
Py_ssize_t sc_compact(const unsigned char *p, Py_ssize_t n, char *out) {
    Py_ssize_t o = 0;
    int in_string = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (in_string) {
            out[o++] = (char)c;
            if (c == '\\' && i + 1 < n) out[o++] = (char)p[++i];
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

