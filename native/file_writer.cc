#include "file_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include "coded_error.h"
#include "crc_pair.h"

namespace wavebus {

namespace {

// An fs-style failure: code = errno name, syscall, errno; message "EFBIG: File too large".
struct SysFailure {
  int err = 0;
  const char* syscall = "";
};

Napi::Error SysError(Napi::Env env, const SysFailure& f) {
  const char* name = strerrorname_np(f.err);
  std::string code = name ? name : "EIO";
  Napi::Error e = Napi::Error::New(env, code + ": " + std::strerror(f.err));
  e.Set("code", Napi::String::New(env, code));
  e.Set("syscall", Napi::String::New(env, f.syscall));
  e.Set("errno", Napi::Number::New(env, -f.err));
  return e;
}

// One operation, created on the JS thread, executed on the writer's thread, settled back on the
// JS thread (DeliverJs). Its napi handles are only touched on the JS thread.
struct Job {
  enum Kind { kWrite, kSync, kClose };
  Job(Napi::Env env, std::shared_ptr<FileState> s, Kind k)
      : kind(k), st(std::move(s)), deferred(Napi::Promise::Deferred::New(env)) {}
  Kind kind;
  std::shared_ptr<FileState> st;
  Napi::Promise::Deferred deferred;
  Napi::Reference<Napi::Uint8Array> dataRef;  // keeps the bytes alive while the thread reads them
  const uint8_t* ptr = nullptr;
  uint64_t len = 0;
  bool zip = false;
  uint32_t zipCrc = 0;
  bool syncFirst = false;  // kClose: fsync before close
  SysFailure fail;
  bool shortWrite = false;
};

void DeliverJs(Napi::Env env, Napi::Function, std::nullptr_t*, Job* job);
using Tsfn = Napi::TypedThreadSafeFunction<std::nullptr_t, Job, DeliverJs>;

}  // namespace

struct FileState {
  std::string path;
  // The writer's thread uses it during an operation, the JS thread otherwise (abandon); atomic so
  // the `closed` accessor may read it while an operation runs.
  std::atomic<int> fd{-1};
  std::atomic<uint64_t> offset{0};    // bytes written
  std::atomic<uint32_t> crc32c{0};    // of every byte written
  uint64_t blockBytes = 0;            // checksum-then-write granularity
  uint64_t writebackBytes = 0;        // early-writeback step; 0: off
  uint64_t kickedTo = 0;              // writer's thread: writeback started for [0, kickedTo)
  bool busy = false;                  // JS thread: an operation is queued or running
  Tsfn tsfn;                          // settles operations on the JS thread
  std::thread thread;                 // the writer's thread; joined by the tsfn's finalizer
  std::mutex mu;
  std::condition_variable cv;
  Job* next = nullptr;                // guarded by mu: the operation handed to the thread
  bool quit = false;                  // guarded by mu: the thread exits once idle
  bool tsfnGone = false;              // guarded by mu: the tsfn is being finalized; never touch it again
  ~FileState() {
    int f = fd.exchange(-1);
    if (f >= 0) ::close(f);
  }
};

namespace {

void WriteAll(FileState& s, Job& j) {
  const int fd = s.fd.load(std::memory_order_relaxed);
  const uint8_t* p = j.ptr;
  uint64_t left = j.len;
  uint32_t crc = s.crc32c.load(std::memory_order_relaxed);
  uint64_t off = s.offset.load(std::memory_order_relaxed);
  while (left > 0 && j.fail.err == 0 && !j.shortWrite) {
    size_t n = static_cast<size_t>(left < s.blockBytes ? left : s.blockBytes);
    CrcPair(&crc, j.zip ? &j.zipCrc : nullptr, p, n);
    size_t done = 0;
    while (done < n) {
      ssize_t w = ::write(fd, p + done, n - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        j.fail = {errno, "write"};
        break;
      }
      if (w == 0) {
        j.shortWrite = true;
        break;
      }
      done += static_cast<size_t>(w);
      off += static_cast<uint64_t>(w);
      s.offset.store(off, std::memory_order_relaxed);
    }
    // Whole pages only: the partial last page is still being appended to.
    const uint64_t upTo = off & ~static_cast<uint64_t>(4095);
    if (s.writebackBytes != 0 && upTo - s.kickedTo >= s.writebackBytes) {
      // A hint only (no waiting; unsupported filesystems just refuse it): the final fsync still
      // waits for every page and reports any writeback error.
      (void)::sync_file_range(fd, static_cast<off64_t>(s.kickedTo), static_cast<off64_t>(upTo - s.kickedTo), SYNC_FILE_RANGE_WRITE);
      s.kickedTo = upTo;
    }
    p += n;
    left -= n;
  }
  s.crc32c.store(crc, std::memory_order_relaxed);
}

void Execute(FileState& s, Job& j) {
  switch (j.kind) {
    case Job::kWrite:
      WriteAll(s, j);
      break;
    case Job::kSync:
      if (::fsync(s.fd.load()) != 0) j.fail = {errno, "fsync"};
      break;
    case Job::kClose: {
      int fd = s.fd.load();
      if (j.syncFirst && ::fsync(fd) != 0) j.fail = {errno, "fsync"};
      s.fd.store(-1);  // even on error: the descriptor is gone either way (close(2) on Linux)
      if (::close(fd) != 0 && j.fail.err == 0) j.fail = {errno, "close"};
      break;
    }
  }
}

// The tsfn is only used under st->mu and only while !tsfnGone: the finalizer (JS thread, also at
// environment teardown) sets tsfnGone under the same lock and then joins this thread, so the
// thread never touches a deleted tsfn nor JS memory after teardown.
void RunThread(FileState* st) {
  bool released = false;
  for (;;) {
    Job* job = nullptr;
    {
      std::unique_lock<std::mutex> lk(st->mu);
      st->cv.wait(lk, [&] { return st->next != nullptr || st->quit; });
      if (st->next == nullptr) break;
      job = st->next;
      st->next = nullptr;
    }
    Execute(*st, *job);
    const bool last = job->kind == Job::kClose;
    {
      std::lock_guard<std::mutex> lk(st->mu);
      // Not delivered only while the environment is torn down: nobody awaits the job then, and it
      // is leaked (its napi handles must not be released off the JS thread).
      if (st->tsfnGone || st->tsfn.BlockingCall(job) == napi_closing) released = true;  // napi_closing released our count
    }
    if (last || released) break;
  }
  std::lock_guard<std::mutex> lk(st->mu);
  if (!st->tsfnGone && !released) st->tsfn.Release();
}

void FinalizeTsfn(Napi::Env, std::shared_ptr<FileState>* sp, std::nullptr_t*) {
  FileState& st = **sp;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    st.tsfnGone = true;
    st.quit = true;
  }
  st.cv.notify_one();
  if (st.thread.joinable()) st.thread.join();  // at teardown: waits for a write in progress
  delete sp;
}

void DeliverJs(Napi::Env env, Napi::Function, std::nullptr_t*, Job* job) {
  if (env == nullptr) return;  // environment gone
  FileState& s = *job->st;
  s.busy = false;
  try {
    s.tsfn.Unref(env);  // an idle writer does not keep the process alive
    if (!job->dataRef.IsEmpty()) job->dataRef.Reset();
    if (job->fail.err != 0) {
      job->deferred.Reject(SysError(env, job->fail).Value());
    } else if (job->shortWrite) {
      job->deferred.Reject(CodedError(env, "ERR_SHORT_WRITE", "write returned 0 bytes").Value());
    } else if (job->kind == Job::kWrite && job->zip) {
      job->deferred.Resolve(Napi::Number::New(env, job->zipCrc));
    } else {
      job->deferred.Resolve(env.Undefined());
    }
  } catch (const Napi::Error&) {
    // JS cannot run any more (a worker being terminated): nobody can observe this result, and
    // rethrowing from here would abort the process.
  }
  delete job;
}

}  // namespace

