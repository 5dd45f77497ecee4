/* Time: the RFC 3339 ts of an envelope parsed to a UTC datetime within the accepted range
 * (set from envelope.py), and datetimes back to seconds and microseconds since the epoch
 * (epoch_micros, bucket_starts). The only file that uses the datetime C API: its PyDateTimeAPI
 * is a per-file static, imported once here (time_setup). */
#include "speedups.h"
#include <datetime.h>

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

PyObject *py_set_ts_range(PyObject *self, PyObject *args) {
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "LL", &lo, &hi)) return NULL;
    if (lo < 0) {  /* scan_core writes ts_us for the payload hash as an unsigned number */
        PyErr_SetString(PyExc_ValueError, "the range of ts must start at or after the epoch");
        return NULL;
    }
    speedups_state *ms = get_state(self);
    ms->ts_min_us = lo;
    ms->ts_end_us = hi;
    Py_RETURN_NONE;
}

/* The UTC datetime of an RFC 3339 timestamp, and its microseconds since the epoch in *epoch_us
 * (when not NULL), or NULL without an exception when the text is in any other form or names a
 * time outside the accepted range (datetime.fromisoformat, the reference, then decides). */
PyObject *parse_ts(const speedups_state *ms, PyObject *v, int64_t *epoch_us) {
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
    if (at_us < ms->ts_min_us || at_us >= ms->ts_end_us) return NULL;
    if (epoch_us != NULL) *epoch_us = at_us;
    int64_t days = secs >= 0 ? secs / 86400 : -((-secs + 86399) / 86400);
    int64_t rest = secs - days * 86400;
    int uy, um, ud;
    civil_from_days(days, &uy, &um, &ud);
    return PyDateTimeAPI->DateTime_FromDateAndTime(uy, um, ud, (int)(rest / 3600), (int)(rest % 3600 / 60),
                                                   (int)(rest % 60), us, PyDateTime_TimeZone_UTC,
                                                   PyDateTimeAPI->DateTimeType);
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
PyObject *py_epoch_micros(PyObject *self, PyObject *args) {
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
PyObject *py_bucket_starts(PyObject *self, PyObject *args) {
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

int time_setup(void) {
    PyDateTime_IMPORT;
    return PyDateTimeAPI == NULL ? -1 : 0;
}
