/* _native.Slots' arrive() and blocks(): the checks and the wire encoding of a binding and a block
 * table, once per request or table, in C (slot_batch.py's SlotEvents does the same in Python, with
 * the protobuf library's encoding; test/python-native.test.ts gives both the same
 * random calls, garbage included, and compares every result, error text and byte).
 *
 * Why: an engine at 1024 running requests takes about five new requests a step. In Python (checks,
 * a protobuf message, its serialization) each arrival with its table cost ~15 µs after the forward,
 * more than the whole step's other calls; here it is a few hundred nanoseconds.
 *
 * Wire form (head_bytes.py's pieces, field tags from the generated descriptors, given at
 * construction): TelemetryColumns.bind {slot, req_id, prompt_len, prompt_token_ids (packed)} and
 * TelemetryColumns.blocks {slot, block_ids (packed)}, zero and empty fields left out, fields in
 * number order, as the library writes them. Included by _native_slots.h after the store's calls. */

/* Slots.tags' indices after the head's four (head_bytes.TAGS has them in this order). */
enum { T_BIND = 4, T_BLOCKS, T_BIND_SLOT, T_BIND_REQ, T_BIND_PLEN, T_BIND_IDS, T_BLOCKS_SLOT, T_BLOCKS_IDS };

#define TAG_LEN(s, t) PyBytes_GET_SIZE((s)->tags[t])

/* x's items as a list (a new reference): x itself when it is a list (read at once, never kept),
 * else x.tolist() (numpy, torch) or list(x), as SlotEvents does. NULL: raised (x not iterable). */
static PyObject *as_list(PyObject *x) {
  if (PyList_CheckExact(x)) return Py_NewRef(x);
  PyObject *l = NULL;
  if (PyObject_HasAttrString(x, "tolist")) {
    PyObject *t = PyObject_CallMethod(x, "tolist", NULL);
    if (!t) return NULL;
    l = PyList_CheckExact(t) ? Py_NewRef(t) : PySequence_List(t);
    Py_DECREF(t);
  } else {
    l = PySequence_List(x);
  }
  return l;
}

/* The items of list l as uint32 (malloc'd into *out; *packed: their varints' bytes). 1: an item is
 * not an int (bools are not) in 0..2^32-1; -1: no memory. */
static int u32_items(PyObject *l, uint32_t **out, Py_ssize_t *packed) {
  Py_ssize_t k = PyList_GET_SIZE(l);
  uint32_t *v = PyMem_Malloc((size_t)(k ? k : 1) * sizeof(uint32_t));
  if (!v) return PyErr_NoMemory(), -1;
  *packed = 0;
  for (Py_ssize_t i = 0; i < k; i++) {
    PyObject *x = PyList_GET_ITEM(l, i);
    int of = 0;
    long long y = PyLong_Check(x) && !PyBool_Check(x) ? PyLong_AsLongLongAndOverflow(x, &of) : -1;
    if (of || y < 0 || y > 0xFFFFFFFFll) {
      PyErr_Clear();
      PyMem_Free(v);
      return 1;
    }
    v[i] = (uint32_t)y;
    *packed += (Py_ssize_t)uv_len(v[i]);
  }
  *out = v;
  return 0;
}

static char *ids_put(char *o, PyObject *tag, const uint32_t *v, Py_ssize_t k, Py_ssize_t packed) {
  if (!k) return o;
  o = uv_put(bytes_put(o, tag), (unsigned long long)packed);
  for (Py_ssize_t i = 0; i < k; i++) o = uv_put(o, v[i]);
  return o;
}

/* One entry of TelemetryColumns field `outer`: its tag, length and an inner message of `inner` bytes,
 * written by the caller at the returned position. */
static PyObject *entry_new(Slots *s, int outer, Py_ssize_t inner, char **at) {
  PyObject *b = PyBytes_FromStringAndSize(NULL, TAG_LEN(s, outer) + (Py_ssize_t)uv_len((unsigned long long)inner) + inner);
  if (b) *at = uv_put(bytes_put(PyBytes_AS_STRING(b), s->tags[outer]), (unsigned long long)inner);
  return b;
}

