// Both checksums a written file needs, in one pass over the bytes: CRC-32C (the file checksum in
// acks and manifests) and, optionally, the zip CRC-32 (IEEE, what zlib.crc32 computes) of a .pt
// record. With PCLMULQDQ both are folded 64 bytes at a time from the same loads, so each byte is
// read from memory once; without it, slicing-by-8 tables (and SSE4.2 for CRC-32C when present).
#pragma once
#include <napi.h>
#include <cstddef>
#include <cstdint>

namespace wavebus {

// Continue *crc32c and, when zip is non-null, *zip over data[0..len). Same chaining convention as
// Crc32c(): pass the previous result, get the result over the concatenation.
void CrcPair(uint32_t* crc32c, uint32_t* zip, const uint8_t* data, size_t len);

// Zip CRC-32 alone: Crc32(prev, b) === zlib.crc32(b, prev).
uint32_t Crc32(uint32_t prev, const uint8_t* data, size_t len);

// Whether the folded (PCLMULQDQ) path is in use.
bool CrcFoldHardware();

// JS: crc32(data, prev?): number; crcPair(data, prevCrc32c, prevZip): [crc32c, zip];
//     crc32Software(data, prev?): number (the table path, for tests); crcFoldHardware(): boolean
void RegisterCrcPair(Napi::Env env, Napi::Object exports);

}  // namespace wavebus
