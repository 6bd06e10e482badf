#include "cuda_region.h"

#include <cstring>
#include <utility>

#include "addon_data.h"
#include "copy_worker.h"
#include "host_memory.h"

namespace wavebus {

CudaSource::CudaSource(const CudaApi* api, int device, uint8_t* base, uint64_t limit, void* stream,
                       uint64_t stagingBytes)
    : api_(api), device_(device), base_(base), limit_(limit), stream_(stream), stagingBytes_(stagingBytes) {}

CudaSource::~CudaSource() {
  api_->setDevice(device_);
  api_->streamSynchronize(stream_);
  api_->streamDestroy(stream_);
  if (staging_ != nullptr) {
    UnregisterPinned(staging_);
    api_->freeHost(staging_);
  }
  api_->ipcCloseMemHandle(base_);
}

// A copy that fails part way has earlier copies still queued on the stream, writing into the
// caller's buffer (or the staging chunk): wait for them before the caller may reuse or free it.
Status CudaSource::Settle(Status failure) {
  api_->streamSynchronize(stream_);  // its own error, if any, is the same failure's echo
  return failure;
}

// Wait for the queued device->staging copies, then move each staged piece to its destination.
Status CudaSource::Drain(uint8_t* staged, std::vector<std::pair<uint8_t*, uint64_t>>* pending, uint64_t* used) {
  CudaApi::Err err = api_->streamSynchronize(stream_);
  if (err != 0) return Status::Fail("ERR_SHORT_COPY", api_->ErrorText("cudaStreamSynchronize", err));
  uint64_t off = 0;
  for (auto& p : *pending) {
    std::memcpy(p.first, staged + off, p.second);
    off += p.second;
  }
  pending->clear();
  *used = 0;
  return Status::Ok();
}

Status CudaSource::Read(const std::vector<Span>& spans, uint8_t* dst) {
  std::lock_guard<std::mutex> lock(mu_);
  // The current device is per host thread, and libuv may run us on any pool thread.
  CudaApi::Err err = api_->setDevice(device_);
  if (err != 0) return Status::Fail("ERR_CUDA", api_->ErrorText("cudaSetDevice(" + std::to_string(device_) + ")", err));
  uint64_t total = 0;
  for (const Span& s : spans) total += s.len;
  if (total == 0) return Status::Ok();

  if (IsPinned(dst, total)) {  // DMA straight into the caller's pinned buffer
    uint8_t* out = dst;
    for (const Span& s : spans) {
      err = api_->memcpyAsync(out, base_ + s.src, s.len, CudaApi::kMemcpyDeviceToHost, stream_);
      if (err != 0) return Settle(Status::Fail("ERR_SHORT_COPY", api_->ErrorText("cudaMemcpyAsync", err)));
      out += s.len;
    }
    err = api_->streamSynchronize(stream_);
    if (err != 0) return Status::Fail("ERR_SHORT_COPY", api_->ErrorText("cudaStreamSynchronize", err));
    return Status::Ok();
  }

  if (staging_ == nullptr) {
    void* p = nullptr;
    err = api_->hostAlloc(&p, stagingBytes_, 0);
    if (err != 0) return Status::Fail("ERR_HOST_ALLOC", api_->ErrorText("cudaHostAlloc(staging)", err));
    staging_ = static_cast<uint8_t*>(p);
    RegisterPinned(staging_, stagingBytes_);
  }
  // Pack pieces into the staging chunk; when it is full, sync and copy out, then reuse it.
  std::vector<std::pair<uint8_t*, uint64_t>> pending;
  uint64_t used = 0;
  uint8_t* out = dst;
  for (const Span& s : spans) {
    uint64_t done = 0;
    while (done < s.len) {
      if (used == stagingBytes_) {
        Status st = Drain(staging_, &pending, &used);
        if (!st.ok()) return st;
      }
      uint64_t n = std::min(s.len - done, stagingBytes_ - used);
      err = api_->memcpyAsync(staging_ + used, base_ + s.src + done, n, CudaApi::kMemcpyDeviceToHost, stream_);
      if (err != 0) return Settle(Status::Fail("ERR_SHORT_COPY", api_->ErrorText("cudaMemcpyAsync", err)));
      pending.emplace_back(out, n);
      used += n;
      out += n;
      done += n;
    }
  }
  return Drain(staging_, &pending, &used);
}

Napi::Function CudaRegion::Define(Napi::Env env) {
  return DefineClass(env, "CudaRegion",
                     {
                         StaticMethod<&CudaRegion::Open>("open"),
                         InstanceAccessor<&CudaRegion::GetDevice>("device"),
                         InstanceAccessor<&CudaRegion::GetClosed>("closed"),
                         InstanceMethod<&CudaRegion::CopyTo>("copyTo"),
                         InstanceMethod<&CudaRegion::GatherTo>("gatherTo"),
                         InstanceMethod<&CudaRegion::Close>("close"),
                     });
}

CudaRegion::CudaRegion(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CudaRegion>(info) {
  if (info.Length() != 1 || !info[0].IsExternal()) {
    ThrowCoded(info.Env(), "ERR_INVALID_ARG", "use CudaRegion.open()");
  }
  source_ = *info[0].As<Napi::External<std::shared_ptr<CudaSource>>>().Data();
  device_ = source_->device();
}

// JS: CudaRegion.open(handle: 64 bytes, device, limitBytes, stagingBytes)
Napi::Value CudaRegion::Open(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint8Array handleBytes = ArgBytes(info, 0, "handle");
  if (handleBytes.ByteLength() != sizeof(CudaIpcMemHandle)) {
    ThrowCoded(env, "ERR_INVALID_ARG", "handle must be exactly 64 bytes, got " + std::to_string(handleBytes.ByteLength()));
  }
  uint64_t device = ArgU64(info, 1, "device");
  uint64_t limit = ArgU64(info, 2, "limitBytes");
  uint64_t staging = ArgU64(info, 3, "stagingBytes");
  if (device > 1024) ThrowCoded(env, "ERR_INVALID_ARG", "device out of range: " + std::to_string(device));
  if (staging == 0) ThrowCoded(env, "ERR_INVALID_ARG", "stagingBytes must be positive");
  std::string reason;
  const CudaApi* api = CudaLoad(&reason);
  if (api == nullptr) ThrowCoded(env, "ERR_CUDA_UNAVAILABLE", "CUDA backend unavailable: " + reason);

  CudaIpcMemHandle handle;
  std::memcpy(handle.reserved, handleBytes.Data(), sizeof handle.reserved);
  int dev = static_cast<int>(device);
  CudaApi::Err err = api->setDevice(dev);
  if (err != 0) ThrowCoded(env, "ERR_CUDA", api->ErrorText("cudaSetDevice(" + std::to_string(dev) + ")", err));
  void* base = nullptr;
  err = api->ipcOpenMemHandle(&base, handle, CudaApi::kIpcMemLazyEnablePeerAccess);
  if (err != 0) ThrowCoded(env, "ERR_CUDA_IPC", api->ErrorText("cudaIpcOpenMemHandle", err));
  void* stream = nullptr;
  err = api->streamCreateWithFlags(&stream, CudaApi::kStreamNonBlocking);
  if (err != 0) {
    api->ipcCloseMemHandle(base);
    ThrowCoded(env, "ERR_CUDA", api->ErrorText("cudaStreamCreateWithFlags", err));
  }
  auto source = std::make_shared<CudaSource>(api, dev, static_cast<uint8_t*>(base), limit, stream, staging);
  auto ext = Napi::External<std::shared_ptr<CudaSource>>::New(env, &source);
  return GetAddonData(env)->cudaRegion.New({ext});
}

const std::shared_ptr<CudaSource>& CudaRegion::Live(Napi::Env env) {
  if (!source_) ThrowCoded(env, "ERR_CLOSED", "CUDA region on device " + std::to_string(device_) + " is closed");
  return source_;
}

Napi::Value CudaRegion::GetDevice(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), device_); }
Napi::Value CudaRegion::GetClosed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), !source_); }
Napi::Value CudaRegion::CopyTo(const Napi::CallbackInfo& info) { return StartCopyTo(info, Live(info.Env())); }
Napi::Value CudaRegion::GatherTo(const Napi::CallbackInfo& info) { return StartGatherTo(info, Live(info.Env())); }

Napi::Value CudaRegion::Close(const Napi::CallbackInfo& info) {
  source_.reset();  // the IPC mapping closes when the last copy in flight lets go
  return info.Env().Undefined();
}

}  // namespace wavebus
