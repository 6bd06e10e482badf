// The wave-vector mailbox's layout, shared by its writer (mailbox_writer.h, the agent) and its
// reader (mailbox_reader.h, the TypeScript client). A 576-byte shared file (under /dev/shm) holding a seqlock ring of
// the last 8 wave vectors. The agent writes it; the engine client reads "is anything due for
// wave N?" with plain loads, no system call. Layout (docs/native.md has it byte by byte):
//
//   header, 64 bytes: magic "WBMBOX01" | u32 version = 2 | u32 slots = 8 | u64 features |
//                     u64 epoch | u32 published | u32 zero | u64 floor | u64 owner |
//                     u64 capture_waiting
//   slot i at 64 + 64*i: u64 seq | u64 wave | u32 config_due | u32 dump_due |
//                        u32 snapshot_due | zero padding
//
// Little-endian. Slot for wave N is N % 8. seq is odd while the writer is mid-update; a slot
// with seq == 0 or wave == 2^64-1 is empty. One writer per file (the rank's agent).
// `published` counts slot writes; it is the futex word a client sleeps on when it reaches the end
// of a wave whose vector is late, and the writer wakes it after every publish.
// `floor` (version 2): every wave below it has been decided, so a wave below the floor whose slot
// does not hold it has nothing due (vectors are published one wave ahead: docs/architecture.md).
// The writer stores a slot before the floor that covers it; readers load the floor first.
// `owner`: the global rank + 1 of the agent that created the file (0: not said), so the host
// receiver writes only the mailboxes of its own replica, whatever the placement of ranks.
// `capture_waiting` is the one word the engine client writes: the ticket of the before_forward it
// is waiting on, 0 once it stops waiting. The agent loads it after copying a forward's inputs: any
// other value means the engine may have changed them during the copy, so the capture is dropped.
#pragma once
#include <napi.h>

#include <cstdint>
#include <cstring>

namespace wavebus {

namespace mailbox {
constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kSlotBytes = 64;
constexpr uint32_t kSlots = 8;
constexpr uint64_t kFileBytes = kHeaderBytes + kSlotBytes * kSlots;
constexpr uint32_t kVersion = 2;
constexpr char kMagic[9] = "WBMBOX01";
constexpr uint64_t kEmptyWave = ~0ull;
// Byte offsets.
constexpr uint64_t kOffVersion = 8, kOffSlots = 12, kOffFeatures = 16, kOffEpoch = 24, kOffPublished = 32, kOffFloor = 40, kOffOwner = 48,
                   kOffCaptureWaiting = 56;
constexpr uint64_t kSlotSeq = 0, kSlotWave = 8, kSlotConfig = 16, kSlotDump = 20, kSlotSnapshot = 24;

// The mapped bytes are shared with other processes; every access is an __atomic builtin on a
// naturally aligned field (mmap returns page-aligned memory), so no access is a data race.
inline uint64_t* U64(uint8_t* base, uint64_t off) { return reinterpret_cast<uint64_t*>(base + off); }
inline uint32_t* U32(uint8_t* base, uint64_t off) { return reinterpret_cast<uint32_t*>(base + off); }
inline const uint64_t* U64(const uint8_t* base, uint64_t off) { return reinterpret_cast<const uint64_t*>(base + off); }
inline const uint32_t* U32(const uint8_t* base, uint64_t off) { return reinterpret_cast<const uint32_t*>(base + off); }

// The header's first word as the magic makes it (checked by the reader, stored last by the writer).
inline uint64_t MagicWord() {
  uint64_t m;
  std::memcpy(&m, kMagic, 8);
  return m;
}
}  // namespace mailbox

// JS: mailboxLayout constants
void RegisterMailboxLayout(Napi::Env env, Napi::Object exports);

}  // namespace wavebus
