// Per-environment state: the constructors that static factories (ShmSegment.create, ...) use
// to build instances. Kept in instance data rather than statics so worker_threads each get their own.
#pragma once
#include <napi.h>

namespace wavebus {

struct AddonData {
  Napi::FunctionReference shmSegment;
  Napi::FunctionReference cudaRegion;
  Napi::FunctionReference mailboxWriter;
  Napi::FunctionReference mailboxReader;
};

inline AddonData* GetAddonData(Napi::Env env) { return env.GetInstanceData<AddonData>(); }

}  // namespace wavebus
