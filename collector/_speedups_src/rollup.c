/* Rollups: the accumulator (Acc) that flattens outputs, parsed or as JSON text, into mergeable
 * counts per (group, path), and group_ids, each output's rollup group. */
#include "speedups.h"

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
 * (and rules.number_bin for numbers); tests hold the two to each other.
 * ------------------------------------------------------------------------------------- */

/* C_TRUE: the booleans that are true (of C_BOOLEAN), last so the older columns keep their places */
enum { C_PRESENT, C_NULL, C_BOOLEAN, C_INTEGER, C_NUMBER, C_STRING, C_ARRAY, C_OBJECT, C_LONG, C_TRUE, NCOUNT };

typedef struct {
    Py_ssize_t *slot_of_path; /* path id -> slot + 1 (0: none yet) */
    Py_ssize_t cap;
} group_map;

/* Number bins, the same as rules.number_bin (the reference; a property test holds the
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
    /* One call at a time. A counting call (add, add_json, add_many) owns the accumulator from
     * its first line to its return: `owner` is its thread, `depth` how many of them that thread
     * is in (its namer may count or read too, with the GIL held). Python code runs inside a call
     * (the namer; a generator of outputs) and may let go of the GIL, so every other thread is
     * refused meanwhile, reads included: its arrays may be half grown. add_many walks a sequence
     * of texts with the GIL released (`walking`): every call is refused then, the namer's too.
     * `released` is the thread state the walk saved, `holding` whether a step that needs Python
     * took the GIL back. Its memory is the raw allocator's, which needs no GIL. */
    unsigned long owner;
    int depth, walking;
    PyThreadState *released;
    int holding;
} Acc;

/* The steps of a walk without the GIL that need Python (a path never seen: the namer; a number
 * beyond C; an error) take it back for their while: gil_take answers whether it did, for gil_give.
 * With the GIL held all along (released NULL) both do nothing. */
static int gil_take(Acc *self) {
    if (self->released == NULL || self->holding) return 0;
    PyEval_RestoreThread(self->released);
    self->holding = 1;
    return 1;
}

static void gil_give(Acc *self, int took) {
    if (!took) return;
    self->holding = 0;
    self->released = PyEval_SaveThread();
}

static int acc_nomem(Acc *self) {
    int took = gil_take(self);
    PyErr_NoMemory();
    gil_give(self, took);
    return -1;
}

/* Whether a call may read the accumulator now (-1 and RuntimeError if not): not during a walk
 * without the GIL, nor while another thread is inside a counting call. */
static int acc_in_use(Acc *self) {
    if (!self->walking && (self->depth == 0 || self->owner == PyThread_get_thread_ident())) return 0;
    PyErr_SetString(PyExc_RuntimeError, "the accumulator is in use by another call");
    return -1;
}

/* A counting call begins (acc_leave at every return of it): checked and taken with the GIL held
 * and nothing in between that could let go of it, so no two threads both get in. */
static int acc_enter(Acc *self) {
    if (acc_in_use(self) < 0) return -1;
    self->owner = PyThread_get_thread_ident();
    self->depth++;
    return 0;
}

static PyObject *acc_leave(Acc *self, PyObject *result) {
    if (--self->depth == 0) self->owner = 0;
    return result;
}

static void acc_dealloc(Acc *self) {
    for (Py_ssize_t i = 0; i < self->kc_cap; i++) {
        for (int j = 0; j < self->kc[i].n; j++) PyMem_RawFree(self->kc[i].e[j].key);
        PyMem_RawFree(self->kc[i].e);
    }
    PyMem_RawFree(self->kc);
    Py_XDECREF(self->namer);
    Py_XDECREF(self->children);
    for (Py_ssize_t s = 0; s < self->nslots; s++) {
        PyMem_RawFree(self->lens[s].entries);
        PyMem_RawFree(self->vals[s].e);
        PyMem_RawFree(self->vals[s].idx);
    }
    PyMem_RawFree(self->vals);
    PyMem_RawFree(self->lens);
    PyMem_RawFree(self->arena);
    for (Py_ssize_t g = 0; g < self->ngroups; g++) PyMem_RawFree(self->groups[g].slot_of_path);
    for (Py_ssize_t s = 0; s < self->nslots; s++) PyMem_RawFree(self->numbers[s].entries);
    PyMem_RawFree(self->numbers);
    PyMem_RawFree(self->groups);
    PyMem_RawFree(self->items);
    PyMem_RawFree(self->counts);
    PyMem_RawFree(self->slot_group);
    PyMem_RawFree(self->slot_path);
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
        Py_ssize_t *it = PyMem_RawRealloc(self->items, sizeof(Py_ssize_t) * cap);
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
        self->items = PyMem_RawCalloc(16, sizeof(Py_ssize_t));
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
    int took = gil_take(self);
    Py_ssize_t r = new_path(self, parent, Py_None);
    gil_give(self, took);
    if (r < 0) return -2;
    self->items[parent + 1] = r + 1;
    return r;
}

