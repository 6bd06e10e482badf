#include "mailbox.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "addon_data.h"
#include "coded_error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace wavebus {

using namespace mailbox;

namespace {

// The mapped bytes are shared with other processes; every access is an __atomic builtin on a
// naturally aligned field (mmap returns page-aligned memory), so no access is a data race.
inline uint64_t* U64(uint8_t* base, uint64_t off) { return reinterpret_cast<uint64_t*>(base + off); }
inline uint32_t* U32(uint8_t* base, uint64_t off) { return reinterpret_cast<uint32_t*>(base + off); }
inline const uint64_t* U64(const uint8_t* base, uint64_t off) { return reinterpret_cast<const uint64_t*>(base + off); }
inline const uint32_t* U32(const uint8_t* base, uint64_t off) { return reinterpret_cast<const uint32_t*>(base + off); }

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

uint64_t MagicWord() {
  uint64_t m;
  std::memcpy(&m, kMagic, 8);
  return m;
}

// Seqlock write of one slot: odd seq, release fence, fields, even seq with release.
void WriteSlot(uint8_t* base, uint32_t slot, uint64_t wave, uint32_t config, uint32_t dump, uint32_t snapshot) {
  uint8_t* s = base + kHeaderBytes + kSlotBytes * slot;
  uint64_t seq = __atomic_load_n(U64(s, kSlotSeq), __ATOMIC_RELAXED);
  if (seq & 1) seq++;  // a previous writer died mid-update: step past it
  __atomic_store_n(U64(s, kSlotSeq), seq + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  __atomic_store_n(U64(s, kSlotWave), wave, __ATOMIC_RELAXED);
  __atomic_store_n(U32(s, kSlotConfig), config, __ATOMIC_RELAXED);
  __atomic_store_n(U32(s, kSlotDump), dump, __ATOMIC_RELAXED);
  __atomic_store_n(U32(s, kSlotSnapshot), snapshot, __ATOMIC_RELAXED);
  __atomic_store_n(U64(s, kSlotSeq), seq + 2, __ATOMIC_RELEASE);
}

// Every slot write bumps `published` and wakes whoever sleeps on it. Not FUTEX_PRIVATE: the
// sleepers are other processes mapping the same file. The wake costs ~0.6 µs (measured), once per
// wave, in the agent.
void AnnouncePublish(uint8_t* base) {
  uint32_t* word = U32(base, kOffPublished);
  __atomic_fetch_add(word, 1, __ATOMIC_SEQ_CST);
  syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

enum class SlotRead { kFound, kOther, kBusy, kImplied, kLater };

// Seqlock read of the slot for `wave`; out[] = wave, config, dump, snapshot when kFound. A writer
// holds a slot odd for a few stores; kBusy when it stays odd (or keeps changing) through the
// spin: the writer was descheduled mid-update, or died there. Callers treat that as "not
// arrived", never as an error: a busy host must not turn a late wave into a failed step.
SlotRead ReadSlot(const uint8_t* base, uint64_t wave, uint64_t out[4]) {
  const uint8_t* s = base + kHeaderBytes + kSlotBytes * (wave % kSlots);
  for (int attempt = 0; attempt < 4096; attempt++) {
    uint64_t s1 = __atomic_load_n(U64(s, kSlotSeq), __ATOMIC_ACQUIRE);
    if (s1 & 1) {
      CpuRelax();
      continue;
    }
    uint64_t w = __atomic_load_n(U64(s, kSlotWave), __ATOMIC_RELAXED);
    uint32_t config = __atomic_load_n(U32(s, kSlotConfig), __ATOMIC_RELAXED);
    uint32_t dump = __atomic_load_n(U32(s, kSlotDump), __ATOMIC_RELAXED);
    uint32_t snapshot = __atomic_load_n(U32(s, kSlotSnapshot), __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint64_t s2 = __atomic_load_n(U64(s, kSlotSeq), __ATOMIC_RELAXED);
    if (s1 != s2) continue;
    if (s1 == 0 || w != wave) return s1 != 0 && w != kEmptyWave && w > wave ? SlotRead::kLater : SlotRead::kOther;
    out[0] = w;
    out[1] = config;
    out[2] = dump;
    out[3] = snapshot;
    return SlotRead::kFound;
  }
  return SlotRead::kBusy;
}

// What a reader knows of `wave`: its own vector (kFound), "nothing due" because the wave is below
// the floor and its slot does not hold it (kImplied; out[] = wave, 0, 0, 0), a slot already holding
// a later wave (kLater: overwritten, the agent decides), or not yet (kOther / kBusy). The floor is
// loaded before the slot: the writer stores a slot before the floor that covers it, so a wave
// below a floor seen here has its vector in the slot if it ever had one.
SlotRead Lookup(const uint8_t* base, uint64_t wave, uint64_t out[4]) {
  uint64_t floor = __atomic_load_n(U64(base, kOffFloor), __ATOMIC_ACQUIRE);
  SlotRead r = ReadSlot(base, wave, out);
  if (r == SlotRead::kOther && wave < floor) {
    out[0] = wave;
    out[1] = out[2] = out[3] = 0;
    return SlotRead::kImplied;
  }
  return r;
}

// [wave, config, dump, snapshot, implied]: implied is 1 when the floor, not a slot, answered.
Napi::Array VectorArray(Napi::Env env, const uint64_t v[4], bool implied) {
  Napi::Array a = Napi::Array::New(env, 5);
  for (uint32_t i = 0; i < 4; i++) a.Set(i, Napi::Number::New(env, static_cast<double>(v[i])));
  a.Set(4u, Napi::Number::New(env, implied ? 1 : 0));
  return a;
}

// Sleeps on `published` until the slot for a wave holds it, or the bound runs out. Runs on the
// libuv pool so that a TypeScript engine (and an agent in the same process, as in tests) keeps
// its event loop; the wake costs one futex hop instead of a round trip to the agent.
class WaitWorker : public Napi::AsyncWorker {
 public:
  WaitWorker(Napi::Env env, std::shared_ptr<const uint8_t> map, uint64_t wave, uint64_t timeoutMs)
      : Napi::AsyncWorker(env, "wavebus:mailbox-wait"),
        map_(std::move(map)),
        wave_(wave),
        timeoutMs_(timeoutMs),
        deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise Promise() { return deferred_.Promise(); }

 protected:
  void Execute() override {
    const uint8_t* base = map_.get();
    const uint32_t* word = U32(base, kOffPublished);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs_);
    for (;;) {
      uint32_t seen = __atomic_load_n(word, __ATOMIC_SEQ_CST);
      result_ = Lookup(base, wave_, out_);
      if (result_ == SlotRead::kFound || result_ == SlotRead::kImplied) return;
      // A slot already past this wave means its vector was overwritten: waiting cannot help.
      if (result_ == SlotRead::kLater) return;  // resolves undefined
      // Mid-update: the writer finishes (and wakes us) soon, unless it died; then the bound ends it.
      bool busy = result_ == SlotRead::kBusy;
      auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::nanoseconds(0)) {
        timedOut_ = true;
        return;
      }
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      if (busy && ns > 200000) ns = 200000;  // look again shortly: its wake may already have passed
      struct timespec ts = {static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      // EAGAIN: published moved since `seen` (look again); EINTR/ETIMEDOUT: the loop decides.
      syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0);
    }
  }

  void OnOK() override {
    Napi::Env env = Env();
    map_.reset();
    if (result_ == SlotRead::kFound || result_ == SlotRead::kImplied) {
      deferred_.Resolve(VectorArray(env, out_, result_ == SlotRead::kImplied));
      return;
    }
    // false: the bound ran out; undefined: the slot moved past this wave.
    deferred_.Resolve(timedOut_ ? Napi::Value(Napi::Boolean::New(env, false)) : env.Undefined());
  }

 private:
  std::shared_ptr<const uint8_t> map_;
  uint64_t wave_;
  uint64_t timeoutMs_;
  Napi::Promise::Deferred deferred_;
  SlotRead result_ = SlotRead::kOther;
  uint64_t out_[4] = {0, 0, 0, 0};
  bool timedOut_ = false;
};

uint32_t ArgU32(const Napi::CallbackInfo& info, size_t i, const char* name) {
  uint64_t v = ArgU64(info, i, name);
  if (v > 0xFFFFFFFFull) ThrowCoded(info.Env(), "ERR_INVALID_ARG", std::string(name) + " must fit in 32 bits");
  return static_cast<uint32_t>(v);
}

}  // namespace

// ---------------------------------------------------------------- writer

Napi::Function MailboxWriter::Define(Napi::Env env) {
  return DefineClass(env, "MailboxWriter",
                     {
                         StaticMethod<&MailboxWriter::Create>("create"),
                         StaticMethod<&MailboxWriter::Attach>("attach"),
                         StaticMethod<&MailboxWriter::HoldLock>("holdLock"),
                         InstanceMethod<&MailboxWriter::Publish>("publish"),
                         InstanceMethod<&MailboxWriter::Announce>("announce"),
                         InstanceMethod<&MailboxWriter::SetFeatures>("setFeatures"),
                         InstanceMethod<&MailboxWriter::SetEpoch>("setEpoch"),
                         InstanceMethod<&MailboxWriter::SetFloor>("setFloor"),
                         InstanceMethod<&MailboxWriter::Owner>("owner"),
                         InstanceMethod<&MailboxWriter::CaptureWaiting>("captureWaiting"),
                         InstanceMethod<&MailboxWriter::Close>("close"),
                     });
}

MailboxWriter::MailboxWriter(const Napi::CallbackInfo& info) : Napi::ObjectWrap<MailboxWriter>(info) {
  if (info.Length() != 2 || !info[0].IsExternal() || !info[1].IsString()) {
    ThrowCoded(info.Env(), "ERR_INVALID_ARG", "use MailboxWriter.create()");
  }
  base_ = info[0].As<Napi::External<uint8_t>>().Data();
  path_ = info[1].As<Napi::String>().Utf8Value();
}

MailboxWriter::~MailboxWriter() {
  if (base_ != nullptr) munmap(base_, kFileBytes);
}

// Creates the file (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600: only the agent's uid, which is the
// engine's, maps it), or takes over one a previous agent of this rank left (same path after a
// restart): readers that still have it mapped keep working, they just see the slots emptied.
// A taken-over file must be a regular file of ours with no other name (a planted link or hard
// link to someone's file is refused, never written). The file only ever grows, so a reader's
// mapping never loses pages under it (which would be SIGBUS). The optional second argument is the
// owner (global rank + 1), stored in the header before its magic.
Napi::Value MailboxWriter::Create(const Napi::CallbackInfo& info) { return OpenWriter(info, false); }

// Attach: the host receiver (docs/bus.md, "One receiver per host") writes the vectors of another
// local rank's mailbox, which that rank's agent created. Nothing is reset (the features and epoch
// are that agent's); the file must exist, be ours, have one name and a valid header.
Napi::Value MailboxWriter::Attach(const Napi::CallbackInfo& info) { return OpenWriter(info, true); }

Napi::Value MailboxWriter::OpenWriter(const Napi::CallbackInfo& info, bool attach) {
  Napi::Env env = info.Env();
  std::string path = ArgString(info, 0, "path");
  uint64_t owner = !attach && info.Length() > 1 && !info[1].IsUndefined() ? ArgU64(info, 1, "owner") : 0;
  int fd = attach ? -1 : open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool existed = attach || (fd < 0 && errno == EEXIST);
  if (existed) fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ELOOP) ThrowCoded(env, "ERR_MAILBOX_OPEN", path + " is a symbolic link; refusing to follow it");
    ThrowCoded(env, "ERR_MAILBOX_OPEN", ErrnoText("open(" + path + ")", err));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    ThrowCoded(env, "ERR_MAILBOX_OPEN", ErrnoText("fstat(" + path + ")", err));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    ThrowCoded(env, "ERR_MAILBOX_OPEN", path + " is not a regular file");
  }
  if (existed && (st.st_uid != geteuid() || st.st_nlink != 1)) {
    close(fd);
    ThrowCoded(env, "ERR_MAILBOX_OPEN", path + " exists and is not a mailbox of ours (owner uid " + std::to_string(st.st_uid) + ", " +
                                            std::to_string(st.st_nlink) + " links); refusing to take it over");
  }
  if (existed && (st.st_mode & 07777) != 0600 && fchmod(fd, 0600) != 0) {
    int err = errno;
    close(fd);
    ThrowCoded(env, "ERR_MAILBOX_OPEN", ErrnoText("fchmod(" + path + ", 0600)", err));
  }
  if (attach && static_cast<uint64_t>(st.st_size) < kFileBytes) {
    close(fd);
    ThrowCoded(env, "ERR_MAILBOX_FORMAT", path + " is shorter than a mailbox; not attached");
  }
  if (static_cast<uint64_t>(st.st_size) < kFileBytes && ftruncate(fd, kFileBytes) != 0) {
    int err = errno;
    close(fd);
    ThrowCoded(env, "ERR_MAILBOX_OPEN", ErrnoText("ftruncate(" + path + ")", err));
  }
  void* addr = mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);  // the mapping keeps the file alive
  if (addr == MAP_FAILED) ThrowCoded(env, "ERR_MAILBOX_OPEN", ErrnoText("mmap(" + path + ")", err));
  uint8_t* base = static_cast<uint8_t*>(addr);

  uint64_t magic = __atomic_load_n(U64(base, 0), __ATOMIC_ACQUIRE);
  if (attach) {
    // The version too, as the reader checks it: a mailbox of another layout is never written into.
    uint32_t version = __atomic_load_n(U32(base, kOffVersion), __ATOMIC_RELAXED);
    uint32_t slots = __atomic_load_n(U32(base, kOffSlots), __ATOMIC_RELAXED);
    if (magic != MagicWord()) {
      munmap(base, kFileBytes);
      ThrowCoded(env, "ERR_MAILBOX_FORMAT", path + " is not a ready wavebus mailbox (no header yet); not attached");
    }
    if (version != kVersion || slots != kSlots) {
      munmap(base, kFileBytes);
      ThrowCoded(env, "ERR_MAILBOX_FORMAT", path + " is not a version-" + std::to_string(kVersion) + " wavebus mailbox (version " + std::to_string(version) +
                                                ", " + std::to_string(slots) + " slots); not attached");
    }
    auto ext = Napi::External<uint8_t>::New(env, base);
    return GetAddonData(env)->mailboxWriter.New({ext, Napi::String::New(env, path)});
  }
  if (magic != MagicWord() && st.st_size > 0) {
    bool zero = true;
    for (uint64_t i = 0; i < kFileBytes && zero; i++) zero = base[i] == 0;
    if (!zero) {
      munmap(base, kFileBytes);
      ThrowCoded(env, "ERR_MAILBOX_FORMAT", path + " exists and is not a wavebus mailbox; refusing to overwrite it");
    }
  }
  __atomic_store_n(U32(base, kOffVersion), kVersion, __ATOMIC_RELAXED);
  __atomic_store_n(U32(base, kOffSlots), kSlots, __ATOMIC_RELAXED);
  __atomic_store_n(U64(base, kOffFeatures), 0, __ATOMIC_RELAXED);
  __atomic_store_n(U64(base, kOffFloor), 0, __ATOMIC_RELAXED);
  __atomic_store_n(U64(base, kOffOwner), owner, __ATOMIC_RELAXED);
  for (uint32_t i = 0; i < kSlots; i++) WriteSlot(base, i, kEmptyWave, 0, 0, 0);
  __atomic_store_n(U64(base, 0), MagicWord(), __ATOMIC_RELEASE);  // magic last: the header is now valid
  AnnouncePublish(base);  // a client asleep on the previous agent's file looks again

  auto ext = Napi::External<uint8_t>::New(env, base);
  Napi::Object obj = GetAddonData(env)->mailboxWriter.New({ext, Napi::String::New(env, path)});
  return obj;
}

