#include "coded_error.h"

#include <cmath>
#include <cstring>

namespace wavebus {

Napi::Error CodedError(Napi::Env env, const std::string& code, const std::string& message) {
  Napi::Error e = Napi::Error::New(env, message);
  e.Set("code", Napi::String::New(env, code));
  return e;
}

void ThrowCoded(Napi::Env env, const std::string& code, const std::string& message) {
  throw CodedError(env, code, message);
}

std::string ErrnoText(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

uint64_t ArgU64(const Napi::CallbackInfo& info, size_t i, const char* name) {
  if (info.Length() <= i || !info[i].IsNumber()) {
    ThrowCoded(info.Env(), "ERR_INVALID_ARG", std::string(name) + " must be a number");
  }
  double v = info[i].As<Napi::Number>().DoubleValue();
  // 2^53: the largest integer a JS number holds exactly.
  if (!(v >= 0) || v > 9007199254740991.0 || std::floor(v) != v) {
    ThrowCoded(info.Env(), "ERR_INVALID_ARG", std::string(name) + " must be a non-negative safe integer");
  }
  return static_cast<uint64_t>(v);
}

std::string ArgString(const Napi::CallbackInfo& info, size_t i, const char* name) {
  if (info.Length() <= i || !info[i].IsString()) {
    ThrowCoded(info.Env(), "ERR_INVALID_ARG", std::string(name) + " must be a string");
  }
  return info[i].As<Napi::String>().Utf8Value();
}

Napi::Uint8Array ArgBytes(const Napi::CallbackInfo& info, size_t i, const char* name) {
  if (info.Length() <= i || !info[i].IsTypedArray() ||
      info[i].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    ThrowCoded(info.Env(), "ERR_INVALID_ARG", std::string(name) + " must be a Buffer or Uint8Array");
  }
  return info[i].As<Napi::Uint8Array>();
}

bool ArgBool(const Napi::CallbackInfo& info, size_t i, const char* name, bool dflt) {
  if (info.Length() <= i || info[i].IsUndefined()) return dflt;
  if (!info[i].IsBoolean()) {
    ThrowCoded(info.Env(), "ERR_INVALID_ARG", std::string(name) + " must be a boolean");
  }
  return info[i].As<Napi::Boolean>().Value();
}

}  // namespace wavebus
