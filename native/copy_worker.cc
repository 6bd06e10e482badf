#include "copy_worker.h"

#include <string>

namespace wavebus {

CopyWorker::CopyWorker(Napi::Env env, std::shared_ptr<ByteSource> source, Napi::Uint8Array dst, uint8_t* dstPtr,
                       std::vector<Span> spans)
    : Napi::AsyncWorker(env, "wavebus:copy"),
      source_(std::move(source)),
      dstRef_(Napi::Persistent(dst)),
      dstPtr_(dstPtr),
      spans_(std::move(spans)),
      deferred_(Napi::Promise::Deferred::New(env)) {}

void CopyWorker::Execute() { status_ = source_->Read(spans_, dstPtr_); }

void CopyWorker::OnOK() {
  Napi::Env env = Env();
  dstRef_.Reset();
  source_.reset();
  if (status_.ok()) {
    deferred_.Resolve(env.Undefined());
  } else {
    deferred_.Reject(CodedError(env, status_.code, status_.message).Value());
  }
}

namespace {

// Checks that dst can take `total` bytes at dstOffset and that every span fits the source,
// then queues the worker. Overflow-safe: all quantities are < 2^53 and compared by subtraction.
Napi::Value Queue(const Napi::CallbackInfo& info, std::shared_ptr<ByteSource> source, Napi::Uint8Array dst,
                  uint64_t dstOffset, std::vector<Span> spans) {
  Napi::Env env = info.Env();
  uint64_t total = 0;
  for (const Span& s : spans) {
    if (s.len > source->Size() || s.src > source->Size() - s.len) {
      ThrowCoded(env, "ERR_OUT_OF_RANGE",
                 "copy of " + std::to_string(s.len) + " bytes at source offset " + std::to_string(s.src) +
                     " is outside " + source->Describe() + " (" + std::to_string(source->Size()) + " bytes)");
    }
    total += s.len;
  }
  uint64_t cap = dst.ByteLength();
  if (dstOffset > cap || total > cap - dstOffset) {
    ThrowCoded(env, "ERR_OUT_OF_RANGE",
               "destination holds " + std::to_string(cap) + " bytes; copy needs " + std::to_string(total) +
                   " at offset " + std::to_string(dstOffset));
  }
  auto* worker = new CopyWorker(env, std::move(source), dst, dst.Data() + dstOffset, std::move(spans));
  Napi::Promise p = worker->Promise();
  worker->Queue();
  return p;
}

}  // namespace

Napi::Value StartCopyTo(const Napi::CallbackInfo& info, std::shared_ptr<ByteSource> source) {
  Napi::Uint8Array dst = ArgBytes(info, 0, "dst");
  uint64_t dstOffset = ArgU64(info, 1, "dstOffset");
  uint64_t srcOffset = ArgU64(info, 2, "srcOffset");
  uint64_t nbytes = ArgU64(info, 3, "nbytes");
  std::vector<Span> spans;
  if (nbytes > 0) spans.push_back(Span{srcOffset, nbytes});
  return Queue(info, std::move(source), dst, dstOffset, std::move(spans));
}

Napi::Value StartGatherTo(const Napi::CallbackInfo& info, std::shared_ptr<ByteSource> source) {
  Napi::Env env = info.Env();
  Napi::Uint8Array dst = ArgBytes(info, 0, "dst");
  uint64_t dstOffset = ArgU64(info, 1, "dstOffset");
  if (info.Length() <= 2 || !info[2].IsTypedArray() ||
      info[2].As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array) {
    ThrowCoded(env, "ERR_INVALID_ARG", "blockIds must be a Uint32Array");
  }
  Napi::Uint32Array ids = info[2].As<Napi::Uint32Array>();
  uint64_t blockBytes = ArgU64(info, 3, "blockBytes");
  uint64_t baseOffset = ArgU64(info, 4, "baseOffset");
  // Optional: bytes from one block's start to the next's (an interleaved pool); default back to back.
  uint64_t stride = info.Length() > 5 && !info[5].IsUndefined() ? ArgU64(info, 5, "blockStride") : blockBytes;
  if (stride < blockBytes) {
    ThrowCoded(env, "ERR_INVALID_ARG", "blockStride (" + std::to_string(stride) + ") is below blockBytes (" + std::to_string(blockBytes) + ")");
  }
  std::vector<Span> spans;
  spans.reserve(ids.ElementLength());
  const uint64_t limit = 9007199254740991ull;
  for (size_t i = 0; i < ids.ElementLength(); i++) {
    uint64_t id = ids[i];
    // Keep id * blockBytes + baseOffset from wrapping; Queue() then checks it against the source.
    if (stride != 0 && id > (limit - baseOffset) / stride) {
      ThrowCoded(env, "ERR_OUT_OF_RANGE", "blockIds[" + std::to_string(i) + "] = " + std::to_string(id) + " overflows");
    }
    if (blockBytes > 0) spans.push_back(Span{baseOffset + id * stride, blockBytes});
  }
  return Queue(info, std::move(source), dst, dstOffset, std::move(spans));
}

}  // namespace wavebus
