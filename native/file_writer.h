// FileWriter: a new file written strictly sequentially, off the JS thread. Each writer owns one
// thread of its own (not the libuv pool, which copies into staging and other fs work keep busy:
// a write queued behind them would wait for all of them). The thread walks each write's bytes in
// cache-sized blocks: checksums a block (CRC-32C of the file, plus the zip CRC-32 of a .pt record
// when asked, in one pass: crc_pair.h) and hands the same, still cache-hot block to write(2). So
// every byte is read once from memory and the JS thread is free while the kernel copies.
//
// Early writeback: every `writebackBytes` written, sync_file_range(SYNC_FILE_RANGE_WRITE) asks the
// kernel to start sending those pages to the device now, so the device works while later bytes are
// still being written and the final fsync only waits for the tail (and the cache flush). It is a
// hint: it never waits for the I/O, and errors are left to fsync, which reports them.
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
  // JS: new FileWriter(path, mode, blockBytes, writebackBytes = 0): opens
  // O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC and starts the writer's thread. writebackBytes 0: no early
  // writeback.
  explicit FileWriter(const Napi::CallbackInfo& info);
  ~FileWriter() override;

 private:
  // write(data, zipPrev?) -> Promise<number | undefined>: the zip CRC-32 continued over data when zipPrev is given.
  Napi::Value Write(const Napi::CallbackInfo& info);
  // sync() -> Promise<void>: fsync.
  Napi::Value Sync(const Napi::CallbackInfo& info);
  // close(fsync = false) -> Promise<void>: fsync first when asked (on the writer's thread, right
  // after the last write), then close(2); later calls throw ERR_CLOSED. The descriptor is closed
  // even when the fsync fails; the promise then rejects with the fsync error.
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
