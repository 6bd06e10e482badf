// CRC-32C (Castagnoli), the checksum in every dump ack. SSE4.2 when the CPU has it, else a
// slicing-by-8 table. Same convention as iSCSI/ext4: init ~0, final xor ~0, so chaining
// crc32c(b, crc32c(a)) equals crc32c(a + b).
#pragma once
#include <napi.h>
#include <cstddef>
#include <cstdint>

namespace wavebus {

uint32_t Crc32c(uint32_t prev, const uint8_t* data, size_t len);
bool Crc32cHardware();

// JS: crc32c(data: Uint8Array, prev: number): number; crc32cHardware(): boolean
void RegisterCrc32c(Napi::Env env, Napi::Object exports);

}  // namespace wavebus
