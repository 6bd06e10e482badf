// ShmSegment: a POSIX shared-memory segment (shm_open + mmap). Engines, simulators and tests
// create segments; agents open them read-only and copy out of them.
//
// Lifetime: the mapping lives in a shared_ptr<ShmMapping>. close() drops the segment's own
// reference and marks it closed (every later call throws ERR_CLOSED); copies in flight and
// Buffers handed out by buffer() hold their own references, so the memory is unmapped only
// when the last of them is done. Nothing JS can reach ever points at unmapped memory.
#pragma once
#include <napi.h>

#include <memory>
#include <string>

#include "byte_source.h"

namespace wavebus {

class ShmMapping : public ByteSource {
 public:
  ShmMapping(std::string name, int fd, uint8_t* addr, uint64_t len, bool writable);
  ~ShmMapping() override;
  uint64_t Size() const override { return len_; }
  std::string Describe() const override { return "shm segment " + name_; }
  Status Read(const std::vector<Span>& spans, uint8_t* dst) override;

  // The segment as it is now: size from fstat, and whether it still has a name.
  Status Stat(uint64_t* size, bool* linked) const;

  const std::string& name() const { return name_; }
  uint8_t* addr() const { return addr_; }
  bool writable() const { return writable_; }

 private:
  std::string name_;
  int fd_;
  uint8_t* addr_;
  uint64_t len_;
  bool writable_;
};

class ShmSegment : public Napi::ObjectWrap<ShmSegment> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit ShmSegment(const Napi::CallbackInfo& info);

 private:
  static Napi::Value Create(const Napi::CallbackInfo& info);
  static Napi::Value Open(const Napi::CallbackInfo& info);
  static Napi::Value Unlink(const Napi::CallbackInfo& info);
  static Napi::Value Wrap(Napi::Env env, std::shared_ptr<ShmMapping> mapping);

  Napi::Value GetSize(const Napi::CallbackInfo& info);
  Napi::Value GetName(const Napi::CallbackInfo& info);
  Napi::Value GetReadonly(const Napi::CallbackInfo& info);
  Napi::Value GetClosed(const Napi::CallbackInfo& info);
  Napi::Value Buffer(const Napi::CallbackInfo& info);
  Napi::Value Stat(const Napi::CallbackInfo& info);
  Napi::Value CopyTo(const Napi::CallbackInfo& info);
  Napi::Value GatherTo(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);

  const std::shared_ptr<ShmMapping>& Live(Napi::Env env);

  std::shared_ptr<ShmMapping> mapping_;
  std::string name_;
  uint64_t size_ = 0;
  bool readonly_ = true;
  // The one external Buffer over the mapping (V8 must not see the same memory twice).
  Napi::Reference<Napi::Buffer<uint8_t>> buffer_;
};

}  // namespace wavebus