Napi::Function FileWriter::Define(Napi::Env env) {
  return DefineClass(env, "FileWriter",
                     {
                         InstanceMethod<&FileWriter::Write>("write"),
                         InstanceMethod<&FileWriter::Sync>("sync"),
                         InstanceMethod<&FileWriter::Close>("close"),
                         InstanceMethod<&FileWriter::Abandon>("abandon"),
                         InstanceAccessor<&FileWriter::GetOffset>("offset"),
                         InstanceAccessor<&FileWriter::GetCrc32c>("crc32c"),
                         InstanceAccessor<&FileWriter::GetClosed>("closed"),
                         InstanceAccessor<&FileWriter::GetBusy>("busy"),
                     });
}

FileWriter::FileWriter(const Napi::CallbackInfo& info) : Napi::ObjectWrap<FileWriter>(info) {
  Napi::Env env = info.Env();
  std::string path = ArgString(info, 0, "path");
  uint64_t mode = ArgU64(info, 1, "mode");
  uint64_t block = ArgU64(info, 2, "blockBytes");
  uint64_t writeback = info.Length() > 3 && !info[3].IsUndefined() ? ArgU64(info, 3, "writebackBytes") : 0;
  if (mode > 07777) ThrowCoded(env, "ERR_INVALID_ARG", "mode must be at most 0o7777");
  if (block < 4096 || block > (1ull << 30)) ThrowCoded(env, "ERR_INVALID_ARG", "blockBytes must be in 4096..2^30");
  if (writeback != 0 && (writeback < 65536 || writeback > (1ull << 40))) {
    ThrowCoded(env, "ERR_INVALID_ARG", "writebackBytes must be 0 (off) or in 65536..2^40");
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) throw SysError(env, SysFailure{errno, "open"});
  // Our group, never one inherited from a setgid directory (docs/security.md): the mode alone
  // would otherwise let that group read the dump.
  struct stat created;
  if (::fstat(fd, &created) != 0 || (created.st_gid != ::getegid() && ::fchown(fd, static_cast<uid_t>(-1), ::getegid()) != 0)) {
    int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    throw SysError(env, SysFailure{err, "fchown"});
  }
  auto st = std::make_shared<FileState>();
  st->path = std::move(path);
  st->fd.store(fd);
  st->blockBytes = block;
  st->writebackBytes = writeback;
  st->tsfn = Tsfn::New(env, "wavebus:file", 0, 1, nullptr, FinalizeTsfn, new std::shared_ptr<FileState>(st));
  st->tsfn.Unref(env);
  try {
    std::lock_guard<std::mutex> lk(st->mu);  // the finalizer cannot run before `thread` is set
    st->thread = std::thread(RunThread, st.get());
  } catch (const std::system_error& e) {
    st->tsfn.Release();
    ThrowCoded(env, "ERR_THREAD", std::string("cannot start the writer thread for ") + st->path + ": " + e.what());
  }
  state_ = std::move(st);
}

