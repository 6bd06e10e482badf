/* _native.Slots: SlotEvents' state and per-step calls in C (slot_batch.py has the same behaviour in
 * Python and the rules in its docstrings; test/python-native.test.ts runs both on the same random
 * calls and compares every head's bytes and every event list). Included by _native.c.
 *
 * Why: right after the engine's forward the step runs with cold caches, and what it pays is the
 * memory it touches. Here a row's binding, table and flags sit in arrays by row, a step's events
 * and the new bindings and tables in short row lists, and a head's sparse part is written into one
 * bytes object: no dictionary, tuple or intermediate list per step.
 *
 * arrive() and blocks() check and encode each binding and table here too (_native_arrive.h). Rows
 * are checked against max_rows on every call, whatever the caller; a row that is not an int in
 * range, or holds no request, goes to the `held` callable given at construction, which returns the
 * row or raises the Python side's own ConfigError. */

enum { F_FINISHED = 1, F_FREED = 2, M_NEW_BIND = 1, M_NEW_BLOCKS = 2, RESEND_PER_STEP = 4 };

typedef struct {
  PyObject_HEAD
  Py_ssize_t max_rows, live;
  PyObject **req;     /* row -> its request id (str), NULL: free */
  PyObject **bind_b;  /* row -> its binding's bytes for re-sends */
  PyObject **first;   /* row -> its new binding's bytes, while M_NEW_BIND */
  PyObject **tbl_b;   /* row -> its block table's bytes (the ids are read back from them), NULL: no table */
  uint32_t *plen;
  uint8_t *flags, *mark;
  /* ev: this step's events, rows in call order; cycle: the round of re-sends. nb / nk: the new
   * bindings' and tables' rows in call order (2 * max_rows long), where a row freed before a head
   * took it leaves a hole (-1) instead of a shift, so a long pause (no head: bus off, not the head
   * rank) costs each free O(1); a full list is compacted. nb_at / nk_at: a marked row's index there. */
  int32_t *ev, *nb, *nk, *cycle, *nb_at, *nk_at;
  Py_ssize_t n_ev, n_nb, n_nk, n_cycle, cycle_at;
  int resend_all;
  PyObject *held, *tags[12]; /* head_bytes.TAGS: WaveHeadRequest.wave, .telemetry, StepTelemetry.wave, .columns, then _native_arrive.h's */
} Slots;

static void slots_clear(Slots *s) {
  for (Py_ssize_t r = 0; s->req && r < s->max_rows; r++) {
    Py_CLEAR(s->req[r]);
    Py_CLEAR(s->bind_b[r]);
    Py_CLEAR(s->first[r]);
    Py_CLEAR(s->tbl_b[r]);
  }
  PyMem_Free(s->req);
  s->req = s->bind_b = s->first = s->tbl_b = NULL;
  PyMem_Free(s->plen);
  s->plen = NULL;
  PyMem_Free(s->flags);
  s->flags = s->mark = NULL;
  PyMem_Free(s->ev);
  s->ev = s->nb = s->nk = s->cycle = s->nb_at = s->nk_at = NULL;
  Py_CLEAR(s->held);
  for (int i = 0; i < 12; i++) Py_CLEAR(s->tags[i]);
  s->max_rows = s->live = s->n_ev = s->n_nb = s->n_nk = s->n_cycle = s->cycle_at = 0;
}

static void slots_dealloc(Slots *s) {
  slots_clear(s);
  Py_TYPE(s)->tp_free((PyObject *)s);
}

