/* Bytes assembled from pieces for _native.Slots (_native_slots.h): a head's sparse part is the
 * join of bytes objects encoded once per event, written once into the result with the few varints
 * around it (head_bytes.py's wire form). Included by _native.c before _native_slots.h. */

/* The pieces a head's sparse part joins, in order (borrowed references: none is released before the join). */
typedef struct {
  PyObject **p;
  Py_ssize_t n, cap, len;
} Pieces;

static int put(Pieces *q, PyObject *b) {
  if (!b) return 0; /* none to send (a state no call sequence reaches: skipped, never dereferenced) */
  if (q->n == q->cap) {
    Py_ssize_t cap = q->cap ? 2 * q->cap : 64;
    PyObject **p = PyMem_Realloc(q->p, (size_t)cap * sizeof(PyObject *));
    if (!p) return PyErr_NoMemory(), -1;
    q->p = p, q->cap = cap;
  }
  q->p[q->n++] = b;
  q->len += PyBytes_GET_SIZE(b);
  return 0;
}

static size_t uv_len(unsigned long long v) {
  size_t n = 1;
  while (v > 0x7F) v >>= 7, n++;
  return n;
}

static char *uv_put(char *o, unsigned long long v) {
  while (v > 0x7F) *o++ = (char)((v & 0x7F) | 0x80), v >>= 7;
  *o++ = (char)v;
  return o;
}

static char *bytes_put(char *o, PyObject *b) {
  memcpy(o, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
  return o + PyBytes_GET_SIZE(b);
}
