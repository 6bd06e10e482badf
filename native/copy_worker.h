// Runs one copy (a range, or a gather of blocks) from a ByteSource into a JS buffer, off the
// JS thread. The worker holds a Reference to the destination buffer, so it cannot be
// collected mid-copy, and a shared_ptr to the source, so close() cannot unmap under it.
#pragma once
#include <napi.h>

#include <memory>
#include <vector>

#include "byte_source.h"

namespace wavebus {

class CopyWorker : public Napi::AsyncWorker {
 public:
  CopyWorker(Napi::Env env, std::shared_ptr<ByteSource> source, Napi::Uint8Array dst, uint8_t* dstPtr,
             std::vector<Span> spans);
  Napi::Promise Promise() { return deferred_.Promise(); }

 protected:
  void Execute() override;
  void OnOK() override;

 private:
  std::shared_ptr<ByteSource> source_;
  Napi::Reference<Napi::Uint8Array> dstRef_;
  uint8_t* dstPtr_;
  std::vector<Span> spans_;
  Napi::Promise::Deferred deferred_;
  Status status_;
};

// JS: copyTo(dst, dstOffset, srcOffset, nbytes) -> Promise<void>
Napi::Value StartCopyTo(const Napi::CallbackInfo& info, std::shared_ptr<ByteSource> source);
// JS: gatherTo(dst, dstOffset, blockIds: Uint32Array, blockBytes, baseOffset, blockStride?) -> Promise<void>
// (block i at baseOffset + id * blockStride; blockStride defaults to blockBytes)
Napi::Value StartGatherTo(const Napi::CallbackInfo& info, std::shared_ptr<ByteSource> source);

}  // namespace wavebus
