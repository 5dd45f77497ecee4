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
 * The number of `":` pairs in the text, or -1 when the text has an escaped quote
 * or blanks between a closing quote and a colon (then the count may not equal
 * the number of keys, and the caller re-parses exactly). */
static PyObject *py_count_keys(PyObject *self, PyObject *arg) {
    char *buf;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(arg, &buf, &len) < 0) return NULL;
    const char *p = buf, *end = buf + len;
    long count = 0;
    int closing = 0; /* with no escaped quote, quotes alternate: opening, closing */
    while (p < end) {
        const char *q = memchr(p, '"', (size_t)(end - p));
        if (q == NULL) break;
        if (q > buf && q[-1] == '\\') return PyLong_FromLong(-1);
        if (closing) {
            const char *r = q + 1;
            if (r < end && *r == ':') {
                count++;
            } else {
                while (r < end && (*r == ' ' || *r == '\t' || *r == '\n' || *r == '\r')) r++;
                if (r < end && *r == ':') return PyLong_FromLong(-1);
            }
        }
        closing = !closing;
        p = q + 1;
    }
    return PyLong_FromLong(count);
}

static PyMethodDef methods[] = {
    {"walk", py_walk, METH_VARARGS, "Count keys and leaves of a parsed output within limits, or None."},
    {"count_keys", py_count_keys, METH_O, "Count `\":` in JSON text, or -1 when that is not exact."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "collector._speedups", NULL, -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
