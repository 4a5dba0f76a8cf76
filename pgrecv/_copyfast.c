/* The C half of pgrecv snapshot's hot path (the Python half is pgrecv/snapshot_fast.py).
 *
 * read(): libpq hands out COPY data one CopyData message, that is one row, per PQgetCopyData
 * call; from Python each call costs a tuple, a memoryview and a buffer object. read() makes those
 * calls in a C loop, without the GIL, and returns many rows as one bytes object.
 *
 * It must call the very libpq that created the connection (PGconn is opaque and its layout
 * changes between releases), so nothing is linked at build time: bind() takes the path of the
 * libpq already loaded in the process and looks its functions up with dlopen(RTLD_NOLOAD).
 *
 * encode(): COPY text lines to snapshot JSON lines for the columns that need no more than
 * copying, quoting, t/f -> true/false or escaping a text (BlockEncoder's RAW, QUOTE, BOOL and TEXT
 * kinds), without the GIL. It declines (returns None) what it does not do exactly as the
 * reference encoder (pgrecv.jsonl) would: a malformed line, a text that is not valid UTF-8. The
 * caller then takes its Python path; tests prove all paths byte-identical.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
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

/* Column kinds, as numbered in snapshot_fast.py. */
enum { RAW = 0, QUOTE = 1, BOOL = 2, TEXT = 3 };

typedef struct {
    const char *ptr;
    Py_ssize_t len;
} piece;

static inline char *
put(char *o, const char *src, Py_ssize_t n)
{
    memcpy(o, src, (size_t)n);
    return o + n;
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

/* A text field that needs more than quotes: COPY's escapes undone as psycopg undoes them
 * (\b \f \n \r \t \v \\; any other backslash stays), then escaped as orjson escapes a str
 * (\" \\ \b \t \n \f \r, \u00XX for the other control bytes). */
static char *
escaped_text(char *o, const char *p, Py_ssize_t len)
{
    static const char hex[] = "0123456789abcdef";
    *o++ = '"';
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)p[i];
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
        switch (c) {
        case '"': o = put(o, "\\\"", 2); break;
        case '\\': o = put(o, "\\\\", 2); break;
        case '\b': o = put(o, "\\b", 2); break;
        case '\t': o = put(o, "\\t", 2); break;
        case '\n': o = put(o, "\\n", 2); break;
        case '\f': o = put(o, "\\f", 2); break;
        case '\r': o = put(o, "\\r", 2); break;
        default:
            if (c < 0x20) {
                o = put(o, "\\u00", 4);
                *o++ = hex[c >> 4];
                *o++ = hex[c & 15];
            } else {
                *o++ = (char)c;
            }
        }
    }
    *o++ = '"';
    return o;
}

/* Writes the JSON lines of block[0:len] to o; returns the end, or NULL to decline. */
static char *
fill(char *o, const char *p, const char *end, Py_ssize_t n, const char *kinds, piece head, const piece *keys,
     piece tail)
{
    while (p < end) {
        o = put(o, head.ptr, head.len);
        for (Py_ssize_t j = 0; j < n; j++) {
            char want = j == n - 1 ? '\n' : '\t';
            const char *q = p;
            int plain = 1, wide = 0;
            if (kinds[j] == TEXT) {
                while (q < end && *q != '\t' && *q != '\n') {
                    unsigned char c = (unsigned char)*q++;
                    if (c < 0x20 || c == '"' || c == '\\')
                        plain = 0;
                    else if (c >= 0x80)
                        wide = 1;
                }
            } else {
                while (q < end && *q != '\t' && *q != '\n')
                    q++;
            }
            if (q == end || *q != want)
                return NULL;
            Py_ssize_t len = q - p;
            o = put(o, keys[j].ptr, keys[j].len);
            if (len == 2 && p[0] == '\\' && p[1] == 'N') {
                o = put(o, "null", 4);
            } else {
                switch (kinds[j]) {
                case RAW:
                    o = put(o, p, len);
                    break;
                case TEXT:
                    /* Not valid UTF-8: the Python path decides (it checks such a column as a whole). */
                    if (wide && !valid_utf8((const unsigned char *)p, len))
                        return NULL;
                    if (!plain) {
                        o = escaped_text(o, p, len);
                        break;
                    }
                    /* fall through */
                case QUOTE:
                    *o++ = '"';
                    o = put(o, p, len);
                    *o++ = '"';
                    break;
                case BOOL:
                    if (len == 1 && *p == 't')
                        o = put(o, "true", 4);
                    else if (len == 1 && *p == 'f')
                        o = put(o, "false", 5);
                    else
                        return NULL;
                    break;
                default:
                    return NULL;
                }
            }
            p = q + 1;
        }
        o = put(o, tail.ptr, tail.len);
    }
    return o;
}

