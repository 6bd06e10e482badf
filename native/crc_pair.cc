#include "crc_pair.h"

#include <cstring>

#include "coded_error.h"
#include "crc32c.h"
#include "crc_slice8.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace wavebus {
namespace {

// Normal (MSB-first) forms, including the implied x^32 term.
constexpr uint64_t kIeeeNormal = 0x104C11DB7ull;
constexpr uint64_t kCastagnoliNormal = 0x11EDC6F41ull;
constexpr uint32_t kIeeeReflected = 0xEDB88320u;

// Raw register update (no pre/post inversion), slicing-by-8.
uint32_t IeeeRaw(uint32_t crc, const uint8_t* p, size_t n) {
  static const Slice8Tables tb(kIeeeReflected);
  return tb.Update(crc, p, n);
}

#if defined(__x86_64__)

// x^n mod P, as the reflected 32-bit remainder shifted left by one: the form a folding constant
// takes when it is carry-less multiplied with reflected data (Intel's "Fast CRC Computation for
// Generic Polynomials Using PCLMULQDQ", reflected variant).
uint64_t FoldConstant(unsigned n, uint64_t normal) {
  uint64_t r = 1;
  for (unsigned i = 0; i < n; i++) {
    r <<= 1;
    if (r & (1ull << 32)) r ^= normal;
  }
  uint32_t rev = 0;
  for (int b = 0; b < 32; b++) rev |= static_cast<uint32_t>((r >> b) & 1u) << (31 - b);
  return static_cast<uint64_t>(rev) << 1;
}

struct FoldKeys {
  // Low 64 bits multiply the low (earlier, higher-degree) half of a 128-bit lane, high 64 bits the high half.
  uint64_t by16[2];  // fold across 2048 bits (256 bytes, the wide loop)
  uint64_t by4[2];   // fold across 512 bits (64 bytes)
  uint64_t by1[2];   // fold across 128 bits (16 bytes)
  explicit FoldKeys(uint64_t normal)
      : by16{FoldConstant(2048 + 32, normal), FoldConstant(2048 - 32, normal)},
        by4{FoldConstant(512 + 32, normal), FoldConstant(512 - 32, normal)},
        by1{FoldConstant(128 + 32, normal), FoldConstant(128 - 32, normal)} {}
};

const FoldKeys& ieeeKeys() {
  static const FoldKeys k(kIeeeNormal);
  return k;
}
const FoldKeys& castagnoliKeys() {
  static const FoldKeys k(kCastagnoliNormal);
  return k;
}

#define WB_SSE __attribute__((target("pclmul,sse4.2")))
#define WB_WIDE __attribute__((target("avx512f,avx512bw,vpclmulqdq,pclmul,sse4.2")))

WB_SSE inline __m128i Keys128(const uint64_t k[2]) {
  return _mm_set_epi64x(static_cast<long long>(k[1]), static_cast<long long>(k[0]));
}

WB_SSE inline __m128i Fold(__m128i acc, __m128i keys, __m128i data) {
  __m128i lo = _mm_clmulepi64_si128(acc, keys, 0x00);
  __m128i hi = _mm_clmulepi64_si128(acc, keys, 0x11);
  return _mm_xor_si128(_mm_xor_si128(lo, hi), data);
}

WB_SSE inline __m128i Reduce4(const __m128i a[4], __m128i by1) {
  __m128i x = Fold(a[0], by1, a[1]);
  x = Fold(x, by1, a[2]);
  return Fold(x, by1, a[3]);
}

// Folding keeps the polynomial value of the data processed so far, so the 128-bit remainder has
// the same raw CRC as the whole prefix; finish it, then the tail, with the byte-wise update.
WB_SSE inline uint32_t FinishCastagnoli(__m128i rest, const uint8_t* p, size_t n) {
  uint64_t lo = static_cast<uint64_t>(_mm_cvtsi128_si64(rest));
  uint64_t hi = static_cast<uint64_t>(_mm_extract_epi64(rest, 1));
  uint32_t cr = static_cast<uint32_t>(_mm_crc32_u64(_mm_crc32_u64(0, lo), hi));
  for (size_t i = 0; i < n; i++) cr = _mm_crc32_u8(cr, p[i]);
  return ~cr;
}

WB_SSE inline uint32_t FinishIeee(__m128i rest, const uint8_t* p, size_t n) {
  alignas(16) uint8_t b[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(b), rest);
  return ~IeeeRaw(IeeeRaw(0, b, 16), p, n);
}

// 64 bytes per step in four 128-bit lanes. Needs n >= 64. The initial register (~prev) is
// xored into the first four bytes.
template <bool kC, bool kZip>
WB_SSE void FoldPair(uint32_t* c32c, uint32_t* zip, const uint8_t* p, size_t n) {
  const FoldKeys& ck = castagnoliKeys();
  const FoldKeys& zk = ieeeKeys();
  const __m128i c4 = Keys128(ck.by4), z4 = Keys128(zk.by4);
  __m128i c[4], z[4];
  for (int i = 0; i < 4; i++) c[i] = z[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p) + i);
  if (kC) c[0] = _mm_xor_si128(c[0], _mm_cvtsi32_si128(static_cast<int>(~*c32c)));
  if (kZip) z[0] = _mm_xor_si128(z[0], _mm_cvtsi32_si128(static_cast<int>(~*zip)));
  p += 64;
  n -= 64;
  while (n >= 64) {
    const __m128i* q = reinterpret_cast<const __m128i*>(p);
    for (int i = 0; i < 4; i++) {
      __m128i d = _mm_loadu_si128(q + i);
      if (kC) c[i] = Fold(c[i], c4, d);
      if (kZip) z[i] = Fold(z[i], z4, d);
    }
    p += 64;
    n -= 64;
  }
  if (kC) *c32c = FinishCastagnoli(Reduce4(c, Keys128(ck.by1)), p, n);
  if (kZip) *zip = FinishIeee(Reduce4(z, Keys128(zk.by1)), p, n);
}

