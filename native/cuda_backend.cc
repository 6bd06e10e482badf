#include "cuda_backend.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

namespace wavebus {

namespace {

struct Loaded {
  CudaApi api{};
  const CudaApi* ok = nullptr;
  std::string reason;
};

template <typename F>
bool Resolve(void* lib, const char* sym, F* out, std::string* missing) {
  void* p = dlsym(lib, sym);
  if (p == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += sym;
    return false;
  }
  *out = reinterpret_cast<F>(p);
  return true;
}

void LoadOnce(Loaded* l) {
  std::vector<std::string> candidates;
  const char* forced = std::getenv("WAVEBUS_CUDART");
  if (forced != nullptr && forced[0] != '\0') {
    candidates.push_back(forced);
  } else {
    candidates = {"libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so"};
  }
  void* lib = nullptr;
  std::string errors;
  for (const std::string& c : candidates) {
    lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* e = dlerror();
    if (!errors.empty()) errors += "; ";
    errors += e != nullptr ? e : c + ": dlopen failed";
  }
  if (lib == nullptr) {
    l->reason = errors;
    return;
  }
  CudaApi& a = l->api;
  std::string missing;
  bool all = true;
  all &= Resolve(lib, "cudaIpcOpenMemHandle", &a.ipcOpenMemHandle, &missing);
  all &= Resolve(lib, "cudaIpcCloseMemHandle", &a.ipcCloseMemHandle, &missing);
  all &= Resolve(lib, "cudaSetDevice", &a.setDevice, &missing);
  all &= Resolve(lib, "cudaStreamCreateWithFlags", &a.streamCreateWithFlags, &missing);
  all &= Resolve(lib, "cudaStreamDestroy", &a.streamDestroy, &missing);
  all &= Resolve(lib, "cudaMemcpyAsync", &a.memcpyAsync, &missing);
  all &= Resolve(lib, "cudaStreamSynchronize", &a.streamSynchronize, &missing);
  all &= Resolve(lib, "cudaHostAlloc", &a.hostAlloc, &missing);
  all &= Resolve(lib, "cudaFreeHost", &a.freeHost, &missing);
  all &= Resolve(lib, "cudaGetErrorString", &a.getErrorString, &missing);
  all &= Resolve(lib, "cudaGetDeviceCount", &a.getDeviceCount, &missing);
  if (!all) {
    l->reason = "libcudart lacks " + missing;
    dlclose(lib);
    return;
  }
  int count = 0;
  CudaApi::Err err = a.getDeviceCount(&count);
  if (err != 0) {
    l->reason = a.ErrorText("cudaGetDeviceCount", err);
    return;  // keep the library loaded: the runtime does not like being unloaded after init
  }
  if (count <= 0) {
    l->reason = "no CUDA devices";
    return;
  }
  l->reason = "libcudart loaded; " + std::to_string(count) + " device(s)";
  l->ok = &l->api;
}

Loaded& Instance() {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] { LoadOnce(&loaded); });
  return loaded;
}

Napi::Value JsCudaAvailable(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string reason;
  const CudaApi* api = CudaLoad(&reason);
  Napi::Object o = Napi::Object::New(env);
  o.Set("available", Napi::Boolean::New(env, api != nullptr));
  o.Set("reason", Napi::String::New(env, reason));
  return o;
}

}  // namespace

std::string CudaApi::ErrorText(const std::string& what, Err err) const {
  const char* s = getErrorString != nullptr ? getErrorString(err) : nullptr;
  return what + ": " + (s != nullptr ? s : "unknown CUDA error") + " (code " + std::to_string(err) + ")";
}

const CudaApi* CudaLoad(std::string* reason) {
  Loaded& l = Instance();
  if (reason != nullptr) *reason = l.reason;
  return l.ok;
}

void RegisterCudaBackend(Napi::Env env, Napi::Object exports) {
  exports.Set("cudaAvailable", Napi::Function::New(env, JsCudaAvailable, "cudaAvailable"));
}

}  // namespace wavebus
