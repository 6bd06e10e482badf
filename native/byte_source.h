// Something copies can read from: a mapped shm segment or an opened CUDA IPC allocation.
// Read() runs on a libuv worker thread and must not touch napi values.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "coded_error.h"

namespace wavebus {

// One contiguous piece of a copy: `len` bytes from source offset `src`.
struct Span {
  uint64_t src;
  uint64_t len;
};

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Bytes addressable from offset 0; every span must end at or before this.
  virtual uint64_t Size() const = 0;
  // For messages: "/shm-name" or "cuda device 0".
  virtual std::string Describe() const = 0;
  // Copy the spans, in order, contiguously into dst (which holds the sum of their lengths).
  virtual Status Read(const std::vector<Span>& spans, uint8_t* dst) = 0;
};

}  // namespace wavebus