uint8_t* MailboxWriter::Live(Napi::Env env) {
  if (base_ == nullptr) ThrowCoded(env, "ERR_CLOSED", "mailbox writer " + path_ + " is closed");
  return base_;
}

Napi::Value MailboxWriter::Publish(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint8_t* base = Live(env);
  uint64_t wave = ArgU64(info, 0, "wave");
  uint32_t config = ArgU32(info, 1, "configDue");
  uint32_t dump = ArgU32(info, 2, "dumpDue");
  uint32_t snapshot = info.Length() > 3 && !info[3].IsUndefined() ? ArgU32(info, 3, "snapshotDue") : 0;
  WriteSlot(base, static_cast<uint32_t>(wave % kSlots), wave, config, dump, snapshot);
  // The floor that covers this slot goes after it (release): one wake for both.
  if (info.Length() > 4 && !info[4].IsUndefined()) __atomic_store_n(U64(base, kOffFloor), ArgU64(info, 4, "floor"), __ATOMIC_RELEASE);
  // wake false: the host receiver stores every local rank's slot first and wakes them after
  // (announce), so the last rank's vector is readable without waiting for the others' wakes.
  if (info.Length() > 5 && info[5].IsBoolean() && !info[5].As<Napi::Boolean>().Value()) return env.Undefined();
  AnnouncePublish(base);
  return env.Undefined();
}

