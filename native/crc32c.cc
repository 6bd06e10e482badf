#include "crc32c.h"

#include <cstring>

#include "coded_error.h"
#include "crc_slice8.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace wavebus {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

uint32_t Software(uint32_t crc, const uint8_t* p, size_t n) {
  static const Slice8Tables tb(kPoly);
  return tb.Update(crc, p, n);
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