FileWriter::~FileWriter() {
  // Collected without close(): let the thread finish what it has and exit; the descriptor closes
  // with the last reference to the state.
  if (!state_) return;
  std::lock_guard<std::mutex> lk(state_->mu);
  state_->quit = true;
  state_->cv.notify_one();
}

FileState& FileWriter::Ready(Napi::Env env, const char* op) {
  if (state_->fd.load() < 0) ThrowCoded(env, "ERR_CLOSED", std::string(op) + " " + state_->path + ": file already closed");
  if (state_->busy) ThrowCoded(env, "ERR_BUSY", std::string(op) + " " + state_->path + ": another operation is in flight");
  return *state_;
}

namespace {

Napi::Promise Submit(Napi::Env env, FileState& s, Job* job) {
  Napi::Promise p = job->deferred.Promise();
  s.busy = true;
  s.tsfn.Ref(env);
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.next = job;
  }
  s.cv.notify_one();
  return p;
}

}  // namespace

Napi::Value FileWriter::Write(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint8Array data = ArgBytes(info, 0, "data");
  bool zip = info.Length() > 1 && !info[1].IsUndefined();
  uint64_t zipPrev = zip ? ArgU64(info, 1, "zipPrev") : 0;
  if (zipPrev > 0xFFFFFFFFull) ThrowCoded(env, "ERR_INVALID_ARG", "zipPrev must be a 32-bit unsigned integer");
  FileState& s = Ready(env, "write");
  auto* job = new Job(env, state_, Job::kWrite);
  job->dataRef = Napi::Persistent(data);
  job->ptr = data.Data();
  job->len = data.ByteLength();
  job->zip = zip;
  job->zipCrc = static_cast<uint32_t>(zipPrev);
  return Submit(env, s, job);
}

Napi::Value FileWriter::Sync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  FileState& s = Ready(env, "fsync");
  return Submit(env, s, new Job(env, state_, Job::kSync));
}

Napi::Value FileWriter::Close(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  bool sync = ArgBool(info, 0, "fsync", false);
  FileState& s = Ready(env, "close");
  auto* job = new Job(env, state_, Job::kClose);
  job->syncFirst = sync;
  return Submit(env, s, job);
}

Napi::Value FileWriter::Abandon(const Napi::CallbackInfo& info) {
  if (state_->busy) ThrowCoded(info.Env(), "ERR_BUSY", "abandon " + state_->path + ": another operation is in flight");
  int fd = state_->fd.exchange(-1);
  if (fd >= 0) {
    ::close(fd);
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->quit = true;
    state_->cv.notify_one();
  }
  return info.Env().Undefined();
}

Napi::Value FileWriter::GetOffset(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(state_->offset.load()));
}
Napi::Value FileWriter::GetCrc32c(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), state_->crc32c.load()); }
Napi::Value FileWriter::GetClosed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), state_->fd.load() < 0); }
Napi::Value FileWriter::GetBusy(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), state_->busy); }

}  // namespace wavebus