static Py_ssize_t slot_of(Acc *self, Py_ssize_t group, Py_ssize_t path) {
    group_map *gm = &self->groups[group];
    if (path >= gm->cap) {
        Py_ssize_t cap = (path + 1) * 2;
        Py_ssize_t *m = PyMem_RawRealloc(gm->slot_of_path, sizeof(Py_ssize_t) * cap);
        if (!m) return acc_nomem(self);
        memset(m + gm->cap, 0, sizeof(Py_ssize_t) * (cap - gm->cap));
        gm->slot_of_path = m;
        gm->cap = cap;
    }
    Py_ssize_t s = gm->slot_of_path[path];
    if (s) return s - 1;
    if (self->nslots == self->cap) {
        Py_ssize_t cap = self->cap ? self->cap * 2 : 256;
        long long *c = PyMem_RawRealloc(self->counts, sizeof(long long) * NCOUNT * cap);
        if (!c) return acc_nomem(self);
        self->counts = c;
        Py_ssize_t *sg = PyMem_RawRealloc(self->slot_group, sizeof(Py_ssize_t) * cap);
        if (!sg) return acc_nomem(self);
        self->slot_group = sg;
        Py_ssize_t *sp = PyMem_RawRealloc(self->slot_path, sizeof(Py_ssize_t) * cap);
        if (!sp) return acc_nomem(self);
        self->slot_path = sp;
        nb_table *nt = PyMem_RawRealloc(self->numbers, sizeof(nb_table) * cap);
        if (!nt) return acc_nomem(self);
        self->numbers = nt;
        struct vt_table *vt = PyMem_RawRealloc(self->vals, sizeof(struct vt_table) * cap);
        if (!vt) return acc_nomem(self);
        self->vals = vt;
        nb_table *lt = PyMem_RawRealloc(self->lens, sizeof(nb_table) * cap);
        if (!lt) return acc_nomem(self);
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

/* Count one short string value (its UTF-8 bytes) in its slot. `valid`: the bytes are known to be
 * UTF-8 (taken as they are from a str), so a new value need not be checked. */
static int vt_bump(Acc *self, Py_ssize_t slot, const char *p, Py_ssize_t len, int valid) {
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
    if (!valid) {
        int took = gil_take(self);
        PyObject *check = PyUnicode_DecodeUTF8(p, len, "strict");
        Py_XDECREF(check);
        gil_give(self, took);
        if (check == NULL) return -1;
    }
    if (self->arena_len + len > self->arena_cap) {
        Py_ssize_t cap = self->arena_cap ? self->arena_cap * 2 : 4096;
        while (cap < self->arena_len + len) cap *= 2;
        char *a = PyMem_RawRealloc(self->arena, (size_t)cap);
        if (!a) return acc_nomem(self);
        self->arena = a;
        self->arena_cap = cap;
    }
    if (len) memcpy(self->arena + self->arena_len, p, (size_t)len);  /* "" first: no arena yet (NULL) */
    if (t->n == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 4;
        vt_entry *e = PyMem_RawRealloc(t->e, sizeof(vt_entry) * cap);
        if (!e) return acc_nomem(self);
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
        uint32_t *idx = PyMem_RawCalloc(icap, sizeof(uint32_t));
        if (!idx) return acc_nomem(self);
        for (uint32_t j = 0; j < t->n; j++) {
            uint32_t k = (uint32_t)t->e[j].hash & (icap - 1);
            while (idx[k]) k = (k + 1) & (icap - 1);
            idx[k] = j + 1;
        }
        PyMem_RawFree(t->idx);
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

/* The representative value of a bin code: what rules.number_bin returns. */
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
    nb_entry *e = PyMem_RawCalloc(cap, sizeof(nb_entry));
    if (!e) return -1;  /* the caller reports it (acc_nomem) */
    for (uint32_t j = 0; j < t->cap; j++) {
        nb_entry *old = &t->entries[j];
        if (old->n == 0) continue;
        uint32_t i = nb_hash(old->code) & (cap - 1);
        while (e[i].n) i = (i + 1) & (cap - 1);
        e[i] = *old;
    }
    PyMem_RawFree(t->entries);
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
    return tb_count(&self->numbers[slot], code, &self->nnumbers) < 0 ? acc_nomem(self) : 0;
}

static int len_count(Acc *self, Py_ssize_t slot, Py_ssize_t n) {
    if (n > INT32_MAX) {
        int took = gil_take(self);
        PyErr_SetString(PyExc_OverflowError, "an array too long to count");
        gil_give(self, took);
        return -1;
    }
    return tb_count(&self->lens[slot], (int32_t)n, &self->nlens) < 0 ? acc_nomem(self) : 0;
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
    if (PyList_GET_SIZE(v) == 0) return 0;
    Py_ssize_t child = items_id(self, path);
    if (child < 0) return -1;
    /* as Python's own loop over a list: its size read at each step and the item held, for the
     * namer (Python code, called for an item's new paths) might shorten the list meanwhile */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++) {
        PyObject *x = Py_NewRef(PyList_GET_ITEM(v, i));
        int r = acc_value(self, x, group, child);
        Py_DECREF(x);
        if (r < 0) return -1;
    }
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
        if (v == Py_True) c[C_TRUE]++;
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
            if (u == NULL || vt_bump(self, slot, u, len, 1) < 0) return -1;
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
        group_map *gs = PyMem_RawRealloc(self->groups, sizeof(group_map) * (group + 1));
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
    if (acc_enter(self) < 0) return NULL;
    int r = acc_count_dict(self, output, group);
    return acc_leave(self, r < 0 ? NULL : Py_NewRef(Py_None));
}

/* --- counting from JSON text ------------------------------------------------------------ *
 * add_json(text, group) counts one output given as JSON text, exactly as add(json.loads(text),
 * group) would (a property test holds the two together): the same paths, in the same order of
 * first appearance, the same counts, values, lengths and number bins. Bulk import and the
 * service hand over the canonical output text scan_envelope made, so no output is parsed into
 * Python objects at all. The text must be valid JSON (an object); it is not validated here. */

typedef struct {
    Acc *acc;             /* whose walk this is (for the GIL, see gil_take) */
    const unsigned char *p, *end;
    char *tmp;            /* scratch for strings with escapes and number literals */
    Py_ssize_t tmp_cap;
    int utf8;             /* the text is a str's UTF-8: its bytes between quotes are valid UTF-8 */
} jtext;

static int jt_room(jtext *t, Py_ssize_t n) {
    if (n <= t->tmp_cap) return 0;
    Py_ssize_t cap = n < 256 ? 256 : n * 2;
    char *b = PyMem_RawRealloc(t->tmp, (size_t)cap);
    if (!b) return acc_nomem(t->acc);
    t->tmp = b;
    t->tmp_cap = cap;
    return 0;
}

static inline void jt_ws(jtext *t) {
    t->p = json_skip_ws(t->p, t->end);
}

static int jt_bad(jtext *t, const char *what) {
    int took = gil_take(t->acc);
    PyErr_Format(PyExc_ValueError, "add_json: %s", what);
    gil_give(t->acc, took);
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
    if (p >= t->end) return jt_bad(t, "unterminated string");
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
            if (p - q < 4) return jt_bad(t, "short \\u escape");
            uint32_t cp = 0;
            for (int i = 0; i < 4; i++) {
                int h = hexval(q[i]);
                if (h < 0) return jt_bad(t, "bad \\u escape");
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
            if (cp >= 0xD800 && cp <= 0xDFFF) return jt_bad(t, "lone surrogate");
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
        default: return jt_bad(t, "bad escape");
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
    if (len == 0 || len > 4096) return jt_bad(t, "bad number");
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
        int took = gil_take(t->acc);
        PyObject *v = PyLong_FromString(t->tmp, NULL, 10);
        int r = v == NULL ? -1 : nb_code_of_long(v, code);
        Py_XDECREF(v);
        gil_give(t->acc, took);
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
    int took = gil_take(t->acc);
    double d = PyOS_string_to_double(t->tmp, NULL, NULL);
    int failed = d == -1.0 && PyErr_Occurred();
    gil_give(t->acc, took);
    if (failed) return -1;
    *integer = d == floor(d);
    *code = nb_code_of_double(d);
    return 0;
}

static int jt_members(Acc *self, jtext *t, Py_ssize_t group, Py_ssize_t path);

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
    if (t->p >= t->end) return jt_bad(t, "text ends early");
    unsigned char ch = *t->p;
    if (ch == 'n') { c[C_NULL]++; t->p += 4; return 0; }
    if (ch == 't') { c[C_BOOLEAN]++; c[C_TRUE]++; t->p += 4; return 0; }
    if (ch == 'f') { c[C_BOOLEAN]++; t->p += 5; return 0; }
    if (ch == '"') {
        c[C_STRING]++;
        /* without escapes (the usual case), the string is its bytes: a short one is counted
         * from them, a long one only counted */
        const unsigned char *a = t->p + 1, *q = json_quote_or_backslash(a, t->end);
        if (q < t->end && *q == '"') {
            Py_ssize_t len = q - a;
            t->p = q + 1;
            if (len <= self->max_value_length || utf8_chars(a, len) <= self->max_value_length)
                return vt_bump(self, slot, (const char *)a, len, t->utf8);
            c[C_LONG]++;
            return 0;
        }
        Py_ssize_t chars, len;
        const char *u;
        if (jt_unescape(t, &u, &len, &chars) < 0) return -1;
        if (chars <= self->max_value_length) return vt_bump(self, slot, u, len, 0);
        c = self->counts + slot * NCOUNT;
        c[C_LONG]++;
        return 0;
    }
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        int32_t code = 0;
        int integer = 0;
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
                return jt_bad(t, "bad array");
            }
        }
        return len_count(self, slot, n);
    }
    if (ch == '{') {
        c[C_OBJECT]++;
        t->p++;
        return jt_members(self, t, group, path);
    }
    return jt_bad(t, "unexpected character");
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
        struct kc_list *kc = PyMem_RawRealloc(self->kc, sizeof(struct kc_list) * (size_t)cap);
        if (!kc) return acc_nomem(self);
        memset(kc + self->kc_cap, 0, sizeof(struct kc_list) * (size_t)(cap - self->kc_cap));
        self->kc = kc;
        self->kc_cap = cap;
    }
    struct kc_list *l = &self->kc[parent + 1];
    if (l->n >= 64) return 0; /* a wide object: its keys go through the dict alone */
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        kc_entry *e = PyMem_RawRealloc(l->e, sizeof(kc_entry) * (size_t)cap);
        if (!e) return acc_nomem(self);
        l->e = e;
        l->cap = cap;
    }
    char *copy = PyMem_RawMalloc(len ? (size_t)len : 1);
    if (!copy) return acc_nomem(self);
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
        if (t->p >= t->end || *t->p != '"') return jt_bad(t, "expected a key");
        const unsigned char *key = t->p + 1, *q = key;
        while (q < t->end && *q != '"') q += *q == '\\' ? 2 : 1;
        if (q >= t->end) return jt_bad(t, "unterminated string");
        Py_ssize_t child = kc_find(self, path, key, q - key);
        if (child >= 0) {
            t->p = q + 1;
        } else {  /* a key not seen at this place: its str, the namer, the cache, with the GIL */
            Py_ssize_t chars;
            int took = gil_take(self);
            PyObject *k = jt_string(t, &chars);
            child = k == NULL ? -2 : child_id(self, path, k);
            Py_XDECREF(k);
            int failed = child < 0 || kc_add(self, path, key, q - key, child) < 0;
            gil_give(self, took);
            if (failed) return -1;
        }
        jt_ws(t);
        if (t->p >= t->end || *t->p != ':') return jt_bad(t, "expected ':'");
        t->p++;
        if (jt_value(self, t, group, child) < 0) return -1;
        jt_ws(t);
        if (t->p < t->end && *t->p == ',') { t->p++; continue; }
        if (t->p < t->end && *t->p == '}') { t->p++; return 0; }
        return jt_bad(t, "bad object");
    }
}

