#include "malloc_tuning.h"

#include <cstdint>

#include "coded_error.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace wavebus {
namespace {

Napi::Value JsTuneMalloc(const Napi::CallbackInfo& info) {
  uint64_t mmapThreshold = ArgU64(info, 0, "mmapThresholdBytes");
  uint64_t trimThreshold = ArgU64(info, 1, "trimThresholdBytes");
  // glibc caps M_MMAP_THRESHOLD at 32 MiB (HEAP_MAX / 2 on 64-bit); ints for mallopt
  if (mmapThreshold > (32ull << 20) || trimThreshold > (1ull << 30)) {
    ThrowCoded(info.Env(), "ERR_INVALID_ARG", "mmapThresholdBytes must be <= 32 MiB and trimThresholdBytes <= 1 GiB");
  }
#if defined(__GLIBC__)
  bool ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmapThreshold)) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, static_cast<int>(trimThreshold)) == 1 && ok;
  return Napi::Boolean::New(info.Env(), ok);
#else
  return Napi::Boolean::New(info.Env(), false);
#endif
}

}  // namespace

void RegisterMallocTuning(Napi::Env env, Napi::Object exports) {
  exports.Set("tuneMalloc", Napi::Function::New(env, JsTuneMalloc, "tuneMalloc"));
}

}  // namespace wavebus