/* Slots(max_rows, tags, held) */
static int slots_init(Slots *s, PyObject *args, PyObject *kw) {
  Py_ssize_t rows;
  PyObject *tags, *held;
  if (!PyArg_ParseTuple(args, "nO!O:Slots", &rows, &PyTuple_Type, &tags, &held)) return -1;
  if (rows < 1 || rows > (1 << 24)) return bad("Slots(): max_rows must be in 1..2^24, got %zd", rows), -1;
  if (PyTuple_GET_SIZE(tags) != 12) return bad("Slots(): 12 field tags, got %zd", PyTuple_GET_SIZE(tags)), -1;
  for (int i = 0; i < 12; i++)
    if (!PyBytes_Check(PyTuple_GET_ITEM(tags, i)) || PyBytes_GET_SIZE(PyTuple_GET_ITEM(tags, i)) > 5) return bad("Slots(): tag %d is not a field tag's bytes", i), -1;
  if (!PyCallable_Check(held)) return bad("Slots(): held must be callable"), -1;
  slots_clear(s);
  s->req = PyMem_Calloc((size_t)rows * 4, sizeof(PyObject *));
  s->plen = PyMem_Calloc((size_t)rows, sizeof(uint32_t));
  s->flags = PyMem_Calloc((size_t)rows * 2, 1);
  s->ev = PyMem_Calloc((size_t)rows * 8, sizeof(int32_t));
  if (!s->req || !s->plen || !s->flags || !s->ev) {
    PyMem_Free(s->req), PyMem_Free(s->plen), PyMem_Free(s->flags), PyMem_Free(s->ev);
    s->req = NULL, s->plen = NULL, s->flags = NULL, s->ev = NULL;
    PyErr_NoMemory();
    return -1;
  }
  s->bind_b = s->req + rows, s->first = s->req + 2 * rows, s->tbl_b = s->req + 3 * rows;
  s->mark = s->flags + rows;
  s->nb = s->ev + rows, s->nk = s->ev + 3 * rows, s->cycle = s->ev + 5 * rows;
  s->nb_at = s->ev + 6 * rows, s->nk_at = s->ev + 7 * rows;
  s->max_rows = rows;
  for (int i = 0; i < 12; i++) s->tags[i] = Py_NewRef(PyTuple_GET_ITEM(tags, i));
  s->held = Py_NewRef(held);
  return 0;
}

/* The row of a call: a live row's int at once, anything else through held(self, row, where). -1: raised. */
static Py_ssize_t slots_row(Slots *s, PyObject *row, const char *where, int need_live) {
  if (PyLong_CheckExact(row)) {
    Py_ssize_t r = PyLong_AsSsize_t(row);
    if (r >= 0 && r < s->max_rows && (!need_live || s->req[r])) return r;
    PyErr_Clear();
  }
  if (!s->req) return bad("%s: Slots not initialised", where), -1;
  PyObject *got = PyObject_CallFunction(s->held, "OOsi", (PyObject *)s, row, where, need_live);
  if (!got) return -1;
  Py_ssize_t r = PyLong_Check(got) ? PyLong_AsSsize_t(got) : -1;
  Py_DECREF(got);
  if (r < 0 || r >= s->max_rows || (need_live && !s->req[r])) {
    if (!PyErr_Occurred()) bad("%s: row %R is not a live row", where, row);
    return -1;
  }
  return r;
}

static PyObject *slots_event(Slots *s, PyObject *row, uint8_t flag, const char *where) {
  Py_ssize_t r = slots_row(s, row, where, 1);
  if (r < 0) return NULL;
  if (!s->flags[r]) s->ev[s->n_ev++] = (int32_t)r;
  s->flags[r] |= flag;
  Py_RETURN_NONE;
}

static PyObject *slots_finish(Slots *s, PyObject *row) { return slots_event(s, row, F_FINISHED, "finish()"); }
static PyObject *slots_free(Slots *s, PyObject *row) { return slots_event(s, row, F_FREED, "free()"); }

/* Appends row r to a new-row list (list, its count, the rows' indexes there), squeezing out the
 * holes first when it is full: each row is in it once, so at least half of it is free after. */
static void pending_add(Slots *s, int32_t *list, Py_ssize_t *n, int32_t *at, Py_ssize_t r) {
  if (*n == 2 * s->max_rows) {
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < *n; i++)
      if (list[i] >= 0) at[list[i]] = (int32_t)k, list[k++] = list[i];
    *n = k;
  }
  at[r] = (int32_t)*n;
  list[(*n)++] = (int32_t)r;
}

/* arrive()'s store, after its checks (_native_arrive.h): row r, free and not freed since the last
 * head, takes req with its binding's bytes (first for the next head, resend for the round). */
