// MailboxWriter (mailbox_writer.h): the agent writes the wave vectors of its rank's mailbox.
#include "mailbox_writer.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "addon_data.h"
#include "coded_error.h"

namespace wavebus {

using namespace mailbox;

namespace {

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

uint32_t ArgU32(const Napi::CallbackInfo& info, size_t i, const char* name) {
  uint64_t v = ArgU64(info, i, name);
  if (v > 0xFFFFFFFFull) ThrowCoded(info.Env(), "ERR_INVALID_ARG", std::string(name) + " must fit in 32 bits");
  return static_cast<uint32_t>(v);
}

}  // namespace

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

}  // namespace wavebus
