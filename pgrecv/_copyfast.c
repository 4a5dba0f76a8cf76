/* pgrecv's native encoders, one module with one boundary: pgrecv.native imports it (or not).
 *
 * The value encoders in the middle turn a value's text (or binary send form) into the JSON that
 * pgrecv.output.jsonl.JsonlEncoder writes for it, byte for byte, for each kind of pgrecv.output.format:
 * integers, quoted and escaped strings, booleans, floats, json/jsonb, bytea, arrays. A value an
 * encoder does not do exactly returns FALLBACK, and the reference's converter (a Python callable
 * of pgrecv.output.values) makes it; a row or block they cannot do is declined (None), and the caller
 * takes the reference path, which also reports every error. Tests prove all paths identical.
 *
 * Two users:
 *  - encode_row(): a pgoutput Insert/Update/Delete message straight to its JSONL line (the
 *    stream's hot path, pgrecv.output.fastpath), every length bounds-checked; pump() runs it over
 *    the row changes buffered in libpq, the bulk of a transaction (pgrecv.stream.streamer);
 *  - encode(): blocks of COPY text lines to snapshot JSON lines (pgrecv.snapshot.fast).
 *
 * read(): libpq hands out COPY data one CopyData message, that is one row, per PQgetCopyData
 * call; from Python each call costs a tuple, a memoryview and a buffer object. read() makes those
 * calls in a C loop, without the GIL, and returns many rows as one bytes object.
 *
 * It must call the very libpq that created the connection (PGconn is opaque and its layout
 * changes between releases), so nothing is linked at build time: bind() takes the path of the
 * libpq already loaded in the process and looks its functions up with dlopen(RTLD_NOLOAD).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*get_copy_data_fn)(void *conn, char **buffer, int async);
typedef void (*freemem_fn)(void *ptr);
typedef int (*backend_pid_fn)(const void *conn);

static get_copy_data_fn get_copy_data = NULL;
static freemem_fn freemem = NULL;
static backend_pid_fn backend_pid = NULL;

static PyObject *
bind(PyObject *Py_UNUSED(self), PyObject *args)
{
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "libpq is not loaded from %s", path);
        return NULL;
    }
    get_copy_data_fn g = (get_copy_data_fn)dlsym(lib, "PQgetCopyData");
    freemem_fn f = (freemem_fn)dlsym(lib, "PQfreemem");
    backend_pid_fn b = (backend_pid_fn)dlsym(lib, "PQbackendPID");
    /* The handle stays open: the library is psycopg's and stays loaded for the process's life. */
    if (g == NULL || f == NULL || b == NULL) {
        PyErr_Format(PyExc_OSError, "%s does not export the libpq functions needed", path);
        return NULL;
    }
    get_copy_data = g;
    freemem = f;
    backend_pid = b;
    Py_RETURN_NONE;
}

static void *
conn_arg(PyObject *arg)
{
    if (get_copy_data == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind() was not called");
        return NULL;
    }
    void *conn = PyLong_AsVoidPtr(arg);
    if (conn == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "the connection is closed");
    return conn;
}

/* backend_pid(pgconn_ptr) -> int: lets the caller check that bind() found psycopg's libpq. */
static PyObject *
pid(PyObject *Py_UNUSED(self), PyObject *arg)
{
    void *conn = conn_arg(arg);
    if (conn == NULL)
        return NULL;
    return PyLong_FromLong(backend_pid(conn));
}

/* read(pgconn_ptr, limit) -> (status, bytes)
 *
 * Takes CopyData messages from libpq's input buffer until they add up to at least `limit` bytes
 * (status 1), the buffer has no whole message (0: wait for the socket, consume input, call
 * again), the COPY is over (-1: collect the result) or libpq failed (-2). The bytes are the rows
 * taken, whole, whatever the status.
 */
static PyObject *
read_copy(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *ptr;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "On", &ptr, &limit))
        return NULL;
    void *conn = conn_arg(ptr);
    if (conn == NULL)
        return NULL;
    if (limit < 1)
        limit = 1;
    /* Small at first (a call mostly gets what one socket read brought), doubled when needed. */
    size_t cap = limit < 65536 ? (size_t)limit + 1024 : 65536, len = 0;
    char *out = malloc(cap);
    if (out == NULL)
        return PyErr_NoMemory();
    int status = 1, nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    while ((Py_ssize_t)len < limit) {
        char *row = NULL;
        int n = get_copy_data(conn, &row, 1);
        if (n <= 0) {
            status = n == 0 ? 0 : (n == -1 ? -1 : -2);
            if (row != NULL)
                freemem(row);
            break;
        }
        if (len + (size_t)n > cap) {
            size_t want = cap * 2 > len + (size_t)n ? cap * 2 : len + (size_t)n;
            char *bigger = realloc(out, want);
            if (bigger == NULL) {
                /* This row is lost from libpq's buffer: the caller must give up the COPY. */
                freemem(row);
                nomem = 1;
                break;
            }
            out = bigger;
            cap = want;
        }
        memcpy(out + len, row, (size_t)n);
        len += (size_t)n;
        freemem(row);
    }
    Py_END_ALLOW_THREADS
    if (nomem) {
        free(out);
        return PyErr_NoMemory();
    }
    PyObject *data = PyBytes_FromStringAndSize(out, (Py_ssize_t)len);
    free(out);
    if (data == NULL)
        return NULL;
    return Py_BuildValue("(iN)", status, data);
}

/* ---- value encoders, shared by the snapshot's block encoder and the row encoder ------------- */

/* Column kinds, as numbered in pgrecv.output.format.Kind and BinaryKind. */
/* SHORTEST is FLOAT from a server whose float8out writes the shortest exact text (12+), see short_float. */
enum { RAW = 0, QUOTE = 1, BOOL = 2, TEXT = 3, OTHER = 4, FLOAT = 5, JSON = 6, BYTEA = 7, ARRAY = 8, SHORTEST = 9 };
enum { B_PY = 0, B_INT2, B_INT4, B_INT8, B_UINT4, B_UINT8, B_BOOL, B_FLOAT8, B_UTF8, B_BYTEA, B_JSON, B_JSONB,
       B_UUID };
/* What an encoder returns: done, "the Python converter must do this value", "decline the row". */
enum { OK = 0, FALLBACK = 1, DECLINE = -1 };

typedef struct {
    const char *ptr;
    Py_ssize_t len;
} piece;

/* A growable output buffer (malloc'd: usable without the GIL). */
typedef struct {
    char *p;
    Py_ssize_t len, cap;
    int borrowed; /* p is somebody else's memory (a bytearray's): copied out when it must grow */
} obuf;

static int
grow(obuf *b, Py_ssize_t more)
{
    if (more > PY_SSIZE_T_MAX / 4 - b->len)
        return -1;
    Py_ssize_t want = b->cap ? b->cap : 1024;
    while (want - b->len < more)
        want *= 2;
    char *q;
    if (b->borrowed) {
        q = malloc((size_t)want);
        if (q != NULL && b->len)
            memcpy(q, b->p, (size_t)b->len);
    } else {
        q = realloc(b->p, (size_t)want);
    }
    if (q == NULL)
        return -1;
    b->p = q;
    b->cap = want;
    b->borrowed = 0;
    return 0;
}

static void
release(obuf *b)
{
    if (!b->borrowed)
        free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

#define NEED(b, n)                                                                                               \
    do {                                                                                                         \
        if ((b)->cap - (b)->len < (Py_ssize_t)(n) && grow((b), (Py_ssize_t)(n)) < 0)                            \
            return DECLINE;                                                                                      \
    } while (0)

static inline void
add(obuf *b, const char *src, Py_ssize_t n)
{
    if (n == 0) /* b->p may still be NULL: memcpy(NULL, ..., 0) is undefined */
        return;
    memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
}

static int
put(obuf *b, const char *src, Py_ssize_t n)
{
    NEED(b, n);
    add(b, src, n);
    return OK;
}

/* Is s[0:n] UTF-8 as Python decodes it (no overlong forms, no surrogates, nothing past U+10FFFF)? */
static int
valid_utf8(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        int more;
        unsigned char lo = 0x80, hi = 0xBF; /* the range of the byte after c */
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            more = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else {
            return 0;
        }
        if (n - i <= more || s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (int k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += more + 1;
    }
    return 1;
}

static int
ascii_only(const unsigned char *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] & 0x80)
            return 0;
    return 1;
}

