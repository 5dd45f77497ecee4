/* Arrow: columns of the store's event batches built as Arrow buffers in one pass. */
#include "speedups.h"

/* string_column(rows, index) -> (validity, offsets, data, nulls): item `index` of every tuple
 * in the list `rows`, a str or None, as the buffers of an Arrow string column: validity
 * (a bitmap, None when nothing is null), offsets int32 (one more than the rows), UTF-8 data,
 * and the number of nulls. Building the store's event columns this way instead of a list
 * per column that Arrow then converts halves what they cost per event. */
PyObject *py_string_column(PyObject *self, PyObject *args) {
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

