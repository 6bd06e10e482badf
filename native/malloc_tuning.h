// glibc malloc tuning for processes that move large messages (the coordinator relaying file
// chunks, the aggregate tool): by default glibc serves allocations over 128 KiB (growing up to
// 32 MiB) with fresh mmaps and trims freed heap memory back to the kernel, so every multi-MiB
// ZeroMQ frame lands on new pages and pays a page fault per 4 KiB (about 15 µs each on a VM).
// Keeping freed memory for reuse removes those faults.
#pragma once
#include <napi.h>

namespace wavebus {

// JS: tuneMalloc(mmapThresholdBytes: number, trimThresholdBytes: number): boolean
//   (false where the C library is not glibc: nothing changed)
void RegisterMallocTuning(Napi::Env env, Napi::Object exports);

}  // namespace wavebus
