/* wavebus_client._native: the Python client's optional C fast path for the per-step shared-memory
 * writes and the tensor batch's per-step events (Slots, _native_slots.h; docs/python-client.md,
 * "The native path"). Plain C against the CPython API, no other dependency. Nothing here knows a layout: every offset and capacity comes from the Python side
 * (ring.py and digest.py compute them from proto/layouts.json through shm_layout.py), and every
 * one is checked against the mapping and the slot on every call, so no argument makes a store
 * outside the slot. A bad length or offset raises the package's ConfigError; an array this code
 * does not take (not C-contiguous, a dtype it does not convert exactly as numpy does) returns None
 * before anything is written, and the caller takes its numpy path.
 *
 * Ordering rule (the seqlock the agent's readers rely on, as ring.py's docstring says): the slot's
 * seq word is stored odd, a release fence, then the columns and counts, then seq even with a
 * release store, and only then the header's `written` word (release). A reader that sees seq even
 * and unchanged around its copy saw a whole slot.
 *
 * The CRC-32 is zlib's (reflected 0xEDB88320): folded with PCLMULQDQ where the CPU has it (x86-64),
 * else slice-by-8 tables; both are compared with zlib.crc32 by test/python-native.test.ts.
 *
 * Conversions are the ones numpy's unsafe cast makes, bit for bit: integers of any width to a
 * 32-bit integer column by truncation (two's complement), float64 to float32 by the C cast. Little
 * endian only (x86-64, arm64), as the ring's layout is.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "wavebus_client._native: the ring layouts are little-endian"
#endif

static PyObject *config_error; /* wavebus_client.errors.ConfigError */

#if PY_VERSION_HEX < 0x030A0000 /* Py_NewRef is 3.10's; the package takes 3.9 */
static inline PyObject *wb_new_ref(PyObject *o) {
  Py_INCREF(o);
  return o;
}
#define Py_NewRef(o) wb_new_ref((PyObject *)(o))
#endif

#include "_native_crc.h"
#include "_native_cast.h"

static PyObject *bad(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  PyErr_FormatV(config_error ? config_error : PyExc_ValueError, fmt, ap);
  va_end(ap);
  return NULL;
}

/* A TypeError or OverflowError raised converting an argument, as a ConfigError naming it. */
static PyObject *bad_argument(const char *where) {
  if (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_OverflowError)) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    bad("%s: %S", where, value ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
  }
  return NULL;
}

#include "_native_bytes.h"
#include "_native_slots.h"

/* [at, at + len) inside [lo, hi) */
static int inside(long long at, long long len, long long lo, long long hi) {
  return at >= lo && len >= 0 && at <= hi && len <= hi - at;
}

static void store_seq(unsigned char *base, long long at, uint64_t v, int release) {
  __atomic_store_n((uint64_t *)(base + at), v, release ? __ATOMIC_RELEASE : __ATOMIC_RELAXED);
}

/* ---- the telemetry ring's slot write ---- */

/* The plan ring.py packs per slot (int64s; absolute offsets in the mapping), in the order of these
 * enums: the module exports their names (RING_PLAN, RING_PLAN_COLUMN), and ring.py packs its values
 * by those names, so the order is written down here only. */
enum { P_BASE, P_STRIDE, P_SEQ, P_WAVE, P_ROWS, P_TOKENS, P_EVENTS, P_PRESENT, P_EXTRA_LEN, P_EXTRA, P_EXTRA_CAP,
       P_EVROW, P_EVROW_CAP, P_EVROW_KIND, P_EVROW_SIZE, P_EVFLAGS, P_EVFLAGS_CAP, P_EV_BITS, P_EXTRA_BIT, P_WRITTEN,
       P_NCOLS, P_COLS };
static const char *const plan_names[P_COLS] = {"base", "stride", "seq", "wave", "rows", "tokens", "events", "present", "extra_len",
  "extra", "extra_cap", "event_row", "event_row_cap", "event_row_kind", "event_row_size", "event_flags", "event_flags_cap",
  "event_bits", "extra_bit", "written", "columns"};
enum { C_BIT, C_AT, C_CAP, C_KIND, C_SIZE, C_PER_TOKEN, C_FIELDS };
static const char *const column_names[C_FIELDS] = {"bit", "at", "cap", "kind", "size", "per_token"};
#define MAX_COLS 16

