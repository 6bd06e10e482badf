/* wavebus_client._native's CRC-32 (included by _native.c, one compilation unit): zlib.crc32's
 * polynomial (reflected 0xEDB88320), folded with PCLMULQDQ on x86-64 CPUs that have it, else
 * slice-by-8 tables; test/python-native.test.ts compares both with zlib at every length 0..9000. */
#ifndef WAVEBUS_NATIVE_CRC_H
#define WAVEBUS_NATIVE_CRC_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t crc_table[8][256];

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    crc_table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

/* The CRC register over n bytes, without the pre- and post-inversion (zlib's ~crc around it). */
static uint32_t crc_raw(uint32_t crc, const unsigned char *p, size_t n) {
  while (n && ((uintptr_t)p & 7)) {
    crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    n--;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    uint32_t lo = (uint32_t)w ^ crc, hi = (uint32_t)(w >> 32);
    crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
          crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^ crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
static int have_clmul;

/* x folded 128 bits further on (its two halves carry-less multiplied by x^(128+-32) mod P, reflected). */
__attribute__((target("pclmul,sse2"))) static inline __m128i fold(__m128i x, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

/* The register over n >= 64 bytes by carry-less multiplication (folding four 16-byte lanes, then
 * one): the folded 16 bytes hold the same remainder as everything before them, so the tables finish
 * from them with the register cleared. The folding constants are the reflected CRC-32 ones the
 * Linux kernel and zlib-ng use; the test compares every length 0..9000 with zlib. */
__attribute__((target("pclmul,sse2"))) static uint32_t crc_clmul(uint32_t crc, const unsigned char *p, size_t n) {
  const __m128i k4 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL), k1 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
  __m128i x0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)crc));
  __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16)), x2 = _mm_loadu_si128((const __m128i *)(p + 32)), x3 = _mm_loadu_si128((const __m128i *)(p + 48));
  p += 64;
  n -= 64;
  while (n >= 64) {
    x0 = _mm_xor_si128(fold(x0, k4), _mm_loadu_si128((const __m128i *)p));
    x1 = _mm_xor_si128(fold(x1, k4), _mm_loadu_si128((const __m128i *)(p + 16)));
    x2 = _mm_xor_si128(fold(x2, k4), _mm_loadu_si128((const __m128i *)(p + 32)));
    x3 = _mm_xor_si128(fold(x3, k4), _mm_loadu_si128((const __m128i *)(p + 48)));
    p += 64;
    n -= 64;
  }
  __m128i x = _mm_xor_si128(fold(x0, k1), x1);
  x = _mm_xor_si128(fold(x, k1), x2);
  x = _mm_xor_si128(fold(x, k1), x3);
  while (n >= 16) {
    x = _mm_xor_si128(fold(x, k1), _mm_loadu_si128((const __m128i *)p));
    p += 16;
    n -= 16;
  }
  unsigned char b[16];
  _mm_storeu_si128((__m128i *)b, x);
  return crc_raw(crc_raw(0, b, 16), p, n);
}
#endif

static uint32_t crc_update(uint32_t crc, const unsigned char *p, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_clmul && n >= 64) return ~crc_clmul(~crc, p, n);
#endif
  return ~crc_raw(~crc, p, n);
}

#endif
