#include "shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "addon_data.h"
#include "copy_worker.h"

namespace wavebus {

namespace {

// shm_open names: one leading "/", then 1..200 of [A-Za-z0-9._-] (TypeScript checks the same).
std::string NormalizeName(Napi::Env env, const std::string& raw) {
  std::string n = raw.size() > 0 && raw[0] == '/' ? raw : "/" + raw;
  if (n.size() < 2 || n.size() > 201 || n == "/." || n == "/..") {
    ThrowCoded(env, "ERR_INVALID_ARG", "shm name must be 1..200 characters: " + raw);
  }
  for (size_t i = 1; i < n.size(); i++) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) ThrowCoded(env, "ERR_INVALID_ARG", "shm name may hold only [A-Za-z0-9._-]: " + raw);
  }
  return n;
}

}  // namespace

ShmMapping::ShmMapping(std::string name, int fd, uint8_t* addr, uint64_t len, bool writable)
    : name_(std::move(name)), fd_(fd), addr_(addr), len_(len), writable_(writable) {}

ShmMapping::~ShmMapping() {
  if (addr_ != nullptr) munmap(addr_, len_);
  if (fd_ >= 0) close(fd_);
}

Status ShmMapping::Stat(uint64_t* size, bool* linked) const {
  struct stat st;
  if (fstat(fd_, &st) != 0) return Status::Fail("ERR_REGION_GONE", ErrnoText("fstat(" + name_ + ")", errno));
  *size = static_cast<uint64_t>(st.st_size);
  *linked = st.st_nlink > 0;
  return Status::Ok();
}

Status ShmMapping::Read(const std::vector<Span>& spans, uint8_t* dst) {
  // Touching a page past the object's current end raises SIGBUS, so check the object as it is
  // now. An unlinked segment is treated as gone too: its owner has let go of it, and a new
  // segment under the same name is not the memory this mapping shows.
  uint64_t end = 0;
  for (const Span& s : spans) end = std::max(end, s.src + s.len);
  uint64_t size = 0;
  bool linked = false;
  Status st = Stat(&size, &linked);
  if (!st.ok()) return st;
  if (!linked) return Status::Fail("ERR_REGION_GONE", "shm segment " + name_ + " was unlinked; its owner released it");
  if (size < end) {
    return Status::Fail("ERR_REGION_GONE", "shm segment " + name_ + " shrank to " + std::to_string(size) +
                                               " bytes; the copy reads up to byte " + std::to_string(end));
  }
  for (const Span& s : spans) {
    std::memcpy(dst, addr_ + s.src, s.len);
    dst += s.len;
  }
  return Status::Ok();
}

Napi::Function ShmSegment::Define(Napi::Env env) {
  return DefineClass(env, "ShmSegment",
                     {
                         StaticMethod<&ShmSegment::Create>("create"),
                         StaticMethod<&ShmSegment::Open>("open"),
                         StaticMethod<&ShmSegment::Unlink>("unlink"),
                         InstanceAccessor<&ShmSegment::GetSize>("size"),
                         InstanceAccessor<&ShmSegment::GetName>("name"),
                         InstanceAccessor<&ShmSegment::GetReadonly>("readonly"),
                         InstanceAccessor<&ShmSegment::GetClosed>("closed"),
                         InstanceMethod<&ShmSegment::Buffer>("buffer"),
                         InstanceMethod<&ShmSegment::Stat>("stat"),
                         InstanceMethod<&ShmSegment::CopyTo>("copyTo"),
                         InstanceMethod<&ShmSegment::GatherTo>("gatherTo"),
                         InstanceMethod<&ShmSegment::Close>("close"),
                     });
}