/* ring_write(mm, plan, seq, wave, present, arrays, rows, tokens, ev_rows, ev_flags, extra) -> True,
 * or None when an array is not taken here (nothing written). See ring.py TelemetryRing.write. */
static PyObject *ring_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 11) return bad("ring_write(): 11 arguments, got %zd", nargs);
  Py_buffer mm, plan_b, extra, cols[MAX_COLS];
  int ncols_held = 0, have_mm = 0, have_plan = 0, have_extra = 0;
  PyObject *result = NULL, *arrays = NULL, *evr = NULL, *evf = NULL;
  unsigned long long seq = PyLong_AsUnsignedLongLong(args[2]), wave = PyLong_AsUnsignedLongLong(args[3]);
  long long present = PyLong_AsLongLong(args[4]), rows = PyLong_AsLongLong(args[6]), tokens = PyLong_AsLongLong(args[7]);
  if (PyErr_Occurred()) return bad_argument("ring_write(): seq, wave, present, rows and tokens must be integers in range");
  if (PyObject_GetBuffer(args[0], &mm, PyBUF_WRITABLE) != 0) return NULL;
  have_mm = 1;
  if (PyObject_GetBuffer(args[1], &plan_b, PyBUF_SIMPLE) != 0) goto done;
  have_plan = 1;
  const long long *p = plan_b.buf;
  Py_ssize_t np_ = plan_b.len / 8;
  if (plan_b.len % 8 || np_ < P_COLS || p[P_NCOLS] < 0 || p[P_NCOLS] > MAX_COLS || np_ != P_COLS + C_FIELDS * p[P_NCOLS]) {
    bad("ring_write(): a plan of %zd bytes is not one slot's", plan_b.len);
    goto done;
  }
  const long long lo = p[P_BASE], hi = p[P_BASE] + p[P_STRIDE];
  if (p[P_STRIDE] < 0 || !inside(lo, p[P_STRIDE], 0, mm.len) || !inside(p[P_WRITTEN], 8, 0, lo) || p[P_WRITTEN] % 8 || p[P_SEQ] % 8 ||
      !inside(p[P_SEQ], 8, lo, hi) || !inside(p[P_WAVE], 8, lo, hi) || !inside(p[P_ROWS], 4, lo, hi) || !inside(p[P_TOKENS], 4, lo, hi) ||
      !inside(p[P_EVENTS], 4, lo, hi) || !inside(p[P_PRESENT], 4, lo, hi) || !inside(p[P_EXTRA_LEN], 4, lo, hi) ||
      !inside(p[P_EXTRA], p[P_EXTRA_CAP], lo, hi) || p[P_EVFLAGS_CAP] < 0 || !inside(p[P_EVFLAGS], p[P_EVFLAGS_CAP], lo, hi) ||
      p[P_EVROW_CAP] < 0 || p[P_EVROW_CAP] > (1LL << 40) || !inside(p[P_EVROW], p[P_EVROW_CAP] * p[P_EVROW_SIZE], lo, hi) ||
      !(p[P_EVROW_SIZE] == 4 || p[P_EVROW_SIZE] == 2) || !(p[P_EVROW_KIND] == 'i' || p[P_EVROW_KIND] == 'u')) {
    bad("ring_write(): the plan's offsets lie outside the slot (%lld..%lld) or the mapping (%zd bytes)", lo, hi, mm.len);
    goto done;
  }
  if (seq < 2 || seq % 2) {
    bad("ring_write(): seq must be even and at least 2, got %llu", seq);
    goto done;
  }
  if (rows < 0 || tokens < 0) {
    bad("ring_write(): rows %lld and tokens %lld must not be negative", rows, tokens);
    goto done;
  }
  arrays = PySequence_Fast(args[5], "ring_write(): arrays must be a sequence");
  if (!arrays) {
    bad_argument("ring_write(): arrays");
    goto done;
  }
  Py_ssize_t narrays = PySequence_Fast_GET_SIZE(arrays), used = 0;
  for (long long c = 0; c < p[P_NCOLS]; c++) {
    const long long *col = p + P_COLS + C_FIELDS * c;
    if (!(present & col[C_BIT])) continue;
    long long n = col[C_PER_TOKEN] ? tokens : rows;
    if (col[C_CAP] < 0 || col[C_CAP] > (1LL << 40) || !(col[C_SIZE] == 1 || col[C_SIZE] == 2 || col[C_SIZE] == 4) || !inside(col[C_AT], col[C_CAP] * col[C_SIZE], lo, hi)) {
      bad("ring_write(): column %lld's place lies outside the slot", c);
      goto done;
    }
    if (n > col[C_CAP]) {
      bad("ring_write(): %lld values for column %lld of %lld", n, c, col[C_CAP]);
      goto done;
    }
    if (used >= narrays) {
      bad("ring_write(): present %lld names more columns than the %zd arrays given", present, narrays);
      goto done;
    }
    if (!take_array(PySequence_Fast_GET_ITEM(arrays, used), &cols[used])) goto done; /* None: numpy's path */
    ncols_held = (int)++used;
    if (!convertible(&cols[used - 1], (int)col[C_KIND], (int)col[C_SIZE])) goto done;
    if (cols[used - 1].len / cols[used - 1].itemsize != n) {
      bad("ring_write(): column %lld has %zd values, not %lld", c, cols[used - 1].len / cols[used - 1].itemsize, n);
      goto done;
    }
  }
  if (used != narrays) {
    bad("ring_write(): %zd arrays for the %zd columns present names", narrays, used);
    goto done;
  }
  evr = PySequence_Fast(args[8], "ring_write(): ev_rows must be a sequence");
  evf = evr ? PySequence_Fast(args[9], "ring_write(): ev_flags must be a sequence") : NULL;
  if (!evf) {
    bad_argument("ring_write(): ev_rows and ev_flags");
    goto done;
  }
  Py_ssize_t events = PySequence_Fast_GET_SIZE(evr);
  if (events != PySequence_Fast_GET_SIZE(evf) || events > p[P_EVROW_CAP] || events > p[P_EVFLAGS_CAP]) {
    bad("ring_write(): %zd event rows and %zd flags for a slot of %lld events", events, PySequence_Fast_GET_SIZE(evf), p[P_EVROW_CAP]);
    goto done;
  }
  long long row_max = p[P_EVROW_SIZE] == 2 ? 0xFFFF : p[P_EVROW_KIND] == 'i' ? 0x7FFFFFFF : 0xFFFFFFFFLL;
  for (Py_ssize_t e = 0; e < events; e++) {
    long long r = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(evr, e)), f = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(evf, e));
    if (PyErr_Occurred()) {
      bad_argument("ring_write(): an event's row or flags");
      goto done;
    }
    if (r < 0 || r > row_max || f < 0 || f > 255) {
      bad("ring_write(): event %zd (row %lld, flags %lld) out of range", e, r, f);
      goto done;
    }
  }
  if (PyObject_GetBuffer(args[10], &extra, PyBUF_SIMPLE) != 0) goto done;
  have_extra = 1;
  if (extra.len > p[P_EXTRA_CAP]) {
    bad("ring_write(): %zd extra bytes for a slot of %lld", extra.len, p[P_EXTRA_CAP]);
    goto done;
  }

  /* Everything checked: the slot is written, seq odd first. */
  unsigned char *m = mm.buf;
  store_seq(m, p[P_SEQ], seq - 1, 0);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  used = 0;
  for (long long c = 0; c < p[P_NCOLS]; c++) {
    const long long *col = p + P_COLS + C_FIELDS * c;
    if (!(present & col[C_BIT])) continue;
    store(m + col[C_AT], &cols[used], col[C_PER_TOKEN] ? tokens : rows, (int)col[C_KIND], (int)col[C_SIZE]);
    used++;
  }
  for (Py_ssize_t e = 0; e < events; e++) {
    long long r = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(evr, e));
    if (p[P_EVROW_SIZE] == 4) {
      uint32_t v = (uint32_t)r;
      memcpy(m + p[P_EVROW] + 4 * e, &v, 4);
    } else {
      uint16_t v = (uint16_t)r;
      memcpy(m + p[P_EVROW] + 2 * e, &v, 2);
    }
    m[p[P_EVFLAGS] + e] = (unsigned char)PyLong_AsLong(PySequence_Fast_GET_ITEM(evf, e));
  }
  if (events) present |= p[P_EV_BITS];
  if (extra.len) {
    memcpy(m + p[P_EXTRA], extra.buf, (size_t)extra.len);
    present |= p[P_EXTRA_BIT];
  }
  uint32_t counts[] = {(uint32_t)rows, (uint32_t)tokens, (uint32_t)events, (uint32_t)present, (uint32_t)extra.len};
  memcpy(m + p[P_WAVE], &wave, 8);
  memcpy(m + p[P_ROWS], &counts[0], 4);
  memcpy(m + p[P_TOKENS], &counts[1], 4);
  memcpy(m + p[P_EVENTS], &counts[2], 4);
  memcpy(m + p[P_PRESENT], &counts[3], 4);
  memcpy(m + p[P_EXTRA_LEN], &counts[4], 4);
  store_seq(m, p[P_SEQ], seq, 1);
  if (extra.len) store_seq(m, p[P_WRITTEN], seq, 1); /* after the slot: the agent's poll takes it */
  result = Py_True;
  Py_INCREF(result);
