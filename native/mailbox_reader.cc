// MailboxReader (mailbox_reader.h): the engine client reads wave vectors from its rank's mailbox.
#include "mailbox_reader.h"

#include <fcntl.h>
#include <linux/futex.h>
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

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
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

}  // namespace

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

}  // namespace wavebus