/* Count one output's JSON text in its group (the text as add_json takes it). */
static int acc_walk_text(Acc *self, const char *text, Py_ssize_t len, Py_ssize_t group, int utf8) {
    jtext t = {self, (const unsigned char *)text, (const unsigned char *)text + len, NULL, 0, utf8};
    jt_ws(&t);
    int r;
    if (t.p >= t.end || *t.p != '{') r = jt_bad(&t, "an output is a JSON object");
    else { t.p++; r = jt_members(self, &t, group, -1); }
    PyMem_RawFree(t.tmp);
    return r;
}

static int acc_count_text(Acc *self, const char *text, Py_ssize_t len, Py_ssize_t group, int utf8) {
    if (acc_group(self, group) < 0) return -1;
    return acc_walk_text(self, text, len, group, utf8);
}

/* add_many's outputs when every one is a str: each text and group is taken with the GIL (its
 * UTF-8, its group's map), then the texts are walked, in order, with the GIL released (the
 * service's request threads count while its writer commits). n_ok: the outputs before the first
 * that could not be taken, whose error (set) is raised after those before it are counted, as one
 * at a time would. */
typedef struct {
    const char *text;  /* a str of fo: fo, add_many's own tuple, holds it over the walk */
    Py_ssize_t len, group;
} text_item;