Napi::Value MailboxWriter::Announce(const Napi::CallbackInfo& info) {
  AnnouncePublish(Live(info.Env()));
  return info.Env().Undefined();
}

Napi::Value MailboxWriter::SetFeatures(const Napi::CallbackInfo& info) {
  uint8_t* base = Live(info.Env());
  __atomic_store_n(U64(base, kOffFeatures), ArgU64(info, 0, "features"), __ATOMIC_RELEASE);
  return info.Env().Undefined();
}

Napi::Value MailboxWriter::SetEpoch(const Napi::CallbackInfo& info) {
  uint8_t* base = Live(info.Env());
  __atomic_store_n(U64(base, kOffEpoch), ArgU64(info, 0, "epoch"), __ATOMIC_RELEASE);
  return info.Env().Undefined();
}

// A floor alone (a snapshot's): waves below it need no vector; sleepers look again.
Napi::Value MailboxWriter::SetFloor(const Napi::CallbackInfo& info) {
  uint8_t* base = Live(info.Env());
  __atomic_store_n(U64(base, kOffFloor), ArgU64(info, 0, "floor"), __ATOMIC_RELEASE);
  AnnouncePublish(base);
  return info.Env().Undefined();
}

// Who created the file: global rank + 1, 0 when its creator did not say (read once at attach).
Napi::Value MailboxWriter::Owner(const Napi::CallbackInfo& info) {
  uint8_t* base = Live(info.Env());
  return Napi::Number::New(info.Env(), static_cast<double>(__atomic_load_n(U64(base, kOffOwner), __ATOMIC_ACQUIRE)));
}