WB_WIDE inline __m512i Keys512(const uint64_t k[2]) {
  return _mm512_broadcast_i32x4(_mm_set_epi64x(static_cast<long long>(k[1]), static_cast<long long>(k[0])));
}

WB_WIDE inline __m512i FoldWide(__m512i acc, __m512i keys, __m512i data) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, keys, 0x00), _mm512_clmulepi64_epi128(acc, keys, 0x11), data, 0x96);
}

WB_WIDE inline void Lanes(__m512i v, __m128i out[4]) {
  out[0] = _mm512_extracti32x4_epi32(v, 0);
  out[1] = _mm512_extracti32x4_epi32(v, 1);
  out[2] = _mm512_extracti32x4_epi32(v, 2);
  out[3] = _mm512_extracti32x4_epi32(v, 3);
}

// The same with AVX-512 VPCLMULQDQ: four 512-bit accumulators (16 lanes), 256 bytes per step,
// folded down to one 512-bit accumulator, then its four lanes as in FoldPair. Needs n >= 256.
template <bool kC, bool kZip>
WB_WIDE void FoldPairWide(uint32_t* c32c, uint32_t* zip, const uint8_t* p, size_t n) {
  const FoldKeys& ck = castagnoliKeys();
  const FoldKeys& zk = ieeeKeys();
  const __m512i c16 = Keys512(ck.by16), c4 = Keys512(ck.by4), z16 = Keys512(zk.by16), z4 = Keys512(zk.by4);
  // Plain variables, not arrays: GCC otherwise keeps the accumulators on the stack.
  __m512i c0 = _mm512_loadu_si512(p), c1 = _mm512_loadu_si512(p + 64), c2 = _mm512_loadu_si512(p + 128),
          c3 = _mm512_loadu_si512(p + 192);
  __m512i z0 = c0, z1 = c1, z2 = c2, z3 = c3;
  if (kC) c0 = _mm512_xor_si512(c0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(~*c32c))));
  if (kZip) z0 = _mm512_xor_si512(z0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(~*zip))));
  p += 256;
  n -= 256;
  while (n >= 256) {
    __m512i d0 = _mm512_loadu_si512(p), d1 = _mm512_loadu_si512(p + 64), d2 = _mm512_loadu_si512(p + 128),
            d3 = _mm512_loadu_si512(p + 192);
    if (kC) {
      c0 = FoldWide(c0, c16, d0);
      c1 = FoldWide(c1, c16, d1);
      c2 = FoldWide(c2, c16, d2);
      c3 = FoldWide(c3, c16, d3);
    }
    if (kZip) {
      z0 = FoldWide(z0, z16, d0);
      z1 = FoldWide(z1, z16, d1);
      z2 = FoldWide(z2, z16, d2);
      z3 = FoldWide(z3, z16, d3);
    }
    p += 256;
    n -= 256;
  }
  __m512i cx = FoldWide(FoldWide(FoldWide(c0, c4, c1), c4, c2), c4, c3);
  __m512i zx = FoldWide(FoldWide(FoldWide(z0, z4, z1), z4, z2), z4, z3);
  while (n >= 64) {
    __m512i d = _mm512_loadu_si512(p);
    if (kC) cx = FoldWide(cx, c4, d);
    if (kZip) zx = FoldWide(zx, z4, d);
    p += 64;
    n -= 64;
  }
  __m128i lanes[4];
  if (kC) {
    Lanes(cx, lanes);
    *c32c = FinishCastagnoli(Reduce4(lanes, Keys128(ck.by1)), p, n);
  }
  if (kZip) {
    Lanes(zx, lanes);
    *zip = FinishIeee(Reduce4(lanes, Keys128(zk.by1)), p, n);
  }
}