static const char HEX[] = "0123456789abcdef";

/* A JSON string of valid UTF-8 s[0:n], escaped as orjson escapes a str: \" \\ \b \t \n \f \r,
 * \u00XX for the other control bytes, everything else as it is. */
static int
put_string(obuf *o, const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && s[i] >= 0x20 && s[i] != '"' && s[i] != '\\')
        i++;
    NEED(o, i == n ? n + 2 : n * 6 + 2);
    o->p[o->len++] = '"';
    add(o, (const char *)s, i);
    char *w = o->p + o->len;
    for (; i < n; i++) {
        unsigned char c = s[i];
        switch (c) {
        case '"': *w++ = '\\'; *w++ = '"'; break;
        case '\\': *w++ = '\\'; *w++ = '\\'; break;
        case '\b': *w++ = '\\'; *w++ = 'b'; break;
        case '\t': *w++ = '\\'; *w++ = 't'; break;
        case '\n': *w++ = '\\'; *w++ = 'n'; break;
        case '\f': *w++ = '\\'; *w++ = 'f'; break;
        case '\r': *w++ = '\\'; *w++ = 'r'; break;
        default:
            if (c < 0x20) {
                memcpy(w, "\\u00", 4);
                w[4] = HEX[c >> 4];
                w[5] = HEX[c & 15];
                w += 6;
            } else {
                *w++ = (char)c;
            }
        }
    }
    *w++ = '"';
    o->len = w - o->p;
    return OK;
}

/* int(text) as orjson writes it, for the canonical decimal text the server sends; anything else
 * (a leading zero, "-0", a sign "+", spaces, 19 digits or more) is left to int() itself. */
static int
enc_int(obuf *o, const char *s, Py_ssize_t n)
{
    Py_ssize_t i = n > 0 && s[0] == '-';
    Py_ssize_t digits = n - i;
    if (digits < 1 || digits > 18 || (s[i] == '0' && (digits > 1 || i)))
        return FALLBACK;
    for (Py_ssize_t k = i; k < n; k++)
        if (s[k] < '0' || s[k] > '9')
            return FALLBACK;
    return put(o, s, n);
}

/* A finite double as orjson writes it, by orjson itself: shortest round-trip digits in orjson's
 * own layout (1e-7, 0.00001, 1e+16), and a call costs less than Python's own float formatting.
 * It needs the GIL: the snapshot's encoder, which runs without it (so that the COPY reader thread
 * keeps the socket drained), sets gil_released and the GIL is taken for the call alone. */
static PyObject *orjson_dumps = NULL;
static _Thread_local int gil_released = 0;

