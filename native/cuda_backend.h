// The CUDA runtime, loaded with dlopen on first use so that nothing needs CUDA to build or run.
// Only the handful of entry points wavebus uses are declared here, with their C ABI types.
#pragma once
#include <napi.h>

#include <cstddef>
#include <string>

namespace wavebus {

struct CudaIpcMemHandle {
  char reserved[64];  // cudaIpcMemHandle_t
};

struct CudaApi {
  using Err = int;  // cudaError_t; 0 is cudaSuccess
  Err (*ipcOpenMemHandle)(void** devPtr, CudaIpcMemHandle handle, unsigned int flags);
  Err (*ipcCloseMemHandle)(void* devPtr);
  Err (*setDevice)(int device);
  Err (*streamCreateWithFlags)(void** stream, unsigned int flags);
  Err (*streamDestroy)(void* stream);
  Err (*memcpyAsync)(void* dst, const void* src, size_t count, int kind, void* stream);
  Err (*streamSynchronize)(void* stream);
  Err (*hostAlloc)(void** ptr, size_t size, unsigned int flags);
  Err (*freeHost)(void* ptr);
  const char* (*getErrorString)(Err err);
  Err (*getDeviceCount)(int* count);

  static constexpr unsigned kStreamNonBlocking = 0x01;
  static constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x01;
  static constexpr int kMemcpyDeviceToHost = 2;

  // "what: <cudaGetErrorString> (code N)"
  std::string ErrorText(const std::string& what, Err err) const;
};

// The loaded runtime, or nullptr with *reason set ("libcudart.so.12: cannot open shared object
// file: ..."). Thread-safe; tried once per process. WAVEBUS_CUDART names the library to use instead.
const CudaApi* CudaLoad(std::string* reason);

// JS: cudaAvailable(): { available, reason }
void RegisterCudaBackend(Napi::Env env, Napi::Object exports);

}  // namespace wavebus
