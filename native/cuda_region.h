// CudaRegion: device memory another process exported with cudaIpcGetMemHandle, opened here
// with cudaIpcOpenMemHandle. Copies run on the region's own non-blocking stream: device ->
// a bounded pinned staging chunk -> the caller's buffer, or straight into the caller's buffer
// when it is pinned memory from allocHost().
#pragma once
#include <napi.h>

#include <memory>
#include <mutex>

#include "byte_source.h"
#include "cuda_backend.h"

namespace wavebus {

class CudaSource : public ByteSource {
 public:
  CudaSource(const CudaApi* api, int device, uint8_t* base, uint64_t limit, void* stream, uint64_t stagingBytes);
  ~CudaSource() override;
  uint64_t Size() const override { return limit_; }
  std::string Describe() const override { return "CUDA IPC region on device " + std::to_string(device_); }
  Status Read(const std::vector<Span>& spans, uint8_t* dst) override;
  int device() const { return device_; }

 private:
  Status Settle(Status failure);
  Status Drain(uint8_t* staged, std::vector<std::pair<uint8_t*, uint64_t>>* pending, uint64_t* used);

  const CudaApi* api_;
  int device_;
  uint8_t* base_;
  uint64_t limit_;
  void* stream_;
  uint64_t stagingBytes_;
  uint8_t* staging_ = nullptr;  // pinned, allocated on first unpinned copy
  std::mutex mu_;               // one copy at a time per region: they share stream and staging
};

class CudaRegion : public Napi::ObjectWrap<CudaRegion> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit CudaRegion(const Napi::CallbackInfo& info);

 private:
  static Napi::Value Open(const Napi::CallbackInfo& info);
  Napi::Value GetDevice(const Napi::CallbackInfo& info);
  Napi::Value GetClosed(const Napi::CallbackInfo& info);
  Napi::Value CopyTo(const Napi::CallbackInfo& info);
  Napi::Value GatherTo(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);
  const std::shared_ptr<CudaSource>& Live(Napi::Env env);

  std::shared_ptr<CudaSource> source_;
  int device_ = 0;
};

}  // namespace wavebus