done:
  if (!result && !PyErr_Occurred()) {
    result = Py_None;
    Py_INCREF(result);
  }
  for (int i = 0; i < ncols_held; i++) PyBuffer_Release(&cols[i]);
  if (have_extra) PyBuffer_Release(&extra);
  if (have_plan) PyBuffer_Release(&plan_b);
  if (have_mm) PyBuffer_Release(&mm);
  Py_XDECREF(arrays);
  Py_XDECREF(evr);
  Py_XDECREF(evf);
  return result;
}

/* ---- the decision ring's columns: copied as int32 and digested ---- */

#define MAX_PAIRS 4

/* copy_i32_crc(mm, lo, hi, crc, ncrc, at0, cap0, a0, ...) -> the CRC-32 (from `crc`) of the first
 * `ncrc` arrays as stored, each a 32- or 64-bit integer array stored as int32 at `at` (at most `cap`
 * values, inside [lo, hi)); None when an array is not taken here (nothing written). */
static PyObject *copy_i32_crc(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 5 || (nargs - 5) % 3 || nargs > 5 + 3 * MAX_PAIRS) return bad("copy_i32_crc(): mm, lo, hi, crc, ncrc and (at, cap, array) triples, got %zd arguments", nargs);
  Py_ssize_t pairs = (nargs - 5) / 3;
  long long lo = PyLong_AsLongLong(args[1]), hi = PyLong_AsLongLong(args[2]), ncrc = PyLong_AsLongLong(args[4]);
  unsigned long crc = PyLong_AsUnsignedLongMask(args[3]);
  long long at[MAX_PAIRS], cap[MAX_PAIRS];
  for (Py_ssize_t i = 0; i < pairs; i++) {
    at[i] = PyLong_AsLongLong(args[5 + 3 * i]);
    cap[i] = PyLong_AsLongLong(args[6 + 3 * i]);
  }
  if (PyErr_Occurred()) return bad_argument("copy_i32_crc(): lo, hi, crc, ncrc, at and cap must be integers in range");
  Py_buffer mm, a[MAX_PAIRS];
  if (PyObject_GetBuffer(args[0], &mm, PyBUF_WRITABLE) != 0) return NULL;
  PyObject *result = NULL;
  Py_ssize_t held = 0;
  if (!inside(lo, hi - lo, 0, mm.len) || ncrc < 0 || ncrc > pairs) {
    bad("copy_i32_crc(): region %lld..%lld is not inside the mapping's %zd bytes (or ncrc %lld)", lo, hi, mm.len, ncrc);
    goto done;
  }
  for (Py_ssize_t i = 0; i < pairs; i++) {
    if (at[i] % 4 || cap[i] < 0 || cap[i] > (1LL << 40) || !inside(at[i], 4 * cap[i], lo, hi)) {
      bad("copy_i32_crc(): column %zd (%lld int32s at %lld) lies outside the slot %lld..%lld", i, cap[i], at[i], lo, hi);
      goto done;
    }
    if (!take_array(args[7 + 3 * i], &a[i])) goto done;
    held = i + 1;
    if (!convertible(&a[i], 'i', 4)) goto done; /* a float column: numpy's cast */
    if (a[i].len / a[i].itemsize > cap[i]) {
      bad("copy_i32_crc(): %zd values for a column of %lld", a[i].len / a[i].itemsize, cap[i]);
      goto done;
    }
  }
  uint32_t c = (uint32_t)crc;
  for (Py_ssize_t i = 0; i < pairs; i++) {
    Py_ssize_t n = a[i].len / a[i].itemsize;
    unsigned char *dst = (unsigned char *)mm.buf + at[i];
    store(dst, &a[i], n, 'i', 4);
    if (i < ncrc) c = crc_update(c, dst, (size_t)(4 * n));
  }
  result = PyLong_FromUnsignedLong(c);
