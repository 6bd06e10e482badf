// MailboxReader: the engine client's side of the wave-vector mailbox (layout in mailbox.h): maps
// the file read-only by contract, looks a wave's vector up (slot or floor), sleeps on `published`
// for a late one, and stores the one word the client owns (capture_waiting).
#pragma once
#include <napi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "mailbox.h"

namespace wavebus {

class MailboxReader : public Napi::ObjectWrap<MailboxReader> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit MailboxReader(const Napi::CallbackInfo& info);
  ~MailboxReader() override;

 private:
  static Napi::Value Open(const Napi::CallbackInfo& info);
  Napi::Value Read(const Napi::CallbackInfo& info);
  Napi::Value Features(const Napi::CallbackInfo& info);
  Napi::Value Epoch(const Napi::CallbackInfo& info);
  Napi::Value Floor(const Napi::CallbackInfo& info);
  Napi::Value WaitFor(const Napi::CallbackInfo& info);
  Napi::Value SetCaptureWaiting(const Napi::CallbackInfo& info);
  Napi::Value View(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);
  const uint8_t* Live(Napi::Env env);

  std::string path_;
  // Shared with WaitFor workers: close() while one sleeps must not unmap under it.
  std::shared_ptr<const uint8_t> map_;
  const uint8_t* base_ = nullptr;
};

}  // namespace wavebus
