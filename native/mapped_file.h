// mapFile: a regular file the caller may write, mapped shared into this process as one external
// Buffer (the engine client's view of its agent's flight recorder ring, docs/recorder.md). The
// mapping lives as long as the Buffer: V8's finalizer unmaps it, so nothing JS can reach ever
// points at unmapped memory. Opened without following a link; the descriptor is closed at once.
#pragma once
#include <napi.h>

namespace wavebus {

void RegisterMappedFile(Napi::Env env, Napi::Object exports);

}  // namespace wavebus
