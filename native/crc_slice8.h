// Slicing-by-8 table CRC for any reflected 32-bit polynomial: the software path of CRC-32C
// (crc32c.cc) and of CRC-32/IEEE (crc_pair.cc), kept in one place so the two cannot drift.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace wavebus {

struct Slice8Tables {
  uint32_t t[8][256];

  explicit Slice8Tables(uint32_t reflectedPoly) {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c >> 1) ^ (reflectedPoly & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
      for (int s = 1; s < 8; s++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }

  // Raw register update (no pre/post inversion); little-endian hosts only (x86-64, aarch64).
  uint32_t Update(uint32_t crc, const uint8_t* p, size_t n) const {
    while (n >= 8) {
      uint32_t lo, hi;
      std::memcpy(&lo, p, 4);
      std::memcpy(&hi, p + 4, 4);
      lo ^= crc;
      crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
            t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
      p += 8;
      n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
    return crc;
  }
};

}  // namespace wavebus