/* Append dumps(x) (bytes: orjson.dumps) and release x; DECLINE on any failure. GIL held. */
static int
put_dumped(obuf *o, PyObject *dumps, PyObject *x)
{
    PyObject *b = PyObject_CallOneArg(dumps, x);
    Py_DECREF(x);
    if (b == NULL || !PyBytes_Check(b)) {
        Py_XDECREF(b);
        PyErr_Clear();
        return DECLINE;
    }
    int rc = put(o, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
    Py_DECREF(b);
    return rc;
}

static int put_double_locked(obuf *o, double d);

static int
put_double(obuf *o, double d)
{
    if (!gil_released)
        return put_double_locked(o, d);
    PyGILState_STATE state = PyGILState_Ensure();
    int rc = put_double_locked(o, d);
    PyGILState_Release(state);
    return rc;
}

static int
put_double_locked(obuf *o, double d)
{
    if (orjson_dumps == NULL) {
        PyObject *mod = PyImport_ImportModule("orjson");
        if (mod == NULL) {
            PyErr_Clear();
            return DECLINE;
        }
        orjson_dumps = PyObject_GetAttrString(mod, "dumps");
        Py_DECREF(mod);
        if (orjson_dumps == NULL) {
            PyErr_Clear();
            return DECLINE;
        }
    }
    PyObject *f = PyFloat_FromDouble(d);
    if (f == NULL) {
        PyErr_Clear();
        return DECLINE;
    }
    return put_dumped(o, orjson_dumps, f);
}

/* The exponent of a float's text, s[i] just after its 'e': an optional sign, then digits. Past
 * cap its magnitude is cap and *over is set. */
static inline long
read_exponent(const char *s, Py_ssize_t i, Py_ssize_t n, long cap, int *over)
{
    int neg = s[i] == '-';
    if (s[i] == '-' || s[i] == '+')
        i++;
    long exp = 0;
    for (; i < n; i++) {
        exp = exp * 10 + (s[i] - '0');
        if (exp > cap) {
            *over = 1;
            exp = cap;
            break;
        }
    }
    return neg ? -exp : exp;
}

/* The double nearest to the decimal text s[0:n] (already checked to be [-]digits[.digits][e[+-]digits]),
 * as float() reads it: exactly, with one rounding (Clinger's fast path) when at most 15
 * significant digits scaled by a power of ten up to 22, else by strtod in the C locale (glibc's is
 * correctly rounded, as Python's own reader is). */
static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
static locale_t c_locale = (locale_t)0;

static double
parse_double(const char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    int neg = s[0] == '-';
    i += neg;
    uint64_t m = 0;
    int digits = 0, scale = 0, seen = 0;
    for (; i < n && s[i] != 'e'; i++) {
        if (s[i] == '.') {
            seen = 1;
            continue;
        }
        if (digits == 0 && s[i] == '0') { /* leading zeros count for nothing but the scale */
            scale -= seen;
            continue;
        }
        if (digits < 19)
            m = m * 10 + (uint64_t)(s[i] - '0');
        digits++;
        scale -= seen;
    }
    long exp = 0;
    int big = 0;
    if (i < n) /* 'e' */
        exp = read_exponent(s, i + 1, n, 100000, &big);
    exp += scale;
    if (!big && digits <= 15 && exp >= -22 && exp <= 22) {
        double d = (double)m; /* exact: m < 10^15 < 2^53 */
        d = exp < 0 ? d / POW10[-exp] : d * POW10[exp];
        return neg ? -d : d;
    }
    char buf[64];
    memcpy(buf, s, (size_t)n);
    buf[n] = '\0';
    if (c_locale == (locale_t)0)
        return NAN; /* no C locale: the caller leaves the value to float() */
    return strtod_l(buf, NULL, c_locale);
}

/* The JSON of float(text), without the double: for at most 15 significant digits and a value in
 * the range of normal doubles, the double's shortest round-trip text (what orjson writes) has
 * exactly these digits, trailing zeros aside: two different decimals of 15 digits or fewer never
 * read as the same double. Only orjson's layout is left to do: fixed notation for decimal
 * exponents -5 to 15 (always with a fraction), else d[.ddd]e+x / e-x. No GIL needed: the
 * snapshot's encoder takes this path for most floats. FALLBACK before writing anything.
 *
 * With `shortest` (the text comes from float8out of PostgreSQL 12+, which writes a double's
 * shortest digits when it writes more than 15) 16 and 17 digits are taken too, below 10^15 only.
 * The server's Ryu never picks a decimal on the bound of the double's rounding interval, where
 * the shortest (round-half-even) text may; such a decimal has fewer than 17 digits only when the
 * bound is an integer, which needs a value of 2^53 or more. Below that, both write the same
 * digits; above it, 2.7e+22 comes as 2.7000000000000002e+22 and is left to float(). */
static int
short_float(obuf *o, const char *s, Py_ssize_t n, int shortest)
{
    char dig[17];
    int k = 0, neg = s[0] == '-', seen = 0;
    long scale = 0, exp = 0;
    Py_ssize_t i = neg;
    for (; i < n && s[i] != 'e'; i++) {
        if (s[i] == '.') {
            seen = 1;
            continue;
        }
        if (k == 0 && s[i] == '0') {
            scale -= seen;
            continue;
        }
        if (k == (shortest ? 17 : 15))
            return FALLBACK;
        dig[k++] = s[i];
        scale -= seen;
    }
    if (i < n) { /* 'e' */
        int over = 0;
        exp = read_exponent(s, i + 1, n, 1000, &over);
        if (over)
            return FALLBACK;
    }
    if (k == 0)
        return neg ? put(o, "-0.0", 4) : put(o, "0.0", 3);
    exp += scale; /* the value is dig[0:k] * 10^exp */
    while (k > 1 && dig[k - 1] == '0')
        k--, exp++;
    long e = k - 1 + exp; /* d.ddd * 10^e */
    if (e < -300 || e > 300 || (k > 15 && e >= 15))
        return FALLBACK;
    NEED(o, 48);
    char *w = o->p + o->len;
    if (neg)
        *w++ = '-';
    if (e >= -5 && e < 16) {
        if (e >= 0) {
            for (long j = 0; j <= e; j++)
                *w++ = j < k ? dig[j] : '0';
            *w++ = '.';
            if (k > e + 1)
                for (long j = e + 1; j < k; j++)
                    *w++ = dig[j];
            else
                *w++ = '0';
        } else {
            *w++ = '0';
            *w++ = '.';
            for (long j = 0; j < -e - 1; j++)
                *w++ = '0';
            for (int j = 0; j < k; j++)
                *w++ = dig[j];
        }
    } else {
        *w++ = dig[0];
        if (k > 1) {
            *w++ = '.';
            for (int j = 1; j < k; j++)
                *w++ = dig[j];
        }
        w += sprintf(w, "e%c%ld", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    o->len = w - o->p;
    return OK;
}

/* float(text): a JSON number when finite, else the text itself as a string (JSON has no NaN).
 * Only the forms float8out writes are read here; float() takes the rest. Needs the GIL. */
static int
enc_float(obuf *o, const char *s, Py_ssize_t n, int shortest)
{
    if ((n == 3 && memcmp(s, "NaN", 3) == 0) || (n == 8 && memcmp(s, "Infinity", 8) == 0) ||
        (n == 9 && memcmp(s, "-Infinity", 9) == 0))
        return put_string(o, (const unsigned char *)s, n);
    if (n < 1 || n > 60)
        return FALLBACK;
    Py_ssize_t i = s[0] == '-', lead = 0, frac = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++, lead++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++, frac++;
    }
    if (lead == 0)
        return FALLBACK;
    if (i < n && s[i] == 'e') {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        Py_ssize_t exp = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++, exp++;
        if (exp == 0)
            return FALLBACK;
    }
    if (i != n)
        return FALLBACK;
    int rc = short_float(o, s, n, shortest);
    if (rc != FALLBACK)
        return rc;
    double d = parse_double(s, n);
    if (isnan(d))
        return FALLBACK;
    if (!isfinite(d))
        return put_string(o, (const unsigned char *)s, n);
    return put_double(o, d);
}

/* A json/jsonb document embedded as the reference embeds it: raw CR and LF (whitespace between
 * tokens) as spaces; the document null is written null and reported through *jnull. */
static int
enc_json(obuf *o, const char *s, Py_ssize_t n, int *jnull)
{
    int isnull = n == 4 && memcmp(s, "null", 4) == 0;
    if (!isnull && n < 64) {
        Py_ssize_t a = 0, b = n;
        while (a < b && (s[a] == ' ' || s[a] == '\t' || s[a] == '\r' || s[a] == '\n'))
            a++;
        while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r' || s[b - 1] == '\n'))
            b--;
        isnull = b - a == 4 && memcmp(s + a, "null", 4) == 0;
    }
    if (isnull) {
        *jnull = 1;
        return put(o, "null", 4);
    }
    NEED(o, n);
    char *w = o->p + o->len;
    for (Py_ssize_t i = 0; i < n; i++)
        w[i] = (s[i] == '\n' || s[i] == '\r') ? ' ' : s[i];
    o->len += n;
    return OK;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* RFC 4648 base64 of s[0:n], quoted. */
static int
put_base64(obuf *o, const unsigned char *s, Py_ssize_t n)
{
    NEED(o, (n + 2) / 3 * 4 + 2);
    char *w = o->p + o->len;
    *w++ = '"';
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        unsigned v = (unsigned)s[i] << 16 | (unsigned)s[i + 1] << 8 | s[i + 2];
        *w++ = B64[v >> 18];
        *w++ = B64[(v >> 12) & 63];
        *w++ = B64[(v >> 6) & 63];
        *w++ = B64[v & 63];
    }
    if (i < n) {
        unsigned v = (unsigned)s[i] << 16 | (i + 1 < n ? (unsigned)s[i + 1] << 8 : 0);
        *w++ = B64[v >> 18];
        *w++ = B64[(v >> 12) & 63];
        *w++ = i + 1 < n ? B64[(v >> 6) & 63] : '=';
        *w++ = '=';
    }
    *w++ = '"';
    o->len = w - o->p;
    return OK;
}

/* A hex digit's value plus one; 0 for any other byte (a table: the branches cost more). */
static const unsigned char HEXV[256] = {
    ['0'] = 1,  ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,  ['7'] = 8,
    ['8'] = 9,  ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
    ['A'] = 11, ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15, ['F'] = 16,
};

static inline int
hexval(char c)
{
    return (int)HEXV[(unsigned char)c] - 1;
}

/* bytea's hex output (\x then two digits a byte) as base64; the escape format and anything
 * bytes.fromhex takes besides plain digit pairs are left to the Python converter. */
static int
enc_bytea(obuf *o, const char *s, Py_ssize_t n)
{
    if (n < 2 || s[0] != '\\' || s[1] != 'x' || (n - 2) % 2)
        return FALLBACK;
    Py_ssize_t bytes = (n - 2) / 2;
    NEED(o, (bytes + 2) / 3 * 4 + 2);
    char *w = o->p + o->len;
    *w++ = '"';
    const char *h = s + 2;
    unsigned char g[3];
    for (Py_ssize_t i = 0; i < bytes; i += 3) {
        int k = 0;
        for (; k < 3 && i + k < bytes; k++) {
            int hi = hexval(h[2 * (i + k)]), lo = hexval(h[2 * (i + k) + 1]);
            if (hi < 0 || lo < 0)
                return FALLBACK;
            g[k] = (unsigned char)(hi << 4 | lo);
        }
        unsigned v = (unsigned)g[0] << 16 | (k > 1 ? (unsigned)g[1] << 8 : 0) | (k > 2 ? g[2] : 0);
        *w++ = B64[v >> 18];
        *w++ = B64[(v >> 12) & 63];
        *w++ = k > 1 ? B64[(v >> 6) & 63] : '=';
        *w++ = k > 2 ? B64[v & 63] : '=';
    }
    *w++ = '"';
    o->len = w - o->p;
    return OK;
}

static int
enc_bool(obuf *o, const char *s, Py_ssize_t n)
{
    if (n == 1 && s[0] == 't')
        return put(o, "true", 4);
    if (n == 1 && s[0] == 'f')
        return put(o, "false", 5);
    return FALLBACK;
}

/* A scalar of kind `kind` from its (valid UTF-8) text; *jnull reports a JSON null document. */
static int
enc_scalar(obuf *o, int kind, const char *s, Py_ssize_t n, int *jnull)
{
    switch (kind) {
    case RAW:
        return enc_int(o, s, n);
    case BOOL:
        return enc_bool(o, s, n);
    case QUOTE:
    case TEXT:
        return put_string(o, (const unsigned char *)s, n);
    case FLOAT:
        return enc_float(o, s, n, 0);
    case SHORTEST:
        return enc_float(o, s, n, 1);
    case JSON:
        return enc_json(o, s, n, jnull);
    case BYTEA:
        return enc_bytea(o, s, n);
    default:
        return FALLBACK;
    }
}

#define MAX_DEPTH 16

/* parse_array's lists for the literals array_out writes: nested braces (each level holding
 * only lists or only elements), quoted elements with backslash escapes, unquoted NULL. Anything
 * else (dimension decorations, escapes outside quotes, empty or ragged forms) is left to
 * parse_array itself. `tmp` holds a quoted element's unescaped text. */
static int
enc_array(obuf *o, obuf *tmp, int ek, char delim, const char *s, Py_ssize_t n)
{
    if (n < 2 || s[0] != '{' || s[n - 1] != '}')
        return FALLBACK;
    if (n == 2)
        return put(o, "[]", 2);
    char holds[MAX_DEPTH + 1]; /* per level: 0 nothing yet, 1 lists, 2 elements */
    int depth = 0, rc, jn = 0;
    Py_ssize_t i = 0;
    for (;;) {
        if (i >= n)
            return FALLBACK;
        if (s[i] == '{') {
            if (depth > 0) {
                if (holds[depth] == 2)
                    return FALLBACK;
                holds[depth] = 1;
            }
            if (depth == MAX_DEPTH)
                return FALLBACK;
            holds[++depth] = 0;
            if ((rc = put(o, "[", 1)) != OK)
                return rc;
            i++;
            continue;
        }
        if (depth == 0 || holds[depth] == 1)
            return FALLBACK;
        holds[depth] = 2;
        if (s[i] == '"') {
            tmp->len = 0;
            i++;
            for (;;) {
                if (i >= n)
                    return FALLBACK;
                char c = s[i];
                if (c == '"')
                    break;
                if (c == '\\') {
                    if (++i >= n)
                        return FALLBACK;
                    c = s[i];
                }
                if ((rc = put(tmp, &c, 1)) != OK)
                    return rc;
                i++;
            }
            i++;
            rc = enc_scalar(o, ek, tmp->p ? tmp->p : "", tmp->len, &jn);
        } else {
            Py_ssize_t j = i;
            while (j < n && s[j] != delim && s[j] != '}') {
                if (s[j] == '\\' || s[j] == '"' || s[j] == '{')
                    return FALLBACK;
                j++;
            }
            if (j == i || j == n)
                return FALLBACK;
            if (j - i == 4 && (s[i] | 0x20) == 'n' && (s[i + 1] | 0x20) == 'u' && (s[i + 2] | 0x20) == 'l' &&
                (s[i + 3] | 0x20) == 'l')
                rc = put(o, "null", 4);
            else
                rc = enc_scalar(o, ek, s + i, j - i, &jn);
            i = j;
        }
        if (rc != OK)
            return rc;
        /* after an element or a list: a delimiter, or closing braces */
        for (;;) {
            if (i >= n)
                return FALLBACK;
            if (s[i] == delim) {
                if ((rc = put(o, ",", 1)) != OK)
                    return rc;
                i++;
                break;
            }
            if (s[i] != '}')
                return FALLBACK;
            if ((rc = put(o, "]", 1)) != OK)
                return rc;
            i++;
            if (--depth == 0)
                return i == n ? OK : FALLBACK;
        }
    }
}

/* ---- the snapshot's block encoder ------------------------------------------------------------ */

/* A COPY text field without its escapes, as psycopg undoes them (\b \f \n \r \t \v \\; any
 * other backslash stays). */
static int
copy_unescape(obuf *t, const char *p, Py_ssize_t len)
{
    t->len = 0;
    NEED(t, len + 1);
    char *w = t->p;
    for (Py_ssize_t i = 0; i < len; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < len) {
            switch (p[i + 1]) {
            case 'b': c = '\b'; i++; break;
            case 'f': c = '\f'; i++; break;
            case 'n': c = '\n'; i++; break;
            case 'r': c = '\r'; i++; break;
            case 't': c = '\t'; i++; break;
            case 'v': c = '\v'; i++; break;
            case '\\': i++; break;
            default: break;
            }
        }
        *w++ = c;
    }
    t->len = w - t->p;
    return OK;
}

/* Nonzero when some byte of w is c (the zero-byte test on w ^ c...c: exact for whether any is). */
#define ONES 0x0101010101010101ull
#define HAS_BYTE(w, c) ((((w) ^ (ONES * (unsigned char)(c))) - ONES) & ~((w) ^ (ONES * (unsigned char)(c))) & (ONES << 7))

typedef struct {
    const char *kinds, *elems, *delims;
    Py_ssize_t n;
    piece head, tail;
    const piece *keys;
} block_plan;

/* Writes the JSON lines of block[0:len] to o; returns OK, or DECLINE: the Python path decides. */
static int
fill(obuf *o, obuf *t1, obuf *t2, const char *p, const char *end, const block_plan *bp)
{
    Py_ssize_t n = bp->n;
    while (p < end) {
        if (put(o, bp->head.ptr, bp->head.len) != OK)
            return DECLINE;
        for (Py_ssize_t j = 0; j < n; j++) {
            char want = j == n - 1 ? '\n' : '\t';
            const char *q = p;
            int escaped = 0, wide = 0;
            /* eight bytes at a time while none is a tab or newline (most of a long field) */
            while (end - q >= 8) {
                uint64_t w;
                memcpy(&w, q, 8);
                if (HAS_BYTE(w, '\t') | HAS_BYTE(w, '\n'))
                    break;
                escaped |= HAS_BYTE(w, '\\') != 0;
                wide |= (w & 0x8080808080808080ull) != 0;
                q += 8;
            }
            while (q < end && *q != '\t' && *q != '\n') {
                escaped |= *q == '\\';
                wide |= (unsigned char)*q++ >= 0x80;
            }
            if (q == end || *q != want)
                return DECLINE;
            Py_ssize_t len = q - p;
            NEED(o, bp->keys[j].len + len + 8);
            add(o, bp->keys[j].ptr, bp->keys[j].len);
            int rc, jn = 0, kind = bp->kinds[j];
            if (len == 2 && p[0] == '\\' && p[1] == 'N') {
                add(o, "null", 4);
                rc = OK;
            } else if (kind == RAW && !escaped) {
                add(o, p, len); /* the server's own integer text */
                rc = OK;
            } else {
                const char *v = p;
                Py_ssize_t vlen = len;
                if (escaped) {
                    if (copy_unescape(t1, p, len) != OK)
                        return DECLINE;
                    v = t1->p;
                    vlen = t1->len;
                }
                /* Not valid UTF-8: the Python path decides (it checks such a column as a whole). */
                if (wide && !valid_utf8((const unsigned char *)v, vlen))
                    return DECLINE;
                if (kind == RAW)
                    rc = enc_int(o, v, vlen);
                else if (kind == ARRAY)
                    rc = enc_array(o, t2, bp->elems[j], bp->delims[j], v, vlen);
                else
                    rc = enc_scalar(o, kind, v, vlen, &jn);
            }
            /* A JSON null document gives the row "json_nulls": the Python path writes such blocks. */
            if (rc != OK || jn)
                return DECLINE;
            p = q + 1;
        }
        if (put(o, bp->tail.ptr, bp->tail.len) != OK)
            return DECLINE;
    }
    return OK;
}

/* encode(block, out, kinds, elems, delims, head, keys, tail) -> (nbytes, rows) or None
 *
 * Each line of block (whole lines of COPY text, one byte of kinds per column, and for ARRAY
 * columns the element kind and delimiter at the same index of elems and delims) becomes
 * head + keys[0] + value + keys[1] + value ... + tail, written to the start of the bytearray
 * out (grown when too small, never shrunk). The caller's keys carry the commas and the names.
 * One output buffer reused for every block: a fresh megabyte per block would cost the page
 * faults of new memory each time. The work is done without the GIL (taken back for a float's
 * formatting alone, see put_double).
 */
static PyObject *
encode(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer block, kinds, elems, delims, dest = {0};
    PyObject *out, *head, *keys, *tail, *result = NULL;
    piece *key = NULL;
    obuf o = {0}, t1 = {0}, t2 = {0};
    if (!PyArg_ParseTuple(args, "y*O!y*y*y*SO!S", &block, &PyByteArray_Type, &out, &kinds, &elems, &delims,
                          &head, &PyTuple_Type, &keys, &tail))
        return NULL;
    Py_ssize_t n = kinds.len;
    if (n < 1 || PyTuple_GET_SIZE(keys) != n || elems.len != n || delims.len != n) {
        PyErr_SetString(PyExc_ValueError, "one key, element kind and delimiter per column kind, at least one");
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        char k = ((const char *)kinds.buf)[j];
        if (k < RAW || k > SHORTEST || k == OTHER) {
            PyErr_SetString(PyExc_ValueError, "a column kind the C encoder does not do");
            goto done;
        }
    }
    key = PyMem_Malloc(sizeof(piece) * (size_t)n);
    if (key == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *k = PyTuple_GET_ITEM(keys, j);
        if (!PyBytes_Check(k)) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            goto done;
        }
        key[j].ptr = PyBytes_AS_STRING(k);
        key[j].len = PyBytes_GET_SIZE(k);
    }
    const char *p = block.buf, *end = p + block.len;
    if (block.len == 0 || end[-1] != '\n') {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t rows = 0;
    for (const char *q = p; (q = memchr(q, '\n', (size_t)(end - q))) != NULL; q++)
        rows++;
    /* Write into out's own memory, as big as it has grown; the buffer export keeps anybody from
     * resizing it meanwhile. When it is too small, the lines go to o and out is resized after. */
    block_plan bp = {kinds.buf, elems.buf, delims.buf, n, {PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head)},
                     {PyBytes_AS_STRING(tail), PyBytes_GET_SIZE(tail)}, key};
    if (PyObject_GetBuffer(out, &dest, PyBUF_WRITABLE) < 0)
        goto done;
    o.p = dest.buf;
    o.cap = dest.len;
    o.borrowed = 1;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    gil_released = 1;
    rc = fill(&o, &t1, &t2, p, end, &bp);
    gil_released = 0;
    Py_END_ALLOW_THREADS
    if (rc != OK) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (!o.borrowed) {
        PyBuffer_Release(&dest);
        if (PyByteArray_GET_SIZE(out) < o.len && PyByteArray_Resize(out, o.len) < 0)
            goto done;
        memcpy(PyByteArray_AS_STRING(out), o.p, (size_t)o.len);
    }
    result = Py_BuildValue("(nn)", o.len, rows);
done:
    if (dest.obj != NULL)
        PyBuffer_Release(&dest);
    release(&o);
    release(&t1);
    release(&t2);
    PyMem_Free(key);
    PyBuffer_Release(&block);
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&elems);
    PyBuffer_Release(&delims);
    return result;
}