/* encode(block, out, kinds, head, keys, tail) -> (nbytes, rows) or None
 *
 * Each line of block (whole lines of COPY text, one byte of kinds per column) becomes
 * head + keys[0] + value + keys[1] + value ... + tail, written to the start of the bytearray out
 * (grown when too small, never shrunk). The caller's keys carry the commas and the names; the
 * values get their quotes here. One buffer reused for every block: a fresh megabyte per block
 * would cost the page faults of new memory each time (glibc maps such blocks anew when the
 * sizes allocated and freed differ).
 */
static PyObject *
encode(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer block, kinds, dest = {0};
    PyObject *out, *head, *keys, *tail, *result = NULL;
    piece *key = NULL;
    if (!PyArg_ParseTuple(args, "y*O!y*SO!S", &block, &PyByteArray_Type, &out, &kinds, &head, &PyTuple_Type, &keys,
                          &tail))
        return NULL;
    Py_ssize_t n = kinds.len;
    if (n < 1 || PyTuple_GET_SIZE(keys) != n) {
        PyErr_SetString(PyExc_ValueError, "one key per column kind, and at least one column");
        goto done;
    }
    key = PyMem_Malloc(sizeof(piece) * (size_t)n);
    if (key == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t fixed = PyBytes_GET_SIZE(head) + PyBytes_GET_SIZE(tail);
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *k = PyTuple_GET_ITEM(keys, j);
        if (!PyBytes_Check(k)) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            goto done;
        }
        key[j].ptr = PyBytes_AS_STRING(k);
        key[j].len = PyBytes_GET_SIZE(k);
        fixed += key[j].len + 4; /* a value grows by 4 bytes, f -> false, besides its escapes */
    }
    const char *p = block.buf, *end = p + block.len;
    if (block.len == 0 || end[-1] != '\n') {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t rows = 0;
    for (const char *q = p; (q = memchr(q, '\n', (size_t)(end - q))) != NULL; q++)
        rows++;
    /* An escaped text byte takes 6 bytes at most (0x01 -> \u0001); the quotes are in fixed. */
    if (block.len > PY_SSIZE_T_MAX / 8 || rows > (PY_SSIZE_T_MAX / 2 - block.len * 6) / fixed) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t bound = block.len * 6 + rows * fixed;
    if (PyByteArray_GET_SIZE(out) < bound && PyByteArray_Resize(out, bound) < 0)
        goto done;
    /* Held while the GIL is released: nobody can resize out meanwhile. */
    if (PyObject_GetBuffer(out, &dest, PyBUF_WRITABLE) < 0)
        goto done;
    piece h = {PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head)};
    piece t = {PyBytes_AS_STRING(tail), PyBytes_GET_SIZE(tail)};
    char *start = dest.buf, *stop;
    Py_BEGIN_ALLOW_THREADS
    stop = fill(start, p, end, n, kinds.buf, h, key, t);
    Py_END_ALLOW_THREADS
    if (stop == NULL)
        result = Py_NewRef(Py_None);
    else
        result = Py_BuildValue("(nn)", (Py_ssize_t)(stop - start), rows);
done:
    if (dest.obj != NULL)
        PyBuffer_Release(&dest);
    PyMem_Free(key);
    PyBuffer_Release(&block);
    PyBuffer_Release(&kinds);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(libpq_path): look up the functions of the libpq loaded from libpq_path."},
    {"backend_pid", pid, METH_O, "backend_pid(pgconn_ptr) -> int, through the bound libpq."},
    {"read", read_copy, METH_VARARGS, "read(pgconn_ptr, limit) -> (status, bytes): COPY rows in bulk."},
    {"encode", encode, METH_VARARGS, "encode(block, out, kinds, head, keys, tail) -> (nbytes, rows) or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pgrecv._copyfast", "COPY TO data read in bulk and encoded as snapshot JSON lines.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__copyfast(void)
{
    return PyModule_Create(&module);
}
