// The mailbox's layout constants for JavaScript (native.mailboxLayout); its writer and reader
// are mailbox_writer.cc and mailbox_reader.cc.
#include "mailbox.h"

#include <string>

namespace wavebus {

using namespace mailbox;

void RegisterMailboxLayout(Napi::Env env, Napi::Object exports) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("headerBytes", Napi::Number::New(env, kHeaderBytes));
  o.Set("slotBytes", Napi::Number::New(env, kSlotBytes));
  o.Set("slots", Napi::Number::New(env, kSlots));
  o.Set("fileBytes", Napi::Number::New(env, kFileBytes));
  o.Set("magic", Napi::String::New(env, std::string(kMagic, 8)));
  o.Set("version", Napi::Number::New(env, kVersion));
  o.Freeze();
  exports.Set("mailboxLayout", o);
}

}  // namespace wavebus
