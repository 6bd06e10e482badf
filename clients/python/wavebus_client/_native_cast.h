/* wavebus_client._native's arrays (included by _native.c, one compilation unit): which buffers it
 * takes, and their values stored into a column exactly as numpy's unsafe cast stores them. */
#ifndef WAVEBUS_NATIVE_CAST_H
#define WAVEBUS_NATIVE_CAST_H

/* An array's element kind ('i', 'u', 'f') from its buffer format, or 0 for one not taken here
 * (big-endian, bool, half, structured, several items). */
static char kind_of(const Py_buffer *v) {
  const char *f = v->format ? v->format : "B";
  if (*f == '@' || *f == '=' || *f == '<') f++;
  if (!f[0] || f[1]) return 0;
  switch (f[0]) {
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': return 'i';
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': return 'u';
    case 'f': case 'd': return 'f';
    default: return 0;
  }
}

/* A C-contiguous buffer of `obj`, or 0 (the error cleared: the caller's numpy path takes it). */
static int take_array(PyObject *obj, Py_buffer *v) {
  if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
    if (v->itemsize > 0 && kind_of(v)) return 1;
    PyBuffer_Release(v);
    return 0;
  }
  PyErr_Clear();
  return 0;
}

/* Whether a column of (kind, size) takes `v` here with numpy's own result. */
static int convertible(const Py_buffer *v, int kind, int size) {
  char k = kind_of(v);
  Py_ssize_t s = v->itemsize;
  if (kind == 'f') return k == 'f' && size == 4 && (s == 4 || s == 8);
  if (kind == 'i' || kind == 'u') return (k == 'i' || k == 'u') && (s == 1 || s == 2 || s == 4 || s == 8) && (size == 1 || size == 2 || size == 4);
  return 0;
}

/* n values of `v` into `dst` as (kind, size): memcpy when the bytes are the same, else numpy's cast.
 * Its loops vectorized whatever -O the build gives (numpy's own casts are SIMD; -O2's cheap cost
 * model leaves these scalar, slower than numpy's at 4096 rows). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static void store(unsigned char *dst, const Py_buffer *v, Py_ssize_t n, int kind, int size) {
  const char k = kind_of(v);
  const Py_ssize_t s = v->itemsize;
  const void *src = v->buf;
  if (s == size && (k == kind || (k != 'f' && kind != 'f'))) {
    memcpy(dst, src, (size_t)(n * size));
    return;
  }
  if (kind == 'f') { /* float64 -> float32 */
    const double *d = src;
    float *o = (float *)dst;
    for (Py_ssize_t i = 0; i < n; i++) o[i] = (float)d[i];
    return;
  }
  /* sign- or zero-extended, then truncated to the column's width: one loop per pair of widths, so
   * the compiler vectorizes each */
#define CAST_LOOP(SRC_T, DST_T) \
  do { \
    const SRC_T *in = src; \
    DST_T *o = (DST_T *)dst; \
    for (Py_ssize_t i = 0; i < n; i++) o[i] = (DST_T)in[i]; \
  } while (0)
#define CAST_TO(DST_T) \
  do { \
    if (s == 8) CAST_LOOP(uint64_t, DST_T); \
    else if (s == 4) { if (k == 'i') CAST_LOOP(int32_t, DST_T); else CAST_LOOP(uint32_t, DST_T); } \
    else if (s == 2) { if (k == 'i') CAST_LOOP(int16_t, DST_T); else CAST_LOOP(uint16_t, DST_T); } \
    else { if (k == 'i') CAST_LOOP(int8_t, DST_T); else CAST_LOOP(uint8_t, DST_T); } \
  } while (0)
  if (size == 4) CAST_TO(uint32_t);
  else if (size == 2) CAST_TO(uint16_t);
  else CAST_TO(uint8_t);
#undef CAST_TO
#undef CAST_LOOP
}

#endif