static int acc_count_texts(Acc *self, PyObject *fo, PyObject *fg, Py_ssize_t n) {
    text_item *items = PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof *items);
    if (items == NULL) { PyErr_NoMemory(); return -1; }
    Py_ssize_t n_ok = 0;
    for (; n_ok < n; n_ok++) {
        text_item *it = &items[n_ok];
        it->group = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fg, n_ok));
        if (it->group == -1 && PyErr_Occurred()) break;
        it->text = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(fo, n_ok), &it->len);
        if (it->text == NULL || acc_group(self, it->group) < 0) break;
    }
    PyObject *exc_type, *exc_value, *exc_tb;  /* an error of the first pass, held over the walk */
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    int r = 0;
    self->walking = 1;
    self->holding = 0;
    self->released = PyEval_SaveThread();
    for (Py_ssize_t i = 0; r == 0 && i < n_ok; i++) r = acc_walk_text(self, items[i].text, items[i].len, items[i].group, 1);
    PyEval_RestoreThread(self->released);
    self->released = NULL;
    self->walking = 0;
    PyMem_RawFree(items);
    if (r < 0) {  /* the walk's own error comes first: it is of an earlier output */
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
        return -1;
    }
    PyErr_Restore(exc_type, exc_value, exc_tb);
    return n_ok < n ? -1 : 0;
}

