#include "mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "coded_error.h"

namespace wavebus {

namespace {

struct Mapping {
  void* addr;
  size_t len;
};

Napi::Value JsMapFile(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = ArgString(info, 0, "path");
  int fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    ThrowCoded(env, err == ELOOP ? "ERR_PATH_LINK" : "ERR_MAP_FILE", ErrnoText("open(" + path + ", O_NOFOLLOW)", err));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    ThrowCoded(env, "ERR_MAP_FILE", ErrnoText("fstat(" + path + ")", err));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    ThrowCoded(env, "ERR_NOT_REGULAR", path + " is not a regular file");
  }
  if (st.st_size <= 0) {
    close(fd);
    ThrowCoded(env, "ERR_MAP_FILE", path + " is empty: nothing to map");
  }
  size_t len = static_cast<size_t>(st.st_size);
  void* addr = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);  // the mapping keeps the file
  if (addr == MAP_FAILED) ThrowCoded(env, "ERR_MAP_FILE", ErrnoText("mmap(" + path + ")", err));
  auto* hold = new Mapping{addr, len};
  return Napi::Buffer<uint8_t>::New(
      env, static_cast<uint8_t*>(addr), len,
      [](Napi::Env, uint8_t*, Mapping* m) {
        munmap(m->addr, m->len);
        delete m;
      },
      hold);
}

}  // namespace

void RegisterMappedFile(Napi::Env env, Napi::Object exports) {
  exports.Set("mapFile", Napi::Function::New(env, JsMapFile, "mapFile"));
}

}  // namespace wavebus
