// Errors that cross into JavaScript always carry a stable `code` (ERR_*), so the TypeScript
// wrapper can turn them into NativeError without parsing messages.
#pragma once
#include <napi.h>
#include <string>

namespace wavebus {

// Outcome of work done off the JS thread, where no napi_env may be touched.
struct Status {
  std::string code;     // empty when ok
  std::string message;
  bool ok() const { return code.empty(); }
  static Status Ok() { return Status{}; }
  static Status Fail(std::string c, std::string m) { return Status{std::move(c), std::move(m)}; }
};

// A JS Error object with `code` set.
Napi::Error CodedError(Napi::Env env, const std::string& code, const std::string& message);

// Throws (as a C++ exception that node-addon-api turns into a JS exception).
[[noreturn]] void ThrowCoded(Napi::Env env, const std::string& code, const std::string& message);

// "message: strerror(errno)" for system-call failures.
std::string ErrnoText(const std::string& what, int err);

// Argument readers for the native entry points. TypeScript validates first; these only keep
// garbage from reaching C++ as undefined behaviour (ERR_INVALID_ARG names the argument).
uint64_t ArgU64(const Napi::CallbackInfo& info, size_t i, const char* name);
std::string ArgString(const Napi::CallbackInfo& info, size_t i, const char* name);
Napi::Uint8Array ArgBytes(const Napi::CallbackInfo& info, size_t i, const char* name);
bool ArgBool(const Napi::CallbackInfo& info, size_t i, const char* name, bool dflt);

}  // namespace wavebus