static PyObject *bind_entry(Slots *s, Py_ssize_t row, const char *req, Py_ssize_t n, uint32_t plen, const uint32_t *ids, Py_ssize_t k, Py_ssize_t packed) {
  Py_ssize_t inner = (row ? TAG_LEN(s, T_BIND_SLOT) + (Py_ssize_t)uv_len((unsigned long long)row) : 0) + TAG_LEN(s, T_BIND_REQ) + (Py_ssize_t)uv_len((unsigned long long)n) + n +
                     (plen ? TAG_LEN(s, T_BIND_PLEN) + (Py_ssize_t)uv_len(plen) : 0) + (k ? TAG_LEN(s, T_BIND_IDS) + (Py_ssize_t)uv_len((unsigned long long)packed) + packed : 0);
  char *o;
  PyObject *b = entry_new(s, T_BIND, inner, &o);
  if (!b) return NULL;
  if (row) o = uv_put(bytes_put(o, s->tags[T_BIND_SLOT]), (unsigned long long)row);
  o = uv_put(bytes_put(o, s->tags[T_BIND_REQ]), (unsigned long long)n);
  memcpy(o, req, (size_t)n), o += n;
  if (plen) o = uv_put(bytes_put(o, s->tags[T_BIND_PLEN]), plen);
  ids_put(o, s->tags[T_BIND_IDS], ids, k, packed);
  return b;
}

static PyObject *blocks_entry(Slots *s, Py_ssize_t row, const uint32_t *ids, Py_ssize_t k, Py_ssize_t packed) {
  Py_ssize_t inner = (row ? TAG_LEN(s, T_BLOCKS_SLOT) + (Py_ssize_t)uv_len((unsigned long long)row) : 0) + (k ? TAG_LEN(s, T_BLOCKS_IDS) + (Py_ssize_t)uv_len((unsigned long long)packed) + packed : 0);
  char *o;
  PyObject *b = entry_new(s, T_BLOCKS, inner, &o);
  if (!b) return NULL;
  if (row) o = uv_put(bytes_put(o, s->tags[T_BLOCKS_SLOT]), (unsigned long long)row);
  ids_put(o, s->tags[T_BLOCKS_IDS], ids, k, packed);
  return b;
}

static const char *const ARRIVE_ARGS[4] = {"row", "req_id", "prompt_len", "prompt_token_ids"};

/* arrive(row, req_id, prompt_len=0, prompt_token_ids=None): SlotEvents.arrive, its checks in its
 * order. The arguments are matched here (vectorcall: no tuple or dict made for them). */
static PyObject *slots_arrive(Slots *s, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *v[4] = {NULL, NULL, NULL, NULL};
  if (nargs > 4) return PyErr_Format(PyExc_TypeError, "arrive() takes at most 4 arguments (%zd given)", nargs);
  for (Py_ssize_t i = 0; i < nargs; i++) v[i] = args[i];
  for (Py_ssize_t i = 0, nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0; i < nk; i++) {
    PyObject *name = PyTuple_GET_ITEM(kwnames, i);
    int k = 0;
    while (k < 4 && PyUnicode_CompareWithASCIIString(name, ARRIVE_ARGS[k]) != 0) k++;
    if (k == 4) return PyErr_Format(PyExc_TypeError, "arrive() got an unexpected keyword argument %R", name);
    if (v[k]) return PyErr_Format(PyExc_TypeError, "arrive() got multiple values for argument '%s'", ARRIVE_ARGS[k]);
    v[k] = args[nargs + i];
  }
  if (!v[0] || !v[1]) return PyErr_Format(PyExc_TypeError, "arrive() missing required argument '%s'", ARRIVE_ARGS[v[0] ? 1 : 0]);
  PyObject *row = v[0], *req = v[1], *plen_o = v[2], *ids_o = v[3] ? v[3] : Py_None;
  Py_ssize_t r = slots_row(s, row, "arrive()", 0);
  if (r < 0) return NULL;
  if (!PyUnicode_Check(req) || PyUnicode_GET_LENGTH(req) == 0) return bad("arrive(): req_id must be a non-empty string, got %R", req);
  Py_ssize_t n;
  const char *utf8 = PyUnicode_AsUTF8AndSize(req, &n);
  if (!utf8) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    bad("arrive(): req_id must be valid UTF-8 (%S)", value ? value : Py_None);
    Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
    return NULL;
  }
  long long plen = 0;
  if (plen_o) {
    int of = 0;
    plen = PyLong_Check(plen_o) && !PyBool_Check(plen_o) ? PyLong_AsLongLongAndOverflow(plen_o, &of) : -1;
    if (of || plen < 0 || plen > 0xFFFFFFFFll) {
      PyErr_Clear();
      return bad("arrive(): prompt_len must be an integer in 0..2^32-1, got %R", plen_o);
    }
  }
  if (s->req[r]) return bad("arrive(): row %zd still holds request %R; free(row) it first", r, s->req[r]);
  if (s->flags[r] & F_FREED) return bad("arrive(): row %zd was freed since the last wave_head; bind it after the next wave_head", r);
  uint32_t *ids = NULL;
  Py_ssize_t k = 0, packed = 0;
  if (ids_o != Py_None) {
    PyObject *l = as_list(ids_o);
    if (!l) return NULL;
    int bad_ids = u32_items(l, &ids, &packed);
    k = PyList_GET_SIZE(l);
    Py_DECREF(l);
    if (bad_ids < 0) return NULL;
    if (bad_ids) return bad("arrive(): prompt_token_ids must be integers in 0..2^32-1");
  }
  /* The first head carries the prompt's ids; re-sends go without them. */
  PyObject *first = bind_entry(s, r, utf8, n, (uint32_t)plen, ids, k, packed);
  PyObject *resend = first && k ? bind_entry(s, r, utf8, n, (uint32_t)plen, NULL, 0, 0) : first;
  PyMem_Free(ids);
  if (!first || !resend) {
    Py_XDECREF(first);
    return NULL;
  }
  bind_store(s, r, req, (uint32_t)plen, first, resend);
  Py_DECREF(first);
  if (resend != first) Py_DECREF(resend);
  Py_RETURN_NONE;
}

