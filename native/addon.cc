// Module entry: registers every native class and function. Each class lives in its own file pair.
#include <napi.h>

#include "addon_data.h"
#include "crc32c.h"
#include "crc_pair.h"
#include "cuda_backend.h"
#include "cuda_region.h"
#include "detector_pass.h"
#include "file_writer.h"
#include "host_memory.h"
#include "mailbox.h"
#include "mailbox_reader.h"
#include "mailbox_writer.h"
#include "malloc_tuning.h"
#include "mapped_file.h"
#include "shm_segment.h"

using namespace wavebus;

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  auto* data = new AddonData();
  env.SetInstanceData<AddonData>(data);

  Napi::Function shm = ShmSegment::Define(env);
  data->shmSegment = Napi::Persistent(shm);
  exports.Set("ShmSegment", shm);

  Napi::Function cuda = CudaRegion::Define(env);
  data->cudaRegion = Napi::Persistent(cuda);
  exports.Set("CudaRegion", cuda);

  Napi::Function writer = MailboxWriter::Define(env);
  data->mailboxWriter = Napi::Persistent(writer);
  exports.Set("MailboxWriter", writer);

  Napi::Function reader = MailboxReader::Define(env);
  data->mailboxReader = Napi::Persistent(reader);
  exports.Set("MailboxReader", reader);

  exports.Set("FileWriter", FileWriter::Define(env));

  exports.Set("abiVersion", Napi::Number::New(env, 1));
  RegisterCrc32c(env, exports);
  RegisterDetectorPass(env, exports);
  RegisterMallocTuning(env, exports);
  RegisterCrcPair(env, exports);
  RegisterCudaBackend(env, exports);
  RegisterHostMemory(env, exports);
  RegisterMailboxLayout(env, exports);
  RegisterMappedFile(env, exports);
  return exports;
}

NODE_API_MODULE(wavebus_native, Init)