// The engine's capture_waiting word, loaded after the inputs were copied (seq-cst: the copy's reads
// come before it). The client stores 0 before its engine may touch the inputs again, so reading the
// request's ticket here means the engine was still waiting when the copy ended.
Napi::Value MailboxWriter::CaptureWaiting(const Napi::CallbackInfo& info) {
  uint8_t* base = Live(info.Env());
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return Napi::Number::New(info.Env(), static_cast<double>(__atomic_load_n(U64(base, kOffCaptureWaiting), __ATOMIC_SEQ_CST)));
}

// The host receiver's role is an exclusive flock on a file in the run dir: the kernel drops it
// when its holder dies, however it dies, so another local agent takes the role over and two
// processes never write one mailbox's slots. Returns the lock's fd (>= 0: held until it is closed
// or this process ends; close-on-exec), or -1 when another open of the file holds it.
Napi::Value MailboxWriter::HoldLock(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = ArgString(info, 0, "path");
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    int err = errno;
    if (err == ELOOP) ThrowCoded(env, "ERR_MAILBOX_OPEN", path + " is a symbolic link; refusing to follow it");
    ThrowCoded(env, "ERR_MAILBOX_OPEN", ErrnoText("open(" + path + ")", err));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return Napi::Number::New(env, fd);
  int err = errno;
  close(fd);
  if (err == EWOULDBLOCK) return Napi::Number::New(env, -1);
  ThrowCoded(env, "ERR_MAILBOX_OPEN", ErrnoText("flock(" + path + ")", err));
  return env.Undefined();
}