static PyObject *acc_add_json(Acc *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t group;
    if (!PyArg_ParseTuple(args, "On", &obj, &group)) return NULL;
    if (acc_enter(self) < 0) return NULL;
    int r;
    if (PyUnicode_Check(obj)) {
        Py_ssize_t len;
        const char *text = PyUnicode_AsUTF8AndSize(obj, &len);
        r = text == NULL ? -1 : acc_count_text(self, text, len, group, 1);
    } else if (PyBytes_Check(obj)) {
        r = acc_count_text(self, PyBytes_AS_STRING(obj), PyBytes_GET_SIZE(obj), group, 0);
    } else {
        PyErr_Format(PyExc_TypeError, "an output's text is str or bytes, not %.100s", Py_TYPE(obj)->tp_name);
        r = -1;
    }
    return acc_leave(self, r < 0 ? NULL : Py_NewRef(Py_None));
}

/* A tuple of a sequence's items as they are at the call (a list copied): the namer is Python
 * and may change the caller's list while its items are counted. */
static PyObject *items_now(PyObject *seq, const char *what) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL || !PyList_CheckExact(fast)) return fast;
    PyObject *t = PyList_AsTuple(fast);
    Py_DECREF(fast);
    return t;
}

/* add_many(outputs, groups): add_json(text, group) or add(dict, group) of each pair, in order, of
 * the outputs and groups as they are when it is called. */
