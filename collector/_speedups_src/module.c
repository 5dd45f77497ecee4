/* shapewatch.collector._speedups: the C accelerator of the collector's hot loops.
 *
 * It exists because a Python-level walk costs several microseconds per output, more than
 * orjson's parse itself, and bulk import must run within a few times the parse floor. Its
 * interface is _speedups.pyi; collector/_pyspeedups.py is its pure-Python twin, with the same
 * results (collector/accel.py picks one). The files, by concern:
 *   rules.h     the envelope rules copied from Python (a test holds them to it)
 *   json.c      reading JSON text: the envelope scanner's tokenizer, count_keys, item_spans,
 *               array_items
 *   envelope.c  walk, check_envelope, scan_envelope, scan_lines, scan_items, the payload hash
 *   time.c      RFC 3339 ts, epoch_micros, bucket_starts
 *   rollup.c    Acc (the rollup accumulator, with its own reader of JSON text), group_ids
 *   arrow.c     string_column
 *   module.c    this: the method table and the module's start
 */
#include "speedups.h"

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
    {"scan_items", py_scan_items, METH_VARARGS,
     "The envelopes of a JSON array body when every item is the plain case, or None (see the C source)."},
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

/* The state's objects, for the garbage collector and for the module's end. */
#define STATE_OBJECTS(ms, VISIT)                                                                        \
    do {                                                                                                \
        for (int k = 0; k < NKEYS; k++) VISIT((ms)->key_objs[k]);                                       \
        VISIT((ms)->str_default);                                                                       \
        VISIT((ms)->b2_new);                                                                            \
        VISIT((ms)->b2_kwnames);                                                                        \
        VISIT((ms)->b2_sizes[0]);                                                                       \
        VISIT((ms)->b2_sizes[1]);                                                                       \
        VISIT((ms)->str_hexdigest);                                                                     \
    } while (0)

static int module_traverse(PyObject *m, visitproc visit, void *arg) {
    speedups_state *ms = get_state(m);
    if (ms != NULL) STATE_OBJECTS(ms, Py_VISIT);
    return 0;
}

static int module_clear(PyObject *m) {
    speedups_state *ms = get_state(m);
    if (ms != NULL) STATE_OBJECTS(ms, Py_CLEAR);
    return 0;
}

static void module_free(void *m) { module_clear((PyObject *)m); }

/* Runs on the module object the import machinery made, its state zeroed. */
static int module_exec(PyObject *m) {
    sc_init_classes();
    if (rollup_setup() < 0 || time_setup() < 0 || envelope_setup(get_state(m)) < 0) return -1;
    return PyModule_AddType(m, &AccType);
}

static PyModuleDef_Slot slots[] = {{Py_mod_exec, module_exec}, {0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "collector._speedups",
    .m_size = sizeof(speedups_state),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModuleDef_Init(&module); }