Napi::Value MailboxWriter::Close(const Napi::CallbackInfo& info) {
  if (base_ != nullptr) munmap(base_, kFileBytes);
  base_ = nullptr;
  return info.Env().Undefined();
}

// ---------------------------------------------------------------- reader

Napi::Function MailboxReader::Define(Napi::Env env) {
  return DefineClass(env, "MailboxReader",
                     {
                         StaticMethod<&MailboxReader::Open>("open"),
                         InstanceMethod<&MailboxReader::Read>("read"),
                         InstanceMethod<&MailboxReader::Features>("features"),
                         InstanceMethod<&MailboxReader::Epoch>("epoch"),
                         InstanceMethod<&MailboxReader::Floor>("floor"),
                         InstanceMethod<&MailboxReader::WaitFor>("waitFor"),
                         InstanceMethod<&MailboxReader::SetCaptureWaiting>("setCaptureWaiting"),
                         InstanceMethod<&MailboxReader::View>("view"),
                         InstanceMethod<&MailboxReader::Close>("close"),
                     });
}

MailboxReader::MailboxReader(const Napi::CallbackInfo& info) : Napi::ObjectWrap<MailboxReader>(info) {
  if (info.Length() != 2 || !info[0].IsExternal() || !info[1].IsString()) {
    ThrowCoded(info.Env(), "ERR_INVALID_ARG", "use MailboxReader.open()");
  }
  base_ = info[0].As<Napi::External<uint8_t>>().Data();
  path_ = info[1].As<Napi::String>().Utf8Value();
  map_ = std::shared_ptr<const uint8_t>(base_, [](const uint8_t* p) { munmap(const_cast<uint8_t*>(p), kFileBytes); });
}

