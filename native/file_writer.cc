#include "file_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "coded_error.h"
#include "crc_pair.h"

namespace wavebus {

struct FileState {
  std::string path;
  int fd = -1;
  uint64_t offset = 0;       // bytes written
  uint32_t crc32c = 0;       // of every byte written
  uint64_t blockBytes = 0;   // checksum-then-write granularity
  bool busy = false;         // an operation is queued or running (set and cleared on the JS thread)
  ~FileState() {
    if (fd >= 0) ::close(fd);
  }
};

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

class FileOp : public Napi::AsyncWorker {
 public:
  enum Kind { kWrite, kSync, kClose };

  FileOp(Napi::Env env, std::shared_ptr<FileState> st, Kind kind)
      : Napi::AsyncWorker(env, "wavebus:file"), st_(std::move(st)), kind_(kind), deferred_(Napi::Promise::Deferred::New(env)) {}

  void SetData(Napi::Uint8Array data, bool zip, uint32_t zipPrev) {
    dataRef_ = Napi::Persistent(data);
    ptr_ = data.Data();
    len_ = data.ByteLength();
    zip_ = zip;
    zipCrc_ = zipPrev;
  }

  Napi::Promise Promise() { return deferred_.Promise(); }

 protected:
  void Execute() override {
    FileState& s = *st_;
    if (kind_ == kSync) {
      if (::fsync(s.fd) != 0) fail_ = {errno, "fsync"};
    } else if (kind_ == kClose) {
      int fd = s.fd;
      s.fd = -1;  // even on error: the descriptor is gone either way (close(2) on Linux)
      if (::close(fd) != 0) fail_ = {errno, "close"};
    } else {
      WriteAll();
    }
  }

  void OnOK() override {
    Napi::Env env = Env();
    st_->busy = false;
    if (!dataRef_.IsEmpty()) dataRef_.Reset();
    if (fail_.err != 0) {
      deferred_.Reject(SysError(env, fail_).Value());
    } else if (short_) {
      deferred_.Reject(CodedError(env, "ERR_SHORT_WRITE", "write returned 0 bytes").Value());
    } else if (kind_ == kWrite && zip_) {
      deferred_.Resolve(Napi::Number::New(env, zipCrc_));
    } else {
      deferred_.Resolve(env.Undefined());
    }
  }

 private:
  void WriteAll() {
    FileState& s = *st_;
    const uint8_t* p = ptr_;
    uint64_t left = len_;
    while (left > 0) {
      size_t n = static_cast<size_t>(left < s.blockBytes ? left : s.blockBytes);
      CrcPair(&s.crc32c, zip_ ? &zipCrc_ : nullptr, p, n);
      size_t done = 0;
      while (done < n) {
        ssize_t w = ::write(s.fd, p + done, n - done);
        if (w < 0) {
          if (errno == EINTR) continue;
          fail_ = {errno, "write"};
          return;
        }
        if (w == 0) {
          short_ = true;
          return;
        }
        done += static_cast<size_t>(w);
        s.offset += static_cast<uint64_t>(w);
      }
      p += n;
      left -= n;
    }
  }

  std::shared_ptr<FileState> st_;
  Kind kind_;
  Napi::Promise::Deferred deferred_;
  Napi::Reference<Napi::Uint8Array> dataRef_;
  const uint8_t* ptr_ = nullptr;
  uint64_t len_ = 0;
  bool zip_ = false;
  uint32_t zipCrc_ = 0;
  SysFailure fail_;
  bool short_ = false;
};

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
  if (mode > 07777) ThrowCoded(env, "ERR_INVALID_ARG", "mode must be at most 0o7777");
  if (block < 4096 || block > (1ull << 30)) ThrowCoded(env, "ERR_INVALID_ARG", "blockBytes must be in 4096..2^30");
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) throw SysError(env, SysFailure{errno, "open"});
  state_ = std::make_shared<FileState>();
  state_->path = std::move(path);
  state_->fd = fd;
  state_->blockBytes = block;
}

FileState& FileWriter::Ready(Napi::Env env, const char* op) {
  if (state_->fd < 0) ThrowCoded(env, "ERR_CLOSED", std::string(op) + " " + state_->path + ": file already closed");
  if (state_->busy) ThrowCoded(env, "ERR_BUSY", std::string(op) + " " + state_->path + ": another operation is in flight");
  return *state_;
}

Napi::Value FileWriter::Write(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint8Array data = ArgBytes(info, 0, "data");
  bool zip = info.Length() > 1 && !info[1].IsUndefined();
  uint64_t zipPrev = zip ? ArgU64(info, 1, "zipPrev") : 0;
  if (zipPrev > 0xFFFFFFFFull) ThrowCoded(env, "ERR_INVALID_ARG", "zipPrev must be a 32-bit unsigned integer");
  FileState& s = Ready(env, "write");
  auto* op = new FileOp(env, state_, FileOp::kWrite);
  op->SetData(data, zip, static_cast<uint32_t>(zipPrev));
  Napi::Promise p = op->Promise();
  s.busy = true;
  op->Queue();
  return p;
}

Napi::Value FileWriter::Sync(const Napi::CallbackInfo& info) {
  FileState& s = Ready(info.Env(), "fsync");
  auto* op = new FileOp(info.Env(), state_, FileOp::kSync);
  Napi::Promise p = op->Promise();
  s.busy = true;
  op->Queue();
  return p;
}

Napi::Value FileWriter::Close(const Napi::CallbackInfo& info) {
  FileState& s = Ready(info.Env(), "close");
  auto* op = new FileOp(info.Env(), state_, FileOp::kClose);
  Napi::Promise p = op->Promise();
  s.busy = true;
  op->Queue();
  return p;
}

Napi::Value FileWriter::Abandon(const Napi::CallbackInfo& info) {
  if (state_->busy) ThrowCoded(info.Env(), "ERR_BUSY", "abandon " + state_->path + ": another operation is in flight");
  if (state_->fd >= 0) {
    ::close(state_->fd);
    state_->fd = -1;
  }
  return info.Env().Undefined();
}

Napi::Value FileWriter::GetOffset(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(state_->offset));
}
Napi::Value FileWriter::GetCrc32c(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), state_->crc32c); }
Napi::Value FileWriter::GetClosed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), state_->fd < 0); }
Napi::Value FileWriter::GetBusy(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), state_->busy); }

}  // namespace wavebus