ShmSegment::ShmSegment(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ShmSegment>(info) {
  if (info.Length() != 1 || !info[0].IsExternal()) {
    ThrowCoded(info.Env(), "ERR_INVALID_ARG", "use ShmSegment.create() or ShmSegment.open()");
  }
  mapping_ = *info[0].As<Napi::External<std::shared_ptr<ShmMapping>>>().Data();
  name_ = mapping_->name();
  size_ = mapping_->Size();
  readonly_ = !mapping_->writable();
}

Napi::Value ShmSegment::Wrap(Napi::Env env, std::shared_ptr<ShmMapping> mapping) {
  auto ext = Napi::External<std::shared_ptr<ShmMapping>>::New(env, &mapping);
  return GetAddonData(env)->shmSegment.New({ext});
}

Napi::Value ShmSegment::Create(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string name = NormalizeName(env, ArgString(info, 0, "name"));
  uint64_t nbytes = ArgU64(info, 1, "nbytes");
  if (nbytes == 0) ThrowCoded(env, "ERR_INVALID_ARG", "nbytes must be positive");
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) ThrowCoded(env, "ERR_SHM_OPEN", ErrnoText("shm_open(" + name + ", O_CREAT|O_EXCL)", errno));
  if (ftruncate(fd, static_cast<off_t>(nbytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    ThrowCoded(env, "ERR_SHM_OPEN", ErrnoText("ftruncate(" + name + ", " + std::to_string(nbytes) + ")", err));
  }
  void* addr = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    ThrowCoded(env, "ERR_SHM_MAP", ErrnoText("mmap(" + name + ")", err));
  }
  return Wrap(env, std::make_shared<ShmMapping>(name, fd, static_cast<uint8_t*>(addr), nbytes, true));
}

Napi::Value ShmSegment::Open(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string name = NormalizeName(env, ArgString(info, 0, "name"));
  bool readonly = ArgBool(info, 1, "readonly", true);
  int fd = shm_open(name.c_str(), (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC, 0);
  if (fd < 0) ThrowCoded(env, "ERR_SHM_OPEN", ErrnoText("shm_open(" + name + ")", errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    ThrowCoded(env, "ERR_SHM_OPEN", ErrnoText("fstat(" + name + ")", err));
  }
  if (st.st_size <= 0) {
    close(fd);
    ThrowCoded(env, "ERR_SHM_OPEN", "shm segment " + name + " is empty (size 0); its creator has not sized it yet");
  }
  uint64_t len = static_cast<uint64_t>(st.st_size);
  void* addr = mmap(nullptr, len, readonly ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    int err = errno;
    close(fd);
    ThrowCoded(env, "ERR_SHM_MAP", ErrnoText("mmap(" + name + ")", err));
  }
  return Wrap(env, std::make_shared<ShmMapping>(name, fd, static_cast<uint8_t*>(addr), len, !readonly));
}

Napi::Value ShmSegment::Unlink(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string name = NormalizeName(env, ArgString(info, 0, "name"));
  if (shm_unlink(name.c_str()) != 0) ThrowCoded(env, "ERR_SHM_UNLINK", ErrnoText("shm_unlink(" + name + ")", errno));
  return env.Undefined();
}

const std::shared_ptr<ShmMapping>& ShmSegment::Live(Napi::Env env) {
  if (!mapping_) ThrowCoded(env, "ERR_CLOSED", "shm segment " + name_ + " is closed");
  return mapping_;
}

Napi::Value ShmSegment::GetSize(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), static_cast<double>(size_)); }
Napi::Value ShmSegment::GetName(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), name_); }
Napi::Value ShmSegment::GetReadonly(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), readonly_); }
Napi::Value ShmSegment::GetClosed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), !mapping_); }

Napi::Value ShmSegment::Buffer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::shared_ptr<ShmMapping>& m = Live(env);
  // A JS write into a PROT_READ mapping would be a segfault, so read-only opens get no Buffer.
  if (!m->writable()) ThrowCoded(env, "ERR_READONLY", "shm segment " + name_ + " is open read-only; it has no writable Buffer");
  if (!buffer_.IsEmpty()) return buffer_.Value();
  auto* hold = new std::shared_ptr<ShmMapping>(m);
  Napi::Buffer<uint8_t> buf = Napi::Buffer<uint8_t>::New(
      env, m->addr(), static_cast<size_t>(m->Size()),
      [](Napi::Env, uint8_t*, std::shared_ptr<ShmMapping>* h) { delete h; }, hold);
  buffer_ = Napi::Persistent(buf);
  return buf;
}

Napi::Value ShmSegment::Stat(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint64_t size = 0;
  bool linked = false;
  Status st = Live(env)->Stat(&size, &linked);
  if (!st.ok()) ThrowCoded(env, st.code, st.message);
  Napi::Object o = Napi::Object::New(env);
  o.Set("size", Napi::Number::New(env, static_cast<double>(size)));
  o.Set("linked", Napi::Boolean::New(env, linked));
  return o;
}

Napi::Value ShmSegment::CopyTo(const Napi::CallbackInfo& info) { return StartCopyTo(info, Live(info.Env())); }
Napi::Value ShmSegment::GatherTo(const Napi::CallbackInfo& info) { return StartGatherTo(info, Live(info.Env())); }

Napi::Value ShmSegment::Close(const Napi::CallbackInfo& info) {
  buffer_.Reset();
  mapping_.reset();
  return info.Env().Undefined();
}

}  // namespace wavebus