MailboxReader::~MailboxReader() = default;

Napi::Value MailboxReader::Open(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = ArgString(info, 0, "path");
  // Read-write for one word, capture_waiting (the client's); everything else is only read here.
  int fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);  // the agent never makes it a link
  if (fd < 0) ThrowCoded(env, "ERR_MAILBOX_OPEN", ErrnoText("open(" + path + ")", errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < kFileBytes) {
    close(fd);
    ThrowCoded(env, "ERR_MAILBOX_FORMAT",
               path + " is not a wavebus mailbox (needs a regular file of at least " + std::to_string(kFileBytes) + " bytes)");
  }
  void* addr = mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (addr == MAP_FAILED) ThrowCoded(env, "ERR_MAILBOX_OPEN", ErrnoText("mmap(" + path + ")", err));
  const uint8_t* base = static_cast<const uint8_t*>(addr);
  uint64_t magic = __atomic_load_n(U64(base, 0), __ATOMIC_ACQUIRE);
  uint32_t version = __atomic_load_n(U32(base, kOffVersion), __ATOMIC_RELAXED);
  uint32_t slots = __atomic_load_n(U32(base, kOffSlots), __ATOMIC_RELAXED);
  if (magic != MagicWord() || version != kVersion || slots != kSlots) {
    munmap(addr, kFileBytes);
    ThrowCoded(env, "ERR_MAILBOX_FORMAT",
               path + " is not a version-" + std::to_string(kVersion) + " wavebus mailbox (magic/version/slots mismatch: version " +
                   std::to_string(version) + ", slots " + std::to_string(slots) + ")");
  }
  auto ext = Napi::External<uint8_t>::New(env, const_cast<uint8_t*>(base));
  return GetAddonData(env)->mailboxReader.New({ext, Napi::String::New(env, path)});
}

