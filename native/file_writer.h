// FileWriter: a new file written strictly sequentially, off the JS thread. Each write() runs on a
// libuv worker that walks the bytes in cache-sized blocks: checksums a block (CRC-32C of the file,
// plus the zip CRC-32 of a .pt record when asked, in one pass: crc_pair.h) and hands the same,
// still cache-hot block to write(2). So every byte is read once from memory and the JS thread is
// free while the kernel copies.
//
// One operation at a time per file (the caller awaits each; a second one is refused with
// ERR_BUSY). Errors carry `code` = the errno name (EFBIG, ENOSPC, ...) and `syscall`, like
// Node's fs errors; misuse carries ERR_BUSY / ERR_CLOSED / ERR_INVALID_ARG.
#pragma once
#include <napi.h>

#include <memory>
#include <string>

namespace wavebus {

struct FileState;

class FileWriter : public Napi::ObjectWrap<FileWriter> {
 public:
  static Napi::Function Define(Napi::Env env);
  // JS: new FileWriter(path, mode, blockBytes): opens O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC.
  explicit FileWriter(const Napi::CallbackInfo& info);

 private:
  // write(data, zipPrev?) -> Promise<number | undefined>: the zip CRC-32 continued over data when zipPrev is given.
  Napi::Value Write(const Napi::CallbackInfo& info);
  // sync() -> Promise<void>: fsync.
  Napi::Value Sync(const Napi::CallbackInfo& info);
  // close() -> Promise<void>: close(2); later calls throw ERR_CLOSED.
  Napi::Value Close(const Napi::CallbackInfo& info);
  // abandon(): close the descriptor now without waiting (failure paths). Idempotent; refused while busy.
  Napi::Value Abandon(const Napi::CallbackInfo& info);
  Napi::Value GetOffset(const Napi::CallbackInfo& info);
  Napi::Value GetCrc32c(const Napi::CallbackInfo& info);
  Napi::Value GetClosed(const Napi::CallbackInfo& info);
  Napi::Value GetBusy(const Napi::CallbackInfo& info);

  FileState& Ready(Napi::Env env, const char* op);

  std::shared_ptr<FileState> state_;
};

}  // namespace wavebus
