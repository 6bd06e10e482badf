#include "crc32c.h"

#include <cstring>

#include "coded_error.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace wavebus {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
      for (int s = 1; s < 8; s++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};

const Tables& tables() {
  static const Tables tb;
  return tb;
}

uint32_t Software(uint32_t crc, const uint8_t* p, size_t n) {
  const Tables& tb = tables();
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;  // little-endian hosts only (x86-64, aarch64)
    crc = tb.t[7][lo & 0xFF] ^ tb.t[6][(lo >> 8) & 0xFF] ^ tb.t[5][(lo >> 16) & 0xFF] ^ tb.t[4][lo >> 24] ^
          tb.t[3][hi & 0xFF] ^ tb.t[2][(hi >> 8) & 0xFF] ^ tb.t[1][(hi >> 16) & 0xFF] ^ tb.t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ tb.t[0][(crc ^ *p++) & 0xFF];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Hardware(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
#endif

bool DetectHardware() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

Napi::Value JsCrc32c(const Napi::CallbackInfo& info) {
  Napi::Uint8Array data = ArgBytes(info, 0, "data");
  uint64_t prev = info.Length() > 1 && !info[1].IsUndefined() ? ArgU64(info, 1, "prev") : 0;
  if (prev > 0xFFFFFFFFull) ThrowCoded(info.Env(), "ERR_INVALID_ARG", "prev must be a 32-bit unsigned integer");
  uint32_t crc = Crc32c(static_cast<uint32_t>(prev), data.Data(), data.ByteLength());
  return Napi::Number::New(info.Env(), crc);
}

Napi::Value JsHardware(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), Crc32cHardware()); }

}  // namespace

bool Crc32cHardware() {
  static const bool hw = DetectHardware();
  return hw;
}

uint32_t Crc32c(uint32_t prev, const uint8_t* data, size_t len) {
  uint32_t crc = ~prev;
#if defined(__x86_64__)
  if (Crc32cHardware()) return ~Hardware(crc, data, len);
#endif
  return ~Software(crc, data, len);
}

// Exposed for tests: the table path must agree with the hardware path.
static Napi::Value JsSoftware(const Napi::CallbackInfo& info) {
  Napi::Uint8Array data = ArgBytes(info, 0, "data");
  uint64_t prev = info.Length() > 1 && !info[1].IsUndefined() ? ArgU64(info, 1, "prev") : 0;
  if (prev > 0xFFFFFFFFull) ThrowCoded(info.Env(), "ERR_INVALID_ARG", "prev must be a 32-bit unsigned integer");
  return Napi::Number::New(info.Env(), ~Software(~static_cast<uint32_t>(prev), data.Data(), data.ByteLength()));
}

void RegisterCrc32c(Napi::Env env, Napi::Object exports) {
  exports.Set("crc32c", Napi::Function::New(env, JsCrc32c, "crc32c"));
  exports.Set("crc32cSoftware", Napi::Function::New(env, JsSoftware, "crc32cSoftware"));
  exports.Set("crc32cHardware", Napi::Function::New(env, JsHardware, "crc32cHardware"));
}

}  // namespace wavebus