const uint8_t* MailboxReader::Live(Napi::Env env) {
  if (base_ == nullptr) ThrowCoded(env, "ERR_CLOSED", "mailbox reader " + path_ + " is closed");
  return base_;
}

Napi::Value MailboxReader::Read(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const uint8_t* base = Live(env);
  uint64_t wave = ArgU64(info, 0, "wave");
  uint64_t v[4];
  SlotRead r = Lookup(base, wave, v);
  if (r != SlotRead::kFound && r != SlotRead::kImplied) return env.Undefined();
  return VectorArray(env, v, r == SlotRead::kImplied);
}

// JS: waitFor(wave, timeoutMs) -> Promise<[wave, config, dump, snapshot] | false | undefined>
Napi::Value MailboxReader::WaitFor(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  uint64_t wave = ArgU64(info, 0, "wave");
  uint64_t timeoutMs = ArgU64(info, 1, "timeoutMs");
  auto* worker = new WaitWorker(env, map_, wave, timeoutMs);
  Napi::Promise p = worker->Promise();
  worker->Queue();
  return p;
}

Napi::Value MailboxReader::Features(const Napi::CallbackInfo& info) {
  const uint8_t* base = Live(info.Env());
  return Napi::Number::New(info.Env(), static_cast<double>(__atomic_load_n(U64(base, kOffFeatures), __ATOMIC_ACQUIRE)));
}

Napi::Value MailboxReader::Epoch(const Napi::CallbackInfo& info) {
  const uint8_t* base = Live(info.Env());
  return Napi::Number::New(info.Env(), static_cast<double>(__atomic_load_n(U64(base, kOffEpoch), __ATOMIC_ACQUIRE)));
}

Napi::Value MailboxReader::Floor(const Napi::CallbackInfo& info) {
  const uint8_t* base = Live(info.Env());
  return Napi::Number::New(info.Env(), static_cast<double>(__atomic_load_n(U64(base, kOffFloor), __ATOMIC_ACQUIRE)));
}

// The client's only store into the file: the ticket of the before_forward it waits on (0: none).
// Seq-cst with a fence after it, so storing 0 is visible before the engine touches its inputs again.
Napi::Value MailboxReader::SetCaptureWaiting(const Napi::CallbackInfo& info) {
  uint8_t* base = const_cast<uint8_t*>(Live(info.Env()));
  __atomic_store_n(U64(base, kOffCaptureWaiting), ArgU64(info, 0, "ticket"), __ATOMIC_SEQ_CST);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return info.Env().Undefined();
}

// The mapping as a read-only-by-contract Buffer (the header and slots; the client stores nothing
// through it: setCaptureWaiting does): the JS client reads vectors and the header with Atomics
// loads on it, without an addon call per read. The Buffer holds the mapping (a share of map_), so
// close() while it lives unmaps nothing under it.
Napi::Value MailboxReader::View(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint8_t* base = const_cast<uint8_t*>(Live(env));
  auto* hold = new std::shared_ptr<const uint8_t>(map_);
  return Napi::Buffer<uint8_t>::New(
      env, base, kFileBytes, [](Napi::Env, uint8_t*, std::shared_ptr<const uint8_t>* h) { delete h; }, hold);
}

Napi::Value MailboxReader::Close(const Napi::CallbackInfo& info) {
  map_.reset();  // unmapped once no waitFor worker holds it either
  base_ = nullptr;
  return info.Env().Undefined();
}

void RegisterMailboxLayout(Napi::Env env, Napi::Object exports) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("headerBytes", Napi::Number::New(env, kHeaderBytes));
  o.Set("slotBytes", Napi::Number::New(env, kSlotBytes));
  o.Set("slots", Napi::Number::New(env, kSlots));
  o.Set("fileBytes", Napi::Number::New(env, kFileBytes));
  o.Set("magic", Napi::String::New(env, std::string(kMagic, 8)));
  o.Set("version", Napi::Number::New(env, kVersion));
  o.Freeze();
  exports.Set("mailboxLayout", o);
}

}  // namespace wavebus