/* ---- the stream's row encoder: pgoutput Insert/Update/Delete to a JSONL line ----------------- */

enum {
    F_NEW,
    F_UNCHANGED,
    F_FROM_OLD,
    F_JSON_NULLS,
    F_OLD,
    F_OLD_KIND,
    F_OLD_UNCHANGED,
    F_OLD_JSON_NULLS,
    N_FIELDS
};

/* What one relation needs per row, worked out once by pgrecv.output.fastpath (a capsule holds it). */
typedef struct {
    Py_ssize_t n;
    char *kinds, *elems, *delims, *bkinds, *keyflags;
    piece *names;        /* each column's name as a JSON string */
    PyObject **tconvs;   /* the reference's text converter per column (borrowed from held) */
    PyObject **bconvs;   /* ... and binary converter */
    piece fields[N_FIELDS], old_kinds[2];
    int has_key;
    PyObject *dumps, *json_null, *held; /* held: the arguments, kept alive with the plan */
} plan;

#define PLAN_NAME "pgrecv._copyfast.plan"

static void
plan_free(PyObject *capsule)
{
    plan *pl = PyCapsule_GetPointer(capsule, PLAN_NAME);
    if (pl == NULL)
        return;
    PyMem_Free(pl->names);
    PyMem_Free(pl->tconvs);
    PyMem_Free(pl->bconvs);
    Py_XDECREF(pl->held);
    PyMem_Free(pl);
}