static void bind_store(Slots *s, Py_ssize_t r, PyObject *req, uint32_t plen, PyObject *first, PyObject *resend) {
  s->req[r] = Py_NewRef(req);
  s->plen[r] = plen;
  Py_XSETREF(s->bind_b[r], Py_NewRef(resend));
  Py_XSETREF(s->first[r], Py_NewRef(first));
  Py_CLEAR(s->tbl_b[r]);
  if (!(s->mark[r] & M_NEW_BIND)) pending_add(s, s->nb, &s->n_nb, s->nb_at, r);
  s->mark[r] |= M_NEW_BIND;
  s->live++;
}

/* blocks()'s store, after its checks and comparison: the live row r's table's bytes (stolen). */
static void table_store(Slots *s, Py_ssize_t r, PyObject *b) {
  Py_XSETREF(s->tbl_b[r], b);
  if (!(s->mark[r] & M_NEW_BLOCKS)) pending_add(s, s->nk, &s->n_nk, s->nk_at, r);
  s->mark[r] |= M_NEW_BLOCKS;
}

static PyObject *row_or_none(PyObject **col, Slots *s, PyObject *row) {
  Py_ssize_t r = PyLong_CheckExact(row) ? PyLong_AsSsize_t(row) : -1;
  if (r < 0 || r >= s->max_rows || !col || !col[r]) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  return Py_NewRef(col[r]);
}

/* holder(row): its request id, or None (table_ids(row), its block ids: _native_arrive.h). */
static PyObject *slots_holder(Slots *s, PyObject *row) { return row_or_none(s->req, s, row); }

static PyObject *slots_row_flags(Slots *s, PyObject *row) {
  Py_ssize_t r = PyLong_CheckExact(row) ? PyLong_AsSsize_t(row) : -1;
  if (r < 0 || r >= s->max_rows || !s->flags) {
    PyErr_Clear();
    return PyLong_FromLong(0);
  }
  return PyLong_FromLong(s->flags[r]);
}

/* sent(): frees take effect, events dropped (slot_batch.py SlotEvents.sent). A freed row's new
 * binding and table leave their lists (never sent: a freed row's binding must not go later). */
static PyObject *slots_sent(Slots *s, PyObject *unused) {
  for (Py_ssize_t i = 0; i < s->n_ev; i++) {
    int32_t r = s->ev[i];
    if (s->flags[r] & F_FREED) {
      if (s->mark[r] & M_NEW_BIND) s->nb[s->nb_at[r]] = -1;
      if (s->mark[r] & M_NEW_BLOCKS) s->nk[s->nk_at[r]] = -1;
      if (s->req[r]) s->live--;
      Py_CLEAR(s->req[r]);
      Py_CLEAR(s->bind_b[r]);
      Py_CLEAR(s->first[r]);
      Py_CLEAR(s->tbl_b[r]);
      s->mark[r] = 0;
    }
    s->flags[r] = 0;
  }
  s->n_ev = 0;
  Py_RETURN_NONE;
}

static PyObject *slots_resend_all(Slots *s, PyObject *unused) {
  s->resend_all = 1;
  Py_RETURN_NONE;
}

/* reset(): sending paused (SlotEvents.reset): frees take effect, events dropped, everything re-sent. */
static PyObject *slots_reset(Slots *s, PyObject *unused) {
  PyObject *r = slots_sent(s, NULL);
  s->resend_all = 1;
  return r;
}

static PyObject *slots_pending_events(Slots *s, PyObject *unused) { return PyLong_FromSsize_t(s->n_ev); }

/* event_columns(): (rows, flags) of this step's finish/free events, as lists. */
static PyObject *slots_event_columns(Slots *s, PyObject *unused) {
  PyObject *rows = PyList_New(s->n_ev), *flags = PyList_New(s->n_ev);
  if (!rows || !flags) goto fail;
  for (Py_ssize_t i = 0; i < s->n_ev; i++) {
    PyObject *r = PyLong_FromLong(s->ev[i]), *f = PyLong_FromLong(s->flags[s->ev[i]]);
    if (!r || !f) {
      Py_XDECREF(r), Py_XDECREF(f);
      goto fail;
    }
    PyList_SET_ITEM(rows, i, r);
    PyList_SET_ITEM(flags, i, f);
  }
  return Py_BuildValue("(NN)", rows, flags);
fail:
  Py_XDECREF(rows), Py_XDECREF(flags);
  return NULL;
}

