#include "host_memory.h"

#include <map>
#include <mutex>
#include <string>

#include "coded_error.h"
#include "cuda_backend.h"

namespace wavebus {

namespace {

std::mutex& RegistryMutex() {
  static std::mutex m;
  return m;
}

std::map<uintptr_t, size_t>& Registry() {
  static std::map<uintptr_t, size_t> r;
  return r;
}

Napi::Value JsAllocHost(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint64_t nbytes = ArgU64(info, 0, "nbytes");
  bool wantPinned = ArgBool(info, 1, "pinned", false);
  if (nbytes == 0) ThrowCoded(env, "ERR_INVALID_ARG", "nbytes must be positive");
  Napi::Object out = Napi::Object::New(env);
  const CudaApi* api = wantPinned ? CudaLoad(nullptr) : nullptr;
  if (api != nullptr) {
    void* p = nullptr;
    CudaApi::Err err = api->hostAlloc(&p, nbytes, 0);
    if (err != 0) ThrowCoded(env, "ERR_HOST_ALLOC", api->ErrorText("cudaHostAlloc(" + std::to_string(nbytes) + ")", err));
    RegisterPinned(static_cast<uint8_t*>(p), nbytes);
    Napi::Buffer<uint8_t> buf = Napi::Buffer<uint8_t>::New(
        env, static_cast<uint8_t*>(p), nbytes,
        [](Napi::Env, uint8_t* data, const CudaApi* a) {
          UnregisterPinned(data);
          a->freeHost(data);
        },
        api);
    out.Set("buffer", buf);
    out.Set("pinned", Napi::Boolean::New(env, true));
    return out;
  }
  out.Set("buffer", Napi::Buffer<uint8_t>::New(env, nbytes));
  out.Set("pinned", Napi::Boolean::New(env, false));
  return out;
}

}  // namespace

bool IsPinned(const uint8_t* ptr, size_t len) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto& r = Registry();
  auto it = r.upper_bound(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.begin()) return false;
  --it;
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  return p >= it->first && p - it->first <= it->second && len <= it->second - (p - it->first);
}

void RegisterPinned(const uint8_t* ptr, size_t len) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[reinterpret_cast<uintptr_t>(ptr)] = len;
}

void UnregisterPinned(const uint8_t* ptr) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry().erase(reinterpret_cast<uintptr_t>(ptr));
}

void RegisterHostMemory(Napi::Env env, Napi::Object exports) {
  exports.Set("allocHost", Napi::Function::New(env, JsAllocHost, "allocHost"));
}

}  // namespace wavebus