static int
bytes_items(PyObject *tuple, Py_ssize_t n, piece *into, const char *what)
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != n) {
        PyErr_Format(PyExc_ValueError, "%s: a tuple of %zd bytes", what, n);
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *b = PyTuple_GET_ITEM(tuple, j);
        if (!PyBytes_Check(b)) {
            PyErr_Format(PyExc_TypeError, "%s: a tuple of %zd bytes", what, n);
            return -1;
        }
        into[j].ptr = PyBytes_AS_STRING(b);
        into[j].len = PyBytes_GET_SIZE(b);
    }
    return 0;
}

/* make_plan(kinds, elems, delims, bkinds, keyflags, names, tconvs, bconvs, fields, old_kinds,
 *           dumps, json_null) -> capsule */
static PyObject *
make_plan(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *kinds, *elems, *delims, *bkinds, *keyflags, *names, *tconvs, *bconvs, *fields, *old_kinds, *dumps,
        *json_null;
    if (!PyArg_ParseTuple(args, "SSSSSO!O!O!O!O!OO", &kinds, &elems, &delims, &bkinds, &keyflags, &PyTuple_Type,
                          &names, &PyTuple_Type, &tconvs, &PyTuple_Type, &bconvs, &PyTuple_Type, &fields,
                          &PyTuple_Type, &old_kinds, &dumps, &json_null))
        return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(kinds);
    if (PyBytes_GET_SIZE(elems) != n || PyBytes_GET_SIZE(delims) != n || PyBytes_GET_SIZE(bkinds) != n ||
        PyBytes_GET_SIZE(keyflags) != n || PyTuple_GET_SIZE(tconvs) != n || PyTuple_GET_SIZE(bconvs) != n) {
        PyErr_SetString(PyExc_ValueError, "one kind, element kind, delimiter, binary kind, key flag and converters "
                                          "per column");
        return NULL;
    }
    plan *pl = PyMem_Calloc(1, sizeof(plan));
    if (pl == NULL)
        return PyErr_NoMemory();
    pl->n = n;
    pl->held = PyTuple_Pack(12, kinds, elems, delims, bkinds, keyflags, names, tconvs, bconvs, fields, old_kinds,
                            dumps, json_null);
    pl->names = PyMem_Calloc((size_t)n + 1, sizeof(piece));
    pl->tconvs = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    pl->bconvs = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    PyObject *capsule = NULL;
    if (pl->held == NULL || pl->names == NULL || pl->tconvs == NULL || pl->bconvs == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    pl->kinds = PyBytes_AS_STRING(kinds);
    pl->elems = PyBytes_AS_STRING(elems);
    pl->delims = PyBytes_AS_STRING(delims);
    pl->bkinds = PyBytes_AS_STRING(bkinds);
    pl->keyflags = PyBytes_AS_STRING(keyflags);
    for (Py_ssize_t j = 0; j < n; j++) {
        int k = pl->kinds[j], e = pl->elems[j], b = pl->bkinds[j];
        if (k < RAW || k > SHORTEST ||
            (k == ARRAY && (e < RAW || e > SHORTEST || e == ARRAY || e == OTHER || e == QUOTE)) ||
            b < B_PY || b > B_UUID) {
            PyErr_SetString(PyExc_ValueError, "a column kind the C encoder does not know");
            goto fail;
        }
        pl->tconvs[j] = PyTuple_GET_ITEM(tconvs, j);
        pl->bconvs[j] = PyTuple_GET_ITEM(bconvs, j);
        if (pl->keyflags[j])
            pl->has_key = 1;
    }
    if (bytes_items(names, n, pl->names, "names") < 0 || bytes_items(fields, N_FIELDS, pl->fields, "fields") < 0 ||
        bytes_items(old_kinds, 2, pl->old_kinds, "old_kinds") < 0)
        goto fail;
    pl->dumps = dumps;
    pl->json_null = json_null;
    capsule = PyCapsule_New(pl, PLAN_NAME, plan_free);
    if (capsule == NULL)
        goto fail;
    return capsule;
fail:
    PyMem_Free(pl->names);
    PyMem_Free(pl->tconvs);
    PyMem_Free(pl->bconvs);
    Py_XDECREF(pl->held);
    PyMem_Free(pl);
    return NULL;
}

/* The reference's converter for a value the C encoders leave to it: its result through
 * orjson.dumps (the callable given), JSON_NULL written null and reported through *jnull. */
static int
py_value(obuf *o, const plan *pl, PyObject *conv, int binary, const char *s, Py_ssize_t n, int *jnull)
{
    PyObject *v = binary ? PyBytes_FromStringAndSize(s, n) : PyUnicode_DecodeUTF8(s, n, "strict");
    if (v == NULL) {
        PyErr_Clear();
        return DECLINE;
    }
    PyObject *r = conv == Py_None ? Py_NewRef(v) : PyObject_CallOneArg(conv, v);
    Py_DECREF(v);
    if (r == NULL) {
        PyErr_Clear(); /* the reference path raises the error that names the column */
        return DECLINE;
    }
    if (r == pl->json_null) {
        Py_DECREF(r);
        *jnull = 1;
        return put(o, "null", 4);
    }
    return put_dumped(o, pl->dumps, r);
}

static uint64_t
be(const unsigned char *s, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | s[i];
    return v;
}

/* A value sent in binary (the send format), as binary_converter's converter gives it. */
static int
enc_binary(obuf *o, int kind, const unsigned char *s, Py_ssize_t n, int *jnull)
{
    char num[32];
    switch (kind) {
    case B_INT2:
        if (n != 2)
            return FALLBACK;
        return put(o, num, snprintf(num, sizeof num, "%d", (int)(int16_t)be(s, 2)));
    case B_INT4:
        if (n != 4)
            return FALLBACK;
        return put(o, num, snprintf(num, sizeof num, "%ld", (long)(int32_t)be(s, 4)));
    case B_INT8:
        if (n != 8)
            return FALLBACK;
        return put(o, num, snprintf(num, sizeof num, "%lld", (long long)(int64_t)be(s, 8)));
    case B_UINT4:
        if (n != 4)
            return FALLBACK;
        return put(o, num, snprintf(num, sizeof num, "%lu", (unsigned long)be(s, 4)));
    case B_UINT8:
        if (n != 8)
            return FALLBACK;
        return put(o, num, snprintf(num, sizeof num, "%llu", (unsigned long long)be(s, 8)));
    case B_BOOL:
        if (n != 1)
            return FALLBACK;
        return s[0] ? put(o, "true", 4) : put(o, "false", 5);
    case B_FLOAT8: {
        if (n != 8)
            return FALLBACK;
        uint64_t bits = be(s, 8);
        double d;
        memcpy(&d, &bits, sizeof d);
        if (isnan(d))
            return put(o, "\"NaN\"", 5);
        if (isinf(d))
            return d > 0 ? put(o, "\"Infinity\"", 10) : put(o, "\"-Infinity\"", 11);
        return put_double(o, d);
    }
    case B_UTF8:
        if (!valid_utf8(s, n))
            return FALLBACK;
        return put_string(o, s, n);
    case B_BYTEA:
        return put_base64(o, s, n);
    case B_JSONB:
        if (n < 1 || s[0] != 1)
            return FALLBACK;
        s++;
        n--;
        /* fall through */
    case B_JSON:
        if (!valid_utf8(s, n))
            return FALLBACK;
        return enc_json(o, (const char *)s, n, jnull);
    case B_UUID: {
        if (n != 16)
            return FALLBACK;
        NEED(o, 38);
        char *w = o->p + o->len;
        *w++ = '"';
        for (int i = 0; i < 16; i++) {
            if (i == 4 || i == 6 || i == 8 || i == 10)
                *w++ = '-';
            *w++ = HEX[s[i] >> 4];
            *w++ = HEX[s[i] & 15];
        }
        *w++ = '"';
        o->len = w - o->p;
        return OK;
    }
    default:
        return FALLBACK;
    }
}

enum { V_VALUE = 0, V_NULL, V_TOAST };

typedef struct {
    Py_ssize_t off, len;
    char state, jnull;
    char filled; /* an unchanged TOAST value taken from the old image: set by fill_from_old only */
} colval;

/* Set by read_image when a column is an unchanged TOAST value (rare): whether an update's new
 * image needs fill_from_old at all. */
static int toast_seen;

/* One TupleData at *pos: every column's JSON value into vals, described by cv. */
static int
read_image(const plan *pl, const unsigned char *d, Py_ssize_t end, Py_ssize_t *pos, obuf *vals, obuf *tmp,
           colval *cv)
{
    Py_ssize_t p = *pos;
    if (end - p < 2 || (Py_ssize_t)be(d + p, 2) != pl->n)
        return DECLINE;
    p += 2;
    for (Py_ssize_t j = 0; j < pl->n; j++) {
        if (p >= end)
            return DECLINE;
        unsigned char k = d[p++];
        cv[j].jnull = 0;
        if (k == 'n') {
            cv[j].state = V_NULL;
            continue;
        }
        if (k == 'u') {
            cv[j].state = V_TOAST;
            toast_seen = 1;
            continue;
        }
        if ((k != 't' && k != 'b') || end - p < 4)
            return DECLINE;
        uint64_t len = be(d + p, 4);
        p += 4;
        if (len > (uint64_t)(end - p))
            return DECLINE;
        const unsigned char *s = d + p;
        Py_ssize_t n = (Py_ssize_t)len;
        p += n;
        Py_ssize_t off = vals->len;
        int rc, jn = 0;
        if (k == 't') {
            /* The reference decodes every text value as UTF-8 and fails on the row otherwise. */
            if (!ascii_only(s, n) && !valid_utf8(s, n))
                return DECLINE;
            int kind = pl->kinds[j];
            if (kind == ARRAY)
                rc = enc_array(vals, tmp, pl->elems[j], pl->delims[j], (const char *)s, n);
            else
                rc = enc_scalar(vals, kind, (const char *)s, n, &jn);
            if (rc == FALLBACK) {
                vals->len = off;
                jn = 0;
                rc = py_value(vals, pl, pl->tconvs[j], 0, (const char *)s, n, &jn);
            }
        } else {
            rc = enc_binary(vals, pl->bkinds[j], s, n, &jn);
            if (rc == FALLBACK) {
                vals->len = off;
                jn = 0;
                rc = py_value(vals, pl, pl->bconvs[j], 1, (const char *)s, n, &jn);
            }
        }
        if (rc != OK)
            return DECLINE;
        cv[j].state = V_VALUE;
        cv[j].jnull = (char)jn;
        cv[j].off = off;
        cv[j].len = vals->len - off;
    }
    *pos = p;
    return OK;
}

/* An update's new image takes, for each column it marks unchanged-TOAST, the value its old image
 * holds for it (any column of a full image, a key column of a key image; not one the old image
 * marks unchanged too): pgrecv.events.fill_from_old, the step the reference's decoder takes.
 * Returns how many it filled, or DECLINE. Kept out of line: the row encoder's loop stays as it was. */
static Py_NO_INLINE int
fill_from_old(const plan *pl, obuf *vals, const obuf *old_vals, colval *cn, const colval *co, int full)
{
    int filled = 0;
    for (Py_ssize_t j = 0; j < pl->n; j++) {
        cn[j].filled = cn[j].state == V_TOAST && (full || pl->keyflags[j]) && co[j].state != V_TOAST;
        if (!cn[j].filled)
            continue;
        filled++;
        cn[j].jnull = co[j].jnull;
        if (co[j].state == V_NULL) {
            cn[j].state = V_NULL;
            continue;
        }
        Py_ssize_t off = vals->len;
        if (put(vals, old_vals->p + co[j].off, co[j].len) != OK)
            return DECLINE;
        cn[j].state = V_VALUE;
        cn[j].off = off;
        cn[j].len = co[j].len;
    }
    return filled;
}

/* A list of names (the columns in `which` state, or with a JSON null), written ["a","b"]; with
 * `optional`, nothing at all when it would be empty. */
static int
put_names(obuf *o, const plan *pl, const colval *cv, int toast, int keyonly, piece field, int optional)
{
    int first = 1;
    for (Py_ssize_t j = 0; j < pl->n; j++) {
        if (keyonly && !pl->keyflags[j])
            continue;
        if (toast ? cv[j].state != V_TOAST : !(cv[j].state == V_VALUE && cv[j].jnull))
            continue;
        if (first && put(o, field.ptr, field.len) != OK)
            return DECLINE;
        if (put(o, first ? "[" : ",", 1) != OK || put(o, pl->names[j].ptr, pl->names[j].len) != OK)
            return DECLINE;
        first = 0;
    }
    if (first && !optional)
        return put(o, field.ptr, field.len) != OK ? DECLINE : put(o, "[]", 2);
    if (!first)
        return put(o, "]", 1);
    return OK;
}

/* The new image's columns taken from the old image, written ["a","b"] after `field`: only after
 * fill_from_old took one at least (it sets every column's `filled`). */
static Py_NO_INLINE int
put_filled(obuf *o, const plan *pl, const colval *cv, piece field)
{
    if (put(o, field.ptr, field.len) != OK)
        return DECLINE;
    const char *sep = "[";
    for (Py_ssize_t j = 0; j < pl->n; j++) {
        if (!cv[j].filled)
            continue;
        if (put(o, sep, 1) != OK || put(o, pl->names[j].ptr, pl->names[j].len) != OK)
            return DECLINE;
        sep = ",";
    }
    return put(o, "]", 1);
}

/* An image {"col":value,...}: unchanged TOAST columns left out, only key columns when keyonly. */
static int
put_image(obuf *o, const plan *pl, const obuf *vals, const colval *cv, int keyonly)
{
    int first = 1;
    if (put(o, "{", 1) != OK)
        return DECLINE;
    for (Py_ssize_t j = 0; j < pl->n; j++) {
        if (cv[j].state == V_TOAST || (keyonly && !pl->keyflags[j]))
            continue;
        if ((!first && put(o, ",", 1) != OK) || put(o, pl->names[j].ptr, pl->names[j].len) != OK ||
            put(o, ":", 1) != OK)
            return DECLINE;
        first = 0;
        if (cv[j].state == V_NULL ? put(o, "null", 4) != OK : put(o, vals->p + cv[j].off, cv[j].len) != OK)
            return DECLINE;
    }
    return put(o, "}", 1);
}

/* Buffers reused by every call: the row encoder runs with the GIL held. A Python converter it
 * calls may let another thread run, and that thread's encode_row finds `busy` set and declines
 * (its caller takes the reference path) rather than share the buffers. */
static obuf line_buf, new_vals, old_vals, tmp_buf;
static int busy = 0;
static colval *cv_new, *cv_old;
static Py_ssize_t cv_cap;

static int
encode_message(const plan *pl, const unsigned char *d, Py_ssize_t end, uint64_t lsn, PyObject *heads)
{
    int op = d[0] == 'I' ? 0 : d[0] == 'U' ? 1 : d[0] == 'D' ? 2 : -1;
    if (op < 0 || end < 6)
        return DECLINE;
    if (cv_cap < pl->n + 1) {
        colval *a = realloc(cv_new, sizeof(colval) * (size_t)(pl->n + 1));
        if (a == NULL)
            return DECLINE;
        cv_new = a;
        colval *b = realloc(cv_old, sizeof(colval) * (size_t)(pl->n + 1));
        if (b == NULL)
            return DECLINE;
        cv_old = b;
        cv_cap = pl->n + 1;
    }
    Py_ssize_t pos = 5;
    unsigned char marker = d[pos++];
    int old_kind = -1; /* 0 'K', 1 'O' */
    new_vals.len = old_vals.len = 0;
    if (op != 0 && (marker == 'K' || marker == 'O')) {
        old_kind = marker == 'K' ? 0 : 1;
        if (read_image(pl, d, end, &pos, &old_vals, &tmp_buf, cv_old) != OK)
            return DECLINE;
        if (op == 1) {
            if (pos >= end)
                return DECLINE;
            marker = d[pos++];
        }
    }
    if (op == 2 ? old_kind < 0 : marker != 'N')
        return DECLINE;
    toast_seen = 0;
    if (op != 2 && read_image(pl, d, end, &pos, &new_vals, &tmp_buf, cv_new) != OK)
        return DECLINE;
    if (pos != end)
        return DECLINE;
    int filled = 0; /* unchanged TOAST values taken from the old image */
    if (op == 1 && old_kind >= 0 && toast_seen) {
        filled = fill_from_old(pl, &new_vals, &old_vals, cv_new, cv_old, old_kind == 1);
        if (filled < 0)
            return DECLINE;
    }

    obuf *o = &line_buf;
    o->len = 0;
    PyObject *pre = PyTuple_GET_ITEM(heads, 2 * op), *post = PyTuple_GET_ITEM(heads, 2 * op + 1);
    char at[40];
    int atlen = lsn ? snprintf(at, sizeof at, "\"%X/%X\"", (unsigned)(lsn >> 32), (unsigned)(lsn & 0xFFFFFFFFu))
                    : snprintf(at, sizeof at, "null");
    if (put(o, PyBytes_AS_STRING(pre), PyBytes_GET_SIZE(pre)) != OK || put(o, at, atlen) != OK ||
        put(o, PyBytes_AS_STRING(post), PyBytes_GET_SIZE(post)) != OK)
        return DECLINE;
    const piece *f = pl->fields;
    if (op != 2) {
        if (put(o, f[F_NEW].ptr, f[F_NEW].len) != OK || put_image(o, pl, &new_vals, cv_new, 0) != OK ||
            put_names(o, pl, cv_new, 1, 0, f[F_UNCHANGED], 0) != OK ||
            (filled && put_filled(o, pl, cv_new, f[F_FROM_OLD]) != OK) ||
            put_names(o, pl, cv_new, 0, 0, f[F_JSON_NULLS], 1) != OK)
            return DECLINE;
    }
    if (op != 0) {
        if (put(o, f[F_OLD].ptr, f[F_OLD].len) != OK)
            return DECLINE;
        if (old_kind < 0) {
            if (put(o, "null", 4) != OK || put(o, f[F_OLD_KIND].ptr, f[F_OLD_KIND].len) != OK ||
                put(o, "null", 4) != OK)
                return DECLINE;
        } else {
            /* A key image keeps only the key columns: the others are NULL placeholders. */
            int keyonly = old_kind == 0 && pl->has_key;
            if (put_image(o, pl, &old_vals, cv_old, keyonly) != OK ||
                put(o, f[F_OLD_KIND].ptr, f[F_OLD_KIND].len) != OK ||
                put(o, pl->old_kinds[old_kind].ptr, pl->old_kinds[old_kind].len) != OK ||
                put_names(o, pl, cv_old, 1, keyonly, f[F_OLD_UNCHANGED], 1) != OK ||
                put_names(o, pl, cv_old, 0, keyonly, f[F_OLD_JSON_NULLS], 1) != OK)
                return DECLINE;
        }
    }
    return put(o, "}\n", 2);
}

/* encode_row(message, lsn, plan, heads) -> bytes or None
 *
 * The JSONL line of a pgoutput Insert, Update or Delete (not streamed: no xid prefix) of the
 * relation `plan` was made for, as pgrecv.output.jsonl.JsonlEncoder writes it; heads holds the record's
 * bytes before and after its lsn for each of insert, update and delete. None: the message is not
 * one this encoder does exactly (malformed, a value a converter rejects...): the caller takes the
 * reference path, which also reports every error.
 */
static PyObject *
encode_row(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[3]) != 6) {
        PyErr_SetString(PyExc_TypeError, "encode_row(message, lsn, plan, heads: 6 bytes)");
        return NULL;
    }
    for (int i = 0; i < 6; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(args[3], i))) {
            PyErr_SetString(PyExc_TypeError, "heads must be bytes");
            return NULL;
        }
    plan *pl = PyCapsule_GetPointer(args[2], PLAN_NAME);
    if (pl == NULL)
        return NULL;
    uint64_t lsn = PyLong_AsUnsignedLongLong(args[1]);
    if (lsn == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    Py_buffer msg;
    if (PyObject_GetBuffer(args[0], &msg, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result;
    if (!busy && msg.len >= 1) {
        busy = 1;
        int rc = encode_message(pl, msg.buf, msg.len, lsn, args[3]);
        result = rc == OK ? PyBytes_FromStringAndSize(line_buf.p, line_buf.len) : Py_NewRef(Py_None);
        busy = 0;
    } else {
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&msg);
    return result;
}

/* pump(pgconn_ptr, plans, endpos, limit, out) -> (n, message, rows, wal_end)
 *
 * The stream's receive loop for the bulk of a transaction, in C: the CopyData messages buffered
 * in libpq are taken one by one while each is the XLogData of an Insert, Update or Delete that
 * encode_row would write, of a relation in `plans` ({oid: (plan, heads)}, filled and emptied by
 * pgrecv.output.fastpath and the streamer, valid for the transaction under way), at a position
 * below `endpos`. Their lines are appended to the bytearray `out`, `rows` counts them and
 * `wal_end` is the highest walEnd among them. Per row this saves what the Python loop spends
 * around the encoder (a tuple, a memoryview, the header's unpacking, three calls).
 *
 * It stops at the first message it does not take and hands it over whole (n > 0, its bytes),
 * as get_copy_data would; when nothing whole is buffered (n 0), at the end of the COPY (-1),
 * after `limit` rows (-3), or when it cannot go on (-2: libpq failed, or the row encoder is busy
 * in another thread): the caller then reads the next message itself, and libpq's error, if any,
 * comes out of that read. Python does with a message handed over what it does with one it read
 * itself: nothing is skipped or reordered.
 */
static PyObject *
pump(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyDict_Check(args[1]) || !PyByteArray_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "pump(pgconn_ptr, plans: dict, endpos, limit, out: bytearray)");
        return NULL;
    }
    void *conn = conn_arg(args[0]);
    if (conn == NULL)
        return NULL;
    uint64_t endpos = PyLong_AsUnsignedLongLong(args[2]);
    if (endpos == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[3]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *plans = args[1], *out = args[4], *msg = NULL;
    Py_ssize_t rows = 0;
    uint64_t wal_end = 0;
    int n = -3;
    if (busy) /* a converter of another thread's encode_row holds the buffers: the Python loop reads */
        return Py_BuildValue("(iOnK)", -2, Py_None, (Py_ssize_t)0, 0ULL);
    while (rows < limit) {
        char *buf = NULL;
        int len = get_copy_data(conn, &buf, 1);
        if (len <= 0) {
            if (buf != NULL)
                freemem(buf);
            n = len < -1 ? -2 : len;
            break;
        }
        const unsigned char *d = (const unsigned char *)buf;
        PyObject *entry = NULL;
        uint64_t start = 0;
        /* 'w', start, walEnd, sendTime (25 bytes), then the message: type and relation oid */
        if (len >= 31 && d[0] == 'w' && (d[25] == 'I' || d[25] == 'U' || d[25] == 'D') &&
            (start = be(d + 1, 8)) < endpos) {
            PyObject *key = PyLong_FromUnsignedLongLong(be(d + 26, 4)); /* the relation oid */
            if (key == NULL) {
                freemem(buf);
                goto fail;
            }
            entry = PyDict_GetItemWithError(plans, key); /* borrowed */
            Py_DECREF(key);
            if (entry == NULL && PyErr_Occurred()) {
                freemem(buf);
                goto fail;
            }
        }
        int taken = 0;
        if (entry != NULL && PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2) {
            plan *pl = PyCapsule_GetPointer(PyTuple_GET_ITEM(entry, 0), PLAN_NAME);
            PyObject *heads = PyTuple_GET_ITEM(entry, 1);
            int heads_ok = PyTuple_Check(heads) && PyTuple_GET_SIZE(heads) == 6;
            for (int i = 0; heads_ok && i < 6; i++)
                heads_ok = PyBytes_Check(PyTuple_GET_ITEM(heads, i));
            if (pl == NULL || !heads_ok) {
                freemem(buf);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "plans: {oid: (plan, heads: 6 bytes)}");
                goto fail;
            }
            /* held while the encoder runs: a converter it calls is Python, which could change `plans` */
            Py_INCREF(entry);
            busy = 1;
            int rc = encode_message(pl, d + 25, len - 25, start, heads);
            busy = 0;
            Py_DECREF(entry);
            if (rc == OK) {
                Py_ssize_t at = PyByteArray_GET_SIZE(out);
                if (PyByteArray_Resize(out, at + line_buf.len) < 0) {
                    freemem(buf);
                    goto fail;
                }
                memcpy(PyByteArray_AS_STRING(out) + at, line_buf.p, (size_t)line_buf.len);
                uint64_t end = be(d + 9, 8);
                if (end > wal_end)
                    wal_end = end;
                rows++;
                taken = 1;
            }
        }
        if (!taken) { /* the Python loop's message, as get_copy_data would have given it */
            msg = PyBytes_FromStringAndSize(buf, len);
            freemem(buf);
            if (msg == NULL)
                goto fail;
            n = len;
            break;
        }
        freemem(buf);
    }
    return Py_BuildValue("(iNnK)", n, msg != NULL ? msg : Py_NewRef(Py_None), rows, (unsigned long long)wal_end);
fail:
    /* The message being taken is lost from libpq's buffer: the caller must give up the stream
     * (nothing after its last durable boundary was confirmed; a new stream sends it again). */
    return NULL;
}