/* The next RESEND_PER_STEP rows of the round, into out; a new round (the live rows, by row) when it ends. */
static Py_ssize_t resend_rows(Slots *s, int32_t *out) {
  Py_ssize_t k = 0, at = s->cycle_at;
  while (k < RESEND_PER_STEP && at < s->n_cycle) out[k++] = s->cycle[at++];
  if (k < RESEND_PER_STEP) {
    s->n_cycle = 0;
    for (Py_ssize_t r = 0; r < s->max_rows; r++)
      if (s->req[r]) s->cycle[s->n_cycle++] = (int32_t)r;
    Py_ssize_t need = RESEND_PER_STEP - k, more = need < s->n_cycle ? need : s->n_cycle;
    for (Py_ssize_t i = 0; i < more; i++) out[k++] = s->cycle[i];
    at = more < need ? 0 : more; /* fewer live rows than a step re-sends: the next step starts a round again */
  }
  s->cycle_at = at;
  return k;
}

/* SlotEvents.sparse_bytes' selection, as pieces (see there for the rules). */
static int sparse_pieces(Slots *s, Pieces *q) {
  if (s->resend_all) {
    s->resend_all = 0;
    for (Py_ssize_t r = 0; r < s->max_rows; r++)
      if (s->req[r] && !(s->mark[r] & M_NEW_BIND) && put(q, s->bind_b[r]) < 0) return -1;
    for (Py_ssize_t i = 0; i < s->n_nb; i++)
      if (s->nb[i] >= 0 && put(q, s->first[s->nb[i]]) < 0) return -1;
    for (Py_ssize_t r = 0; r < s->max_rows; r++)
      if (s->tbl_b[r] && put(q, s->tbl_b[r]) < 0) return -1;
    return 0;
  }
  int32_t rows[RESEND_PER_STEP];
  Py_ssize_t k = resend_rows(s, rows);
  for (Py_ssize_t i = 0; i < k; i++)
    if (s->req[rows[i]] && !(s->mark[rows[i]] & M_NEW_BIND) && put(q, s->bind_b[rows[i]]) < 0) return -1;
  for (Py_ssize_t i = 0; i < s->n_nb; i++)
    if (s->nb[i] >= 0 && put(q, s->first[s->nb[i]]) < 0) return -1;
  for (Py_ssize_t i = 0; i < k; i++) {
    int32_t r = rows[i];
    if (s->req[r] && !(s->mark[r] & M_NEW_BIND) && s->tbl_b[r] && !(s->mark[r] & M_NEW_BLOCKS) && put(q, s->tbl_b[r]) < 0) return -1;
  }
  for (Py_ssize_t i = 0; i < s->n_nk; i++)
    if (s->nk[i] >= 0 && put(q, s->tbl_b[s->nk[i]]) < 0) return -1;
  return 0;
}

/* After a head took the new ones: the lists empty (the pieces are already joined). */
static void sparse_taken(Slots *s) {
  for (Py_ssize_t i = 0; i < s->n_nb; i++) {
    if (s->nb[i] < 0) continue;
    s->mark[s->nb[i]] &= ~M_NEW_BIND;
    Py_CLEAR(s->first[s->nb[i]]);
  }
  for (Py_ssize_t i = 0; i < s->n_nk; i++)
    if (s->nk[i] >= 0) s->mark[s->nk[i]] &= ~M_NEW_BLOCKS;
  s->n_nb = s->n_nk = 0;
}

/* head(wave, tele_wave, non_finite) -> head_bytes(wave, tele_wave, sparse_bytes(), non_finite), in
 * one bytes object (head_bytes.py says what the fields are; zero and empty ones are left out). */