done:
  if (!result && !PyErr_Occurred()) {
    result = Py_None;
    Py_INCREF(result);
  }
  for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&a[i]);
  PyBuffer_Release(&mm);
  return result;
}

/* crc32(data[, crc[, tables]]) -> zlib.crc32's value (the tests compare them); a true `tables`
 * takes the slice-by-8 tables even where the CPU has carry-less multiplication (both are tested). */
static PyObject *crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 3) return bad("crc32(): data[, crc[, tables]], got %zd arguments", nargs);
  unsigned long crc = nargs > 1 ? PyLong_AsUnsignedLongMask(args[1]) : 0;
  int tables = nargs > 2 ? PyObject_IsTrue(args[2]) : 0;
  if (PyErr_Occurred()) return NULL;
  Py_buffer v;
  if (PyObject_GetBuffer(args[0], &v, PyBUF_C_CONTIGUOUS) != 0) return NULL;
  uint32_t c = tables ? ~crc_raw(~(uint32_t)crc, v.buf, (size_t)v.len) : crc_update((uint32_t)crc, v.buf, (size_t)v.len);
  PyBuffer_Release(&v);
  return PyLong_FromUnsignedLong(c);
}

/* Whether crc_update takes the carry-less multiplication path on this CPU (for the bench's report). */
static PyObject *crc_kind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_clmul) return PyUnicode_FromString("pclmul");
#endif
  return PyUnicode_FromString("slice-by-8");
}