/* float_json(x) -> bytes: a finite float as put_double writes it (tests compare it to orjson). */
static PyObject *
float_json(PyObject *Py_UNUSED(self), PyObject *arg)
{
    double d = PyFloat_AsDouble(arg);
    if (d == -1.0 && PyErr_Occurred())
        return NULL;
    obuf o = {0};
    PyObject *r = isfinite(d) && put_double(&o, d) == OK ? PyBytes_FromStringAndSize(o.p, o.len)
                                                         : Py_NewRef(Py_None);
    release(&o);
    return r;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(libpq_path): look up the functions of the libpq loaded from libpq_path."},
    {"backend_pid", pid, METH_O, "backend_pid(pgconn_ptr) -> int, through the bound libpq."},
    {"read", read_copy, METH_VARARGS, "read(pgconn_ptr, limit) -> (status, bytes): COPY rows in bulk."},
    {"encode", encode, METH_VARARGS,
     "encode(block, out, kinds, elems, delims, head, keys, tail) -> (nbytes, rows) or None."},
    {"make_plan", make_plan, METH_VARARGS, "make_plan(...) -> a relation's plan for encode_row."},
    {"encode_row", (PyCFunction)(void (*)(void))encode_row, METH_FASTCALL,
     "encode_row(message, lsn, plan, heads) -> bytes or None."},
    {"pump", (PyCFunction)(void (*)(void))pump, METH_FASTCALL,
     "pump(pgconn_ptr, plans, endpos, limit, out) -> (n, message, rows, wal_end): row changes in bulk."},
    {"float_json", float_json, METH_O, "float_json(x) -> bytes or None: a finite float as the encoders write it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pgrecv._copyfast",
    "pgrecv's native encoders: COPY data read in bulk and encoded as snapshot JSON lines, and pgoutput "
    "row changes encoded as JSONL lines.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__copyfast(void)
{
    /* Made once, here: the encoders read it from threads that do not hold the GIL. Without it
     * parse_double leaves long float texts to float(). */
    if (c_locale == (locale_t)0)
        c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    return PyModule_Create(&module);
}