static PyObject *slots_head(Slots *s, PyObject *const *a, Py_ssize_t n) {
  if (n != 3 || !PyBytes_Check(a[2])) return bad("head(): wave, tele_wave, non_finite (bytes)");
  unsigned long long wave = PyLong_AsUnsignedLongLong(a[0]), tele = PyLong_AsUnsignedLongLong(a[1]);
  if (PyErr_Occurred()) return bad_argument("head(): wave");
  if (!s->req) return bad("head(): Slots not initialised");
  Pieces q = {0};
  if (sparse_pieces(s, &q) < 0) {
    PyMem_Free(q.p);
    return NULL;
  }
  PyObject *hw = s->tags[0], *ht = s->tags[1], *tw = s->tags[2], *tc = s->tags[3], *nf = a[2];
  Py_ssize_t cols = q.len;
  Py_ssize_t lead = (tele ? PyBytes_GET_SIZE(tw) + (Py_ssize_t)uv_len(tele) : 0) + PyBytes_GET_SIZE(nf) + (cols ? PyBytes_GET_SIZE(tc) + (Py_ssize_t)uv_len((unsigned long long)cols) : 0);
  Py_ssize_t tel = lead + cols;
  Py_ssize_t total = (wave ? PyBytes_GET_SIZE(hw) + (Py_ssize_t)uv_len(wave) : 0) + PyBytes_GET_SIZE(ht) + (Py_ssize_t)uv_len((unsigned long long)tel) + tel;
  PyObject *out = PyBytes_FromStringAndSize(NULL, total);
  if (!out) {
    PyMem_Free(q.p);
    return NULL;
  }
  char *o = PyBytes_AS_STRING(out);
  if (wave) o = uv_put(bytes_put(o, hw), wave);
  o = uv_put(bytes_put(o, ht), (unsigned long long)tel);
  if (tele) o = uv_put(bytes_put(o, tw), tele);
  o = bytes_put(o, nf);
  if (cols) o = uv_put(bytes_put(o, tc), (unsigned long long)cols);
  for (Py_ssize_t i = 0; i < q.n; i++) o = bytes_put(o, q.p[i]);
  PyMem_Free(q.p);
  sparse_taken(s);
  return out;
}

/* sparse_bytes(): TelemetryColumns' wire bytes of what the next head carries (tests and the inline path). */
static PyObject *slots_sparse_bytes(Slots *s, PyObject *unused) {
  if (!s->req) return bad("sparse_bytes(): Slots not initialised");
  Pieces q = {0};
  if (sparse_pieces(s, &q) < 0) {
    PyMem_Free(q.p);
    return NULL;
  }
  PyObject *out = PyBytes_FromStringAndSize(NULL, q.len);
  if (out) {
    char *o = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < q.n; i++) o = bytes_put(o, q.p[i]);
    sparse_taken(s);
  }
  PyMem_Free(q.p);
  return out;
}

/* new_bytes(): the new bindings' and tables' bytes (not the re-sends), left pending. */
static PyObject *slots_new_bytes(Slots *s, PyObject *unused) {
  Pieces q = {0};
  int ok = 0;
  for (Py_ssize_t i = 0; ok == 0 && i < s->n_nb; i++)
    if (s->nb[i] >= 0) ok = put(&q, s->first[s->nb[i]]);
  for (Py_ssize_t i = 0; ok == 0 && i < s->n_nk; i++)
    if (s->nk[i] >= 0) ok = put(&q, s->tbl_b[s->nk[i]]);
  PyObject *out = ok < 0 ? NULL : PyBytes_FromStringAndSize(NULL, q.len);
  if (out) {
    char *o = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < q.n; i++) o = bytes_put(o, q.p[i]);
  }
  PyMem_Free(q.p);
  return out;
}

static PyObject *slots_get_live(Slots *s, void *unused) { return PyLong_FromSsize_t(s->live); }
static PyObject *slots_get_max_rows(Slots *s, void *unused) { return PyLong_FromSsize_t(s->max_rows); }

#include "_native_arrive.h"

/* finish_rows(rows) / free_rows(rows): finish / free of each of rows (a list, or what as_list
 * takes: a tuple, a numpy array, a tensor), in order, each row checked as one call checks it (the
 * rows before a refused one stay flagged); a str is refused whole (slot_batch.py _rows_list). */