bool DetectFold() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2");
}

bool DetectWide() {
  __builtin_cpu_init();
  return DetectFold() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("vpclmulqdq");
}

bool Wide() {
  static const bool w = DetectWide();
  return w;
}

template <bool kC, bool kZip>
void FoldAny(uint32_t* c32c, uint32_t* zip, const uint8_t* p, size_t n) {
  if (n >= 256 && Wide()) FoldPairWide<kC, kZip>(c32c, zip, p, n);
  else FoldPair<kC, kZip>(c32c, zip, p, n);
}

#endif

// Below this the setup and the 16-byte finish cost more than they save.
constexpr size_t kFoldMin = 256;

Napi::Value JsCrc32(const Napi::CallbackInfo& info) {
  Napi::Uint8Array data = ArgBytes(info, 0, "data");
  uint64_t prev = info.Length() > 1 && !info[1].IsUndefined() ? ArgU64(info, 1, "prev") : 0;
  if (prev > 0xFFFFFFFFull) ThrowCoded(info.Env(), "ERR_INVALID_ARG", "prev must be a 32-bit unsigned integer");
  return Napi::Number::New(info.Env(), Crc32(static_cast<uint32_t>(prev), data.Data(), data.ByteLength()));
}

Napi::Value JsCrc32Software(const Napi::CallbackInfo& info) {
  Napi::Uint8Array data = ArgBytes(info, 0, "data");
  uint64_t prev = info.Length() > 1 && !info[1].IsUndefined() ? ArgU64(info, 1, "prev") : 0;
  if (prev > 0xFFFFFFFFull) ThrowCoded(info.Env(), "ERR_INVALID_ARG", "prev must be a 32-bit unsigned integer");
  return Napi::Number::New(info.Env(), ~IeeeRaw(~static_cast<uint32_t>(prev), data.Data(), data.ByteLength()));
}

Napi::Value JsCrcPair(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint8Array data = ArgBytes(info, 0, "data");
  uint64_t a = ArgU64(info, 1, "prevCrc32c");
  uint64_t b = ArgU64(info, 2, "prevZip");
  if (a > 0xFFFFFFFFull || b > 0xFFFFFFFFull) ThrowCoded(env, "ERR_INVALID_ARG", "previous CRCs must be 32-bit unsigned integers");
  uint32_t c = static_cast<uint32_t>(a), z = static_cast<uint32_t>(b);
  CrcPair(&c, &z, data.Data(), data.ByteLength());
  Napi::Array out = Napi::Array::New(env, 2);
  out.Set(0u, Napi::Number::New(env, c));
  out.Set(1u, Napi::Number::New(env, z));
  return out;
}

Napi::Value JsFoldHardware(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), CrcFoldHardware()); }

}  // namespace

bool CrcFoldHardware() {
#if defined(__x86_64__)
  static const bool hw = DetectFold();
  return hw;
#else
  return false;
#endif
}

void CrcPair(uint32_t* crc32c, uint32_t* zip, const uint8_t* data, size_t len) {
#if defined(__x86_64__)
  if (len >= kFoldMin && CrcFoldHardware()) {
    if (zip) FoldAny<true, true>(crc32c, zip, data, len);
    else FoldAny<true, false>(crc32c, nullptr, data, len);
    return;
  }
#endif
  *crc32c = Crc32c(*crc32c, data, len);
  if (zip) *zip = ~IeeeRaw(~*zip, data, len);
}

uint32_t Crc32(uint32_t prev, const uint8_t* data, size_t len) {
#if defined(__x86_64__)
  if (len >= kFoldMin && CrcFoldHardware()) {
    uint32_t z = prev;
    FoldAny<false, true>(nullptr, &z, data, len);
    return z;
  }
#endif
  return ~IeeeRaw(~prev, data, len);
}

void RegisterCrcPair(Napi::Env env, Napi::Object exports) {
  exports.Set("crc32", Napi::Function::New(env, JsCrc32, "crc32"));
  exports.Set("crc32Software", Napi::Function::New(env, JsCrc32Software, "crc32Software"));
  exports.Set("crcPair", Napi::Function::New(env, JsCrcPair, "crcPair"));
  exports.Set("crcFoldHardware", Napi::Function::New(env, JsFoldHardware, "crcFoldHardware"));
}

}  // namespace wavebus
