// Host staging memory: pinned (cudaHostAlloc) when asked for and CUDA is there, else plain.
// Pinned allocations are registered so a CUDA copy can tell whether its destination is
// already pinned and DMA straight into it instead of bouncing through its own chunk.
#pragma once
#include <napi.h>

#include <cstddef>
#include <cstdint>

namespace wavebus {

// True when [ptr, ptr + len) lies inside one live pinned allocation.
bool IsPinned(const uint8_t* ptr, size_t len);
void RegisterPinned(const uint8_t* ptr, size_t len);
void UnregisterPinned(const uint8_t* ptr);

// JS: allocHost(nbytes, pinned): { buffer, pinned }
void RegisterHostMemory(Napi::Env env, Napi::Object exports);

}  // namespace wavebus