static PyObject *slots_flag_rows(Slots *s, PyObject *rows, uint8_t flag, const char *where) {
  if (PyUnicode_CheckExact(rows)) return bad("%s: rows must be a sequence of rows, got the str %R", where, rows);
  PyObject *l = as_list(rows);
  if (!l) {
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
    PyErr_Clear();
    return bad("%s: rows must be a sequence of rows (list, tuple, numpy array, tensor), got %s", where, Py_TYPE(rows)->tp_name);
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(l); i++) {
    PyObject *row = Py_NewRef(PyList_GET_ITEM(l, i)), *r = slots_event(s, row, flag, where);
    Py_DECREF(row);
    if (!r) {
      Py_DECREF(l);
      return NULL;
    }
    Py_DECREF(r);
  }
  Py_DECREF(l);
  Py_RETURN_NONE;
}

static PyObject *slots_finish_rows(Slots *s, PyObject *rows) { return slots_flag_rows(s, rows, F_FINISHED, "finish_rows()"); }
static PyObject *slots_free_rows(Slots *s, PyObject *rows) { return slots_flag_rows(s, rows, F_FREED, "free_rows()"); }

static PyMethodDef slots_methods[] = {
  {"finish", (PyCFunction)slots_finish, METH_O, "row's request finished in the step the next head reports."},
  {"free", (PyCFunction)slots_free, METH_O, "row's blocks were given back: its binding ends with the next head."},
  {"finish_rows", (PyCFunction)slots_finish_rows, METH_O, "finish(row) for each of rows, in order."},
  {"free_rows", (PyCFunction)slots_free_rows, METH_O, "free(row) for each of rows, in order."},
  {"sent", (PyCFunction)slots_sent, METH_NOARGS, "The head went out: frees take effect."},
  {"resend_all", (PyCFunction)slots_resend_all, METH_NOARGS, "The next head carries every live binding and table."},
  {"reset", (PyCFunction)slots_reset, METH_NOARGS, "Sending paused: sent(), and the next head carries every live binding and table."},
  {"pending_events", (PyCFunction)slots_pending_events, METH_NOARGS, "This step's finish/free events, counted."},
  {"event_columns", (PyCFunction)slots_event_columns, METH_NOARGS, "(rows, flags) of this step's finish/free events."},
  {"sparse_bytes", (PyCFunction)slots_sparse_bytes, METH_NOARGS, "TelemetryColumns' bytes of the pending bindings and tables."},
  {"head", (PyCFunction)(void (*)(void))slots_head, METH_FASTCALL, "head_bytes(wave, tele_wave, sparse_bytes(), non_finite) in one bytes object."},
  {"new_bytes", (PyCFunction)slots_new_bytes, METH_NOARGS, "The new bindings' and tables' bytes, left pending."},
  {"holder", (PyCFunction)slots_holder, METH_O, "row's request id, or None."},
  {"table_ids", (PyCFunction)slots_table_ids, METH_O, "row's block ids, or None."},
  {"row_flags", (PyCFunction)slots_row_flags, METH_O, "row's finish/free flags since the last head."},
  {"arrive", (PyCFunction)(void (*)(void))slots_arrive, METH_FASTCALL | METH_KEYWORDS, "arrive(row, req_id, prompt_len=0, prompt_token_ids=None): row holds req_id until free(row)."},
  {"blocks", (PyCFunction)(void (*)(void))slots_blocks, METH_FASTCALL, "blocks(row, block_ids): row's whole block table, sent when it changed."},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef slots_getset[] = {
  {"live", (getter)slots_get_live, NULL, "rows holding a request", NULL},
  {"max_rows", (getter)slots_get_max_rows, NULL, "the batch's rows", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SlotsType = {
  PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wavebus_client._native.Slots",
  .tp_basicsize = sizeof(Slots),
  .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
  .tp_doc = "SlotEvents' state and per-step calls in C (slot_batch.py NativeSlotEvents).",
  .tp_new = PyType_GenericNew,
  .tp_init = (initproc)slots_init,
  .tp_dealloc = (destructor)slots_dealloc,
  .tp_methods = slots_methods,
  .tp_getset = slots_getset,
};