static PyMethodDef methods[] = {
  {"ring_write", (PyCFunction)(void (*)(void))ring_write, METH_FASTCALL, "The telemetry ring's slot write (ring.py TelemetryRing.write)."},
  {"copy_i32_crc", (PyCFunction)(void (*)(void))copy_i32_crc, METH_FASTCALL, "Columns copied as int32 into a decision ring slot, and their CRC-32."},
  {"crc32", (PyCFunction)(void (*)(void))crc32, METH_FASTCALL, "zlib.crc32's CRC-32 (carry-less multiplication where the CPU has it, else slice-by-8)."},
  {"crc_kind", (PyCFunction)(void (*)(void))crc_kind, METH_FASTCALL, "Which CRC-32 code this CPU runs: pclmul or slice-by-8."},
  {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wavebus_client._native", "The client's optional C fast path for the per-step ring writes.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
  crc_init();
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse2");
#endif
  PyObject *errors = PyImport_ImportModule("wavebus_client.errors");
  if (!errors) return NULL;
  config_error = PyObject_GetAttrString(errors, "ConfigError");
  Py_DECREF(errors);
  if (!config_error) return NULL;
  if (PyType_Ready(&SlotsType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (!m) return NULL;
  Py_INCREF(&SlotsType);
  if (PyModule_AddIntConstant(m, "RESEND_PER_STEP", RESEND_PER_STEP) < 0 || PyModule_AddObject(m, "Slots", (PyObject *)&SlotsType) < 0) {
    Py_DECREF(&SlotsType);
    Py_DECREF(m);
    return NULL;
  }
  PyObject *plan = PyTuple_New(P_COLS), *column = PyTuple_New(C_FIELDS);
  if (!plan || !column) goto fail;
  for (int i = 0; i < P_COLS; i++) PyTuple_SET_ITEM(plan, i, PyUnicode_FromString(plan_names[i]));
  for (int i = 0; i < C_FIELDS; i++) PyTuple_SET_ITEM(column, i, PyUnicode_FromString(column_names[i]));
  if (PyErr_Occurred() || PyModule_AddObject(m, "RING_PLAN", plan) < 0) goto fail;
  plan = NULL;
  if (PyModule_AddObject(m, "RING_PLAN_COLUMN", column) < 0) goto fail;
  return m;
fail:
  Py_XDECREF(plan);
  Py_XDECREF(column);
  Py_DECREF(m);
  return NULL;
}