static PyObject *acc_add_many(Acc *self, PyObject *args) {
    PyObject *outputs, *groups;
    if (!PyArg_ParseTuple(args, "OO", &outputs, &groups)) return NULL;
    if (acc_enter(self) < 0) return NULL;
    PyObject *fo = items_now(outputs, "outputs must be a sequence");
    if (fo == NULL) return acc_leave(self, NULL);
    PyObject *fg = items_now(groups, "groups must be a sequence");
    if (fg == NULL) { Py_DECREF(fo); return acc_leave(self, NULL); }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fo);
    int r = 0;
    if (PySequence_Fast_GET_SIZE(fg) != n) {
        PyErr_SetString(PyExc_ValueError, "outputs and groups differ in length");
        r = -1;
    }
    int texts = r == 0;
    for (Py_ssize_t i = 0; texts && i < n; i++) texts = PyUnicode_Check(PySequence_Fast_GET_ITEM(fo, i));
    if (texts) {
        r = acc_count_texts(self, fo, fg, n);
        n = 0;
    }
    for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(fo, i);
        Py_ssize_t g = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fg, i));
        if (g == -1 && PyErr_Occurred()) { r = -1; break; }
        if (PyUnicode_Check(o)) {
            Py_ssize_t len;
            const char *text = PyUnicode_AsUTF8AndSize(o, &len);
            r = text == NULL ? -1 : acc_count_text(self, text, len, g, 1);
        } else {
            r = acc_count_dict(self, o, g);
        }
    }
    Py_DECREF(fo);
    Py_DECREF(fg);
    return acc_leave(self, r < 0 ? NULL : Py_NewRef(Py_None));
}

/* counts() -> list of (group, path, present, null, boolean, integer, number, string, array, object, long, true) */
static PyObject *acc_counts(Acc *self, PyObject *unused) {
    if (acc_in_use(self) < 0) return NULL;
    PyObject *out = PyList_New(self->nslots);
    if (!out) return NULL;
    for (Py_ssize_t s = 0; s < self->nslots; s++) {
        long long *c = self->counts + s * NCOUNT;
        PyObject *row = Py_BuildValue("(nnLLLLLLLLLL)", self->slot_group[s], self->slot_path[s],
                                      c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9]);
        if (!row) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, s, row);
    }
    return out;
}

/* count_rows() -> bytes: counts() packed, one row of 2 + NCOUNT native int64 per slot (group,
 * path, then the counts in counts()' order): a batch of sparse traffic holds a slot per output
 * and path, and a tuple of twelve boxed ints per slot cost more than counting them. */
static PyObject *acc_count_rows(Acc *self, PyObject *Py_UNUSED(ignored)) {
    if (acc_in_use(self) < 0) return NULL;
    if (self->namer == NULL) { PyErr_SetString(PyExc_RuntimeError, "Acc is not initialised"); return NULL; }
    PyObject *out = PyBytes_FromStringAndSize(NULL, self->nslots * (2 + NCOUNT) * 8);
    if (!out) return NULL;
    int64_t *p = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t s = 0; s < self->nslots; s++) {
        *p++ = self->slot_group[s];
        *p++ = self->slot_path[s];
        const long long *c = self->counts + s * NCOUNT;
        for (int k = 0; k < NCOUNT; k++) *p++ = c[k];
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
    if (acc_in_use(self) < 0) return NULL;
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
    if (acc_in_use(self) < 0) return NULL;
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
    {"counts", (PyCFunction)acc_counts, METH_NOARGS, "Per slot: (group, path, ten counts); slot i is row i."},
    {"count_rows", (PyCFunction)acc_count_rows, METH_NOARGS,
     "count_rows() -> bytes: counts() packed, 12 native int64 per slot."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject AccType = {
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

/* group_ids(groups, cohorts, served_models, starts) -> list of int: the id of each output's
 * rollup group in `groups` (a dict, grown with new ids 0, 1, ... as keys first appear): the
 * key (model, prompt_version, contract, source, served_model unless absent or the model itself,
 * start) of cohort (model, prompt_version, contract, source), served model and bucket start. */
PyObject *py_group_ids(PyObject *self, PyObject *args) {
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
        if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 4) {
            PyErr_SetString(PyExc_TypeError, "a cohort is a (model, prompt_version, contract, source) tuple");
            Py_CLEAR(out);
            goto done;
        }
        PyObject *model = PyTuple_GET_ITEM(c, 0), *alias = Py_None;
        if (s != Py_None && s != model) {
            int same = PyObject_RichCompareBool(s, model, Py_EQ);
            if (same < 0) { Py_CLEAR(out); goto done; }
            if (!same) alias = s;
        }
        PyObject *key = PyTuple_Pack(6, model, PyTuple_GET_ITEM(c, 1), PyTuple_GET_ITEM(c, 2),
                                     PyTuple_GET_ITEM(c, 3), alias, PySequence_Fast_GET_ITEM(fb, i));
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

int rollup_setup(void) {
    volatile double gamma = NB_GAMMA; /* volatile: computed by libm here, not folded at compile time */
    nb_log_gamma = log(gamma);
    return PyType_Ready(&AccType);
}