/* blocks(row, block_ids): SlotEvents.blocks: the row's whole table, stored (and sent with the next
 * head) when it differs from the row's last one. */
static PyObject *slots_blocks(Slots *s, PyObject *const *a, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "blocks() takes row and block_ids (%zd given)", nargs);
  Py_ssize_t r = slots_row(s, a[0], "blocks()", 0);
  if (r < 0) return NULL;
  if (!s->req[r]) return bad("blocks(): row %zd holds no request (arrive() first)", r);
  PyObject *l = as_list(a[1]);
  if (!l) return NULL;
  uint32_t *ids = NULL;
  Py_ssize_t packed = 0;
  int bad_ids = u32_items(l, &ids, &packed);
  Py_ssize_t k = PyList_GET_SIZE(l);
  Py_DECREF(l);
  if (bad_ids) return bad_ids < 0 ? NULL : bad("blocks(): block ids of row %zd must be integers in 0..2^32-1", r);
  /* The table's bytes follow from its row and ids: the same bytes, the same table (no list kept). */
  PyObject *b = blocks_entry(s, r, ids, k, packed), *old = s->tbl_b[r];
  PyMem_Free(ids);
  if (!b) return NULL;
  if (old && PyBytes_GET_SIZE(old) == PyBytes_GET_SIZE(b) && !memcmp(PyBytes_AS_STRING(old), PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b)))
    Py_DECREF(b);
  else
    table_store(s, r, b);
  Py_RETURN_NONE;
}

static const uint8_t *uv_get(const uint8_t *p, const uint8_t *end, unsigned long long *v) {
  *v = 0;
  for (int shift = 0; p < end && shift < 64; shift += 7) {
    *v |= (unsigned long long)(*p & 0x7F) << shift;
    if (!(*p++ & 0x80)) return p;
  }
  return end;
}

/* table_ids(row): its block ids (a new list, read back from the bytes blocks_entry wrote), or None. */
static PyObject *slots_table_ids(Slots *s, PyObject *row) {
  Py_ssize_t r = PyLong_CheckExact(row) ? PyLong_AsSsize_t(row) : -1;
  if (r < 0 || r >= s->max_rows || !s->tbl_b || !s->tbl_b[r]) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  PyObject *b = s->tbl_b[r];
  const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(b), *end = p + PyBytes_GET_SIZE(b);
  unsigned long long v;
  p = uv_get(p + TAG_LEN(s, T_BLOCKS), end, &v); /* the entry's length */
  if (r) p = uv_get(p + TAG_LEN(s, T_BLOCKS_SLOT), end, &v);
  if (p < end) p = uv_get(p + TAG_LEN(s, T_BLOCKS_IDS), end, &v); /* the packed ids' length */
  PyObject *out = PyList_New(0);
  while (out && p < end) {
    p = uv_get(p, end, &v);
    PyObject *x = PyLong_FromUnsignedLongLong(v);
    if (!x || PyList_Append(out, x) < 0) Py_CLEAR(out);
    Py_XDECREF(x);
  }
  return out;
}
