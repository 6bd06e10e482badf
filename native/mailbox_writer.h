// MailboxWriter: the agent's side of the wave-vector mailbox (layout in mailbox.h): creates or
// attaches the file, publishes each wave's vector into its seqlock slot and wakes the readers.
#pragma once
#include <napi.h>

#include <cstdint>
#include <string>

#include "mailbox.h"

namespace wavebus {

class MailboxWriter : public Napi::ObjectWrap<MailboxWriter> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit MailboxWriter(const Napi::CallbackInfo& info);
  ~MailboxWriter() override;

 private:
  static Napi::Value Create(const Napi::CallbackInfo& info);
  static Napi::Value Attach(const Napi::CallbackInfo& info);
  static Napi::Value HoldLock(const Napi::CallbackInfo& info);
  static Napi::Value OpenWriter(const Napi::CallbackInfo& info, bool attach);
  Napi::Value Publish(const Napi::CallbackInfo& info);
  Napi::Value Announce(const Napi::CallbackInfo& info);
  Napi::Value SetFeatures(const Napi::CallbackInfo& info);
  Napi::Value SetEpoch(const Napi::CallbackInfo& info);
  Napi::Value SetFloor(const Napi::CallbackInfo& info);
  Napi::Value Owner(const Napi::CallbackInfo& info);
  Napi::Value CaptureWaiting(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);
  uint8_t* Live(Napi::Env env);

  std::string path_;
  uint8_t* base_ = nullptr;
};

}  // namespace wavebus
