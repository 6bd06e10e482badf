/* A TEST DOUBLE of the CUDA runtime (libcudart), loaded through WAVEBUS_CUDART.
 *
 * It proves wavebus's logic against the CUDA runtime's *contract* (signatures, error codes,
 * stream ordering, IPC handle lifetime, pinned memory ownership). It proves nothing about GPUs,
 * drivers, DMA engines or bandwidth: scripts/gpu-check.sh does that on real hardware.
 *
 * Model:
 *  - "Device memory" (cudaMalloc) is a POSIX shm segment; a cudaIpcMemHandle_t is a 64-byte blob
 *    naming the segment, the offset of the allocation in it, its size and the owner's pid and
 *    start time. cudaIpcOpenMemHandle maps the segment; a handle whose owner has exited is refused.
 *  - Every created stream has a thread of its own. cudaMemcpyAsync into pinned memory poisons the
 *    destination at once and lands the real bytes later on that thread, so a destination read
 *    before cudaStreamSynchronize shows poison, never the data.
 *  - Ordering violations are recorded (never silently tolerated): freeing pinned memory or closing
 *    an IPC mapping while an unsynchronised copy touches it, a copy racing an unsynchronised copy
 *    of another stream on the same destination, a copy out of an allocation's bounds, copies never
 *    synchronised when their stream is destroyed or the process exits.
 *  - Pinned host memory (cudaHostAlloc) is tracked; whatever is still allocated at exit (pinned
 *    memory, IPC mappings, streams, device allocations) is reported as a leak.
 *  - At exit a JSON report goes to $WAVEBUS_CUDA_DOUBLE_REPORT/<pid>.json when that is set.
 *
 * Faults, by environment:
 *  WAVEBUS_CUDA_DOUBLE_FAIL_COPY=N        the Nth cudaMemcpyAsync of this process fails
 *  WAVEBUS_CUDA_DOUBLE_FAIL_AT=sync|enqueue   reported by cudaStreamSynchronize (default) or returned at once
 *  WAVEBUS_CUDA_DOUBLE_FAIL_ERROR=code    the cudaError_t to fail with (default 999, cudaErrorUnknown)
 *  WAVEBUS_CUDA_DOUBLE_INVALID_HANDLE=1   cudaIpcOpenMemHandle refuses every handle (invalid resource handle)
 *  WAVEBUS_CUDA_DOUBLE_OWNER_EXITED=1     cudaIpcOpenMemHandle treats every owner as exited
 *  WAVEBUS_CUDA_DOUBLE_SLOW_COPY_US=n     each async copy takes n more microseconds to land
 *  WAVEBUS_CUDA_DOUBLE_DEVICE_COUNT=n     devices reported (default 1; 0 gives cudaErrorNoDevice)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int cudaError_t;
typedef struct { char reserved[64]; } cudaIpcMemHandle_t;
typedef void* cudaStream_t;

enum {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorMapBufferObjectFailed = 205,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorUnknown = 999,
};
enum { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };

#define POISON 0xDB
#define MAGIC "WBCUDBL1"
#define MAX_EVENTS 256

/* ------------------------------------------------------------------ bookkeeping */

typedef struct Alloc {
  struct Alloc* next;
  int kind; /* 1 device (cudaMalloc), 2 pinned host, 3 opened IPC mapping */
  uint8_t* ptr;
  size_t size;
  char shm[24]; /* device / IPC: the segment (fits the handle) */
} Alloc;

typedef struct Copy {
  struct Copy* next;
  struct Stream* stream;
  uint8_t* dst;
  const uint8_t* src;
  size_t len;
  int landed;  /* the bytes are in dst */
  int fail;    /* the cudaError_t this copy reports at sync, 0 if none */
} Copy;

typedef struct Stream {
  struct Stream* next;
  pthread_t thread;
  pthread_cond_t cv;
  int quit;
  int error; /* first failed copy since the last sync */
} Stream;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t landed_cv = PTHREAD_COND_INITIALIZER;
static Alloc* allocs;
static Copy* copies; /* enqueued and not yet synchronised, oldest first */
static Stream* streams;
static unsigned long copy_count, alloc_seq;
static char* events[MAX_EVENTS];
static int nevents;
static int violations;
static __thread int current_device;

static long env_long(const char* name, long dflt) {
  const char* v = getenv(name);
  if (v == NULL || *v == '\0') return dflt;
  return strtol(v, NULL, 10);
}

/* Caller holds mu. */
static void record(const char* kind, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void record(const char* kind, const char* fmt, ...) {
  char msg[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (strcmp(kind, "violation") == 0) violations++;
  if (nevents < MAX_EVENTS) {
    size_t n = strlen(kind) + strlen(msg) + 4;
    events[nevents] = malloc(n);
    if (events[nevents] != NULL) snprintf(events[nevents++], n, "%s: %s", kind, msg);
  }
}

static Alloc* find_alloc(const void* p, size_t len, int kind) {
  for (Alloc* a = allocs; a != NULL; a = a->next) {
    if ((kind == 0 || a->kind == kind) && (const uint8_t*)p >= a->ptr && (const uint8_t*)p + len <= a->ptr + a->size) return a;
  }
  return NULL;
}

static Alloc* find_base(const void* p, int kind) {
  for (Alloc* a = allocs; a != NULL; a = a->next) {
    if (a->kind == kind && a->ptr == (const uint8_t*)p) return a;
  }
  return NULL;
}

static void unlink_alloc(Alloc* x) {
  for (Alloc** pp = &allocs; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == x) {
      *pp = x->next;
      return;
    }
  }
}

static int overlaps(const uint8_t* a, size_t alen, const uint8_t* b, size_t blen) { return a < b + blen && b < a + alen; }

/* Unsynchronised copies (caller holds mu) whose destination overlaps [p, p+len). */
static int pending_into(const uint8_t* p, size_t len) {
  int n = 0;
  for (Copy* c = copies; c != NULL; c = c->next) n += overlaps(c->dst, c->len, p, len);
  return n;
}

static int pending_from(const uint8_t* p, size_t len) {
  int n = 0;
  for (Copy* c = copies; c != NULL; c = c->next) n += overlaps(c->src, c->len, p, len);
  return n;
}

/* ------------------------------------------------------------------ the stream thread */

static void* stream_main(void* arg) {
  Stream* s = arg;
  long slow = env_long("WAVEBUS_CUDA_DOUBLE_SLOW_COPY_US", 0);
  pthread_mutex_lock(&mu);
  for (;;) {
    Copy* next = NULL;
    for (Copy* c = copies; c != NULL; c = c->next) {
      if (c->stream == s && !c->landed) {
        next = c;
        break;
      }
    }
    if (next == NULL) {
      if (s->quit) break;
      pthread_cond_wait(&s->cv, &mu);
      continue;
    }
    pthread_mutex_unlock(&mu);
    if (slow > 0) usleep((useconds_t)slow);
    if (next->fail == 0) memcpy(next->dst, next->src, next->len);
    pthread_mutex_lock(&mu);
    if (next->fail != 0 && s->error == 0) s->error = next->fail;
    next->landed = 1;
    pthread_cond_broadcast(&landed_cv);
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

/* Wait (caller holds mu) until every copy of s has landed, then forget them: they are synchronised. */
static cudaError_t sync_stream_locked(Stream* s) {
  for (;;) {
    int busy = 0;
    for (Copy* c = copies; c != NULL; c = c->next) busy |= (c->stream == s && !c->landed);
    if (!busy) break;
    pthread_cond_wait(&landed_cv, &mu);
  }
  for (Copy** pp = &copies; *pp != NULL;) {
    Copy* c = *pp;
    if (c->stream == s) {
      *pp = c->next;
      free(c);
    } else {
      pp = &c->next;
    }
  }
  cudaError_t e = s->error;
  s->error = 0;
  return e;
}

static Stream* find_stream(void* p) {
  for (Stream* s = streams; s != NULL; s = s->next) {
    if ((void*)s == p) return s;
  }
  return NULL;
}

/* ------------------------------------------------------------------ devices and errors */

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorMapBufferObjectFailed: return "mapping of buffer object failed";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case 700: return "an illegal memory access was encountered";
    case 719: return "unspecified launch failure";
    case cudaErrorUnknown: return "unknown error";
    default: return "unrecognized error code";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == NULL) return cudaErrorInvalidValue;
  long n = env_long("WAVEBUS_CUDA_DOUBLE_DEVICE_COUNT", 1);
  *count = (int)(n < 0 ? 0 : n);
  return *count == 0 ? cudaErrorNoDevice : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return e;
  if (device < 0 || device >= n) return cudaErrorInvalidDevice;
  current_device = device;
  return cudaSuccess;
}

/* ------------------------------------------------------------------ device memory (the owner's side) */

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == NULL || size == 0) return cudaErrorInvalidValue;
  Alloc* a = calloc(1, sizeof *a);
  if (a == NULL) return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&mu);
  snprintf(a->shm, sizeof a->shm, "/wbcd-%d-%lu", (int)getpid(), ++alloc_seq);
  pthread_mutex_unlock(&mu);
  int fd = shm_open(a->shm, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    free(a);
    return cudaErrorMemoryAllocation;
  }
  if (ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    shm_unlink(a->shm);
    free(a);
    return cudaErrorMemoryAllocation;
  }
  void* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(a->shm);
    free(a);
    return cudaErrorMemoryAllocation;
  }
  a->kind = 1;
  a->ptr = p;
  a->size = size;
  pthread_mutex_lock(&mu);
  a->next = allocs;
  allocs = a;
  pthread_mutex_unlock(&mu);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == NULL) return cudaSuccess;
  pthread_mutex_lock(&mu);
  Alloc* a = find_base(ptr, 1);
  if (a == NULL) {
    pthread_mutex_unlock(&mu);
    return cudaErrorInvalidValue;
  }
  unlink_alloc(a);
  pthread_mutex_unlock(&mu);
  munmap(a->ptr, a->size);
  shm_unlink(a->shm);
  free(a);
  return cudaSuccess;
}

static unsigned long long start_time_of(int pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char* p = strrchr(buf, ')'); /* the command name may hold spaces */
  if (p == NULL) return 0;
  unsigned long long v = 0;
  /* field 22 (starttime); p points at the end of field 2 */
  int field = 2;
  for (char* tok = strtok(p + 1, " "); tok != NULL; tok = strtok(NULL, " ")) {
    if (++field == 22) {
      v = strtoull(tok, NULL, 10);
      break;
    }
  }
  return v;
}

/* Handle layout: magic[8] | pid u32 | pad u32 | start_time u64 | size u64 | offset u64 | shm name[24] */
struct HandleBlob {
  char magic[8];
  uint32_t pid;
  uint32_t pad;
  uint64_t start;
  uint64_t size;
  uint64_t offset;
  char shm[24];
};
_Static_assert(sizeof(struct HandleBlob) == 64, "cudaIpcMemHandle_t is 64 bytes");

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr) {
  if (handle == NULL) return cudaErrorInvalidValue;
  pthread_mutex_lock(&mu);
  Alloc* a = find_alloc(ptr, 1, 1);
  struct HandleBlob b;
  memset(&b, 0, sizeof b);
  if (a != NULL) {
    memcpy(b.magic, MAGIC, 8);
    b.pid = (uint32_t)getpid();
    b.start = start_time_of((int)getpid());
    b.size = a->size;
    b.offset = 0; /* the handle names the whole allocation, as CUDA's does */
    snprintf(b.shm, sizeof b.shm, "%s", a->shm);
  }
  pthread_mutex_unlock(&mu);
  if (a == NULL || strlen(a->shm) >= sizeof b.shm) return cudaErrorInvalidValue;
  memcpy(handle->reserved, &b, sizeof b);
  return cudaSuccess;
}

/* ------------------------------------------------------------------ IPC (the agent's side) */

cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  (void)flags;
  if (devPtr == NULL) return cudaErrorInvalidValue;
  struct HandleBlob b;
  memcpy(&b, handle.reserved, sizeof b);
  if (env_long("WAVEBUS_CUDA_DOUBLE_INVALID_HANDLE", 0) != 0) return cudaErrorInvalidResourceHandle;
  if (memcmp(b.magic, MAGIC, 8) != 0 || memchr(b.shm, '\0', sizeof b.shm) == NULL || b.size == 0) {
    return cudaErrorInvalidResourceHandle;
  }
  int dead = env_long("WAVEBUS_CUDA_DOUBLE_OWNER_EXITED", 0) != 0;
  if (!dead) {
    dead = kill((pid_t)b.pid, 0) != 0 && errno == ESRCH;
    if (!dead && start_time_of((int)b.pid) != b.start) dead = 1; /* the pid was reused */
  }
  if (dead) {
    /* CUDA frees an exited process's allocations; the double removes the orphaned segment. */
    shm_unlink(b.shm);
    return cudaErrorInvalidResourceHandle;
  }
  int fd = shm_open(b.shm, O_RDWR, 0);
  if (fd < 0) return cudaErrorInvalidResourceHandle;
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < b.offset + b.size) {
    close(fd);
    return cudaErrorMapBufferObjectFailed;
  }
  void* p = mmap(NULL, b.offset + b.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return cudaErrorMapBufferObjectFailed;
  Alloc* a = calloc(1, sizeof *a);
  if (a == NULL) return cudaErrorMemoryAllocation;
  a->kind = 3;
  a->ptr = (uint8_t*)p + b.offset;
  a->size = b.size;
  snprintf(a->shm, sizeof a->shm, "%s", b.shm);
  pthread_mutex_lock(&mu);
  a->next = allocs;
  allocs = a;
  pthread_mutex_unlock(&mu);
  *devPtr = a->ptr;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
  pthread_mutex_lock(&mu);
  Alloc* a = find_base(devPtr, 3);
  if (a == NULL) {
    pthread_mutex_unlock(&mu);
    return cudaErrorInvalidValue;
  }
  int n = pending_from(a->ptr, a->size);
  if (n > 0) record("violation", "cudaIpcCloseMemHandle(%s) while %d copies from it were never synchronised", a->shm, n);
  unlink_alloc(a);
  pthread_mutex_unlock(&mu);
  munmap(a->ptr, a->size);
  free(a);
  return cudaSuccess;
}

/* ------------------------------------------------------------------ pinned host memory */

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  (void)flags;
  if (ptr == NULL || size == 0) return cudaErrorInvalidValue;
  void* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return cudaErrorMemoryAllocation;
  Alloc* a = calloc(1, sizeof *a);
  if (a == NULL) {
    munmap(p, size);
    return cudaErrorMemoryAllocation;
  }
  a->kind = 2;
  a->ptr = p;
  a->size = size;
  pthread_mutex_lock(&mu);
  a->next = allocs;
  allocs = a;
  pthread_mutex_unlock(&mu);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == NULL) return cudaSuccess;
  pthread_mutex_lock(&mu);
  Alloc* a = find_base(ptr, 2);
  if (a == NULL) {
    pthread_mutex_unlock(&mu);
    return cudaErrorInvalidValue;
  }
  int n = pending_into(a->ptr, a->size);
  if (n > 0) record("violation", "cudaFreeHost(%p) while %d copies into it were never synchronised", ptr, n);
  unlink_alloc(a);
  pthread_mutex_unlock(&mu);
  munmap(a->ptr, a->size);
  free(a);
  return cudaSuccess;
}

/* ------------------------------------------------------------------ streams and copies */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* out, unsigned int flags) {
  (void)flags;
  if (out == NULL) return cudaErrorInvalidValue;
  Stream* s = calloc(1, sizeof *s);
  if (s == NULL) return cudaErrorMemoryAllocation;
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
    free(s);
    return cudaErrorMemoryAllocation;
  }
  pthread_mutex_lock(&mu);
  s->next = streams;
  streams = s;
  pthread_mutex_unlock(&mu);
  *out = s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  pthread_mutex_lock(&mu);
  Stream* s = find_stream(stream);
  cudaError_t e = s == NULL ? cudaErrorInvalidResourceHandle : sync_stream_locked(s);
  pthread_mutex_unlock(&mu);
  return e;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  pthread_mutex_lock(&mu);
  Stream* s = find_stream(stream);
  if (s == NULL) {
    pthread_mutex_unlock(&mu);
    return cudaErrorInvalidResourceHandle;
  }
  int n = 0;
  for (Copy* c = copies; c != NULL; c = c->next) n += c->stream == s;
  if (n > 0) record("violation", "cudaStreamDestroy with %d copies never synchronised", n);
  sync_stream_locked(s); /* CUDA lets queued work finish */
  for (Stream** pp = &streams; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  }
  s->quit = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&mu);
  pthread_join(s->thread, NULL);
  pthread_cond_destroy(&s->cv);
  free(s);
  return cudaSuccess;
}

static int is_device(const void* p, size_t len) { return find_alloc(p, len, 1) != NULL || find_alloc(p, len, 3) != NULL; }

static int device_base(const void* p) {
  for (Alloc* a = allocs; a != NULL; a = a->next) {
    if ((a->kind == 1 || a->kind == 3) && (const uint8_t*)p >= a->ptr && (const uint8_t*)p < a->ptr + a->size) return 1;
  }
  return 0;
}

/* Caller holds mu. Checks one copy against the allocations it names; 0 if it is valid. */
static cudaError_t check_copy(void* dst, const void* src, size_t count, int kind) {
  int srcDev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  int dstDev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (kind < 0 || kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
  if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost) return cudaSuccess;
  if (srcDev && !is_device(src, count)) {
    if (device_base(src)) record("violation", "copy of %zu bytes from %p runs past the end of its device allocation", count, src);
    return cudaErrorInvalidValue;
  }
  if (dstDev && !is_device(dst, count)) {
    if (device_base(dst)) record("violation", "copy of %zu bytes to %p runs past the end of its device allocation", count, dst);
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, int kind) {
  pthread_mutex_lock(&mu);
  cudaError_t e = check_copy(dst, src, count, kind);
  pthread_mutex_unlock(&mu);
  if (e != cudaSuccess) return e;
  memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, int kind, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  pthread_mutex_lock(&mu);
  unsigned long n = ++copy_count;
  cudaError_t e = check_copy(dst, src, count, kind);
  Stream* s = stream == NULL ? NULL : find_stream(stream);
  if (e == cudaSuccess && stream != NULL && s == NULL) e = cudaErrorInvalidResourceHandle;
  int fail = 0;
  if (e == cudaSuccess && (long)n == env_long("WAVEBUS_CUDA_DOUBLE_FAIL_COPY", 0)) {
    fail = (int)env_long("WAVEBUS_CUDA_DOUBLE_FAIL_ERROR", cudaErrorUnknown);
    const char* at = getenv("WAVEBUS_CUDA_DOUBLE_FAIL_AT");
    if (at != NULL && strcmp(at, "enqueue") == 0) e = fail;
  }
  if (e != cudaSuccess) {
    pthread_mutex_unlock(&mu);
    return e;
  }
  /* Only copies into pinned memory are asynchronous in CUDA; into pageable memory (or on the
   * legacy default stream here) the call returns once the bytes are there. */
  if (s == NULL || find_alloc(dst, count, 2) == NULL) {
    pthread_mutex_unlock(&mu);
    if (fail != 0) return fail;
    memmove(dst, src, count);
    return cudaSuccess;
  }
  for (Copy* c = copies; c != NULL; c = c->next) {
    if (c->stream != s && overlaps(c->dst, c->len, dst, count)) {
      record("violation", "copy #%lu into %p (%zu bytes) races an unsynchronised copy of another stream into the same bytes", n, dst, count);
      break;
    }
  }
  Copy* c = calloc(1, sizeof *c);
  if (c == NULL) {
    pthread_mutex_unlock(&mu);
    return cudaErrorMemoryAllocation;
  }
  c->stream = s;
  c->dst = dst;
  c->src = src;
  c->len = count;
  c->fail = fail;
  memset(dst, POISON, count); /* what the host sees until the copy lands and is synchronised */
  Copy** tail = &copies;
  while (*tail != NULL) tail = &(*tail)->next;
  *tail = c;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

/* ------------------------------------------------------------------ the report */

static void json_string(FILE* f, const char* s) {
  fputc('"', f);
  for (; *s != '\0'; s++) {
    if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
    else fputc(*s, f);
  }
  fputc('"', f);
}

static void write_report(const char* dir);

__attribute__((destructor)) static void report_at_exit(void) {
  const char* dir = getenv("WAVEBUS_CUDA_DOUBLE_REPORT");
  pthread_mutex_lock(&mu);
  if (dir != NULL && *dir != '\0') write_report(dir);
  /* Device allocations die with their process, as CUDA's do. */
  for (Alloc* a = allocs; a != NULL; a = a->next) {
    if (a->kind == 1) shm_unlink(a->shm);
  }
  pthread_mutex_unlock(&mu);
}

/* Caller holds mu. */
static void write_report(const char* dir) {
  int unsynced = 0;
  for (Copy* c = copies; c != NULL; c = c->next) unsynced++;
  if (unsynced > 0) record("violation", "%d copies were never synchronised when the process exited", unsynced);
  char path[4096];
  snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
  FILE* f = fopen(path, "w");
  if (f == NULL) return;
  fprintf(f, "{\"pid\": %d, \"async_copies\": %lu, \"violations\": %d, \"events\": [", (int)getpid(), copy_count, violations);
  for (int i = 0; i < nevents; i++) {
    if (i > 0) fputs(", ", f);
    json_string(f, events[i]);
  }
  fputs("], \"leaks\": [", f);
  static const char* kinds[] = {"", "device allocation", "pinned host memory", "IPC mapping"};
  int first = 1;
  for (Alloc* a = allocs; a != NULL; a = a->next) {
    char line[160];
    snprintf(line, sizeof line, "%s of %zu bytes%s%s", kinds[a->kind], a->size, a->kind == 2 ? "" : " ", a->kind == 2 ? "" : a->shm);
    if (!first) fputs(", ", f);
    json_string(f, line);
    first = 0;
  }
  for (Stream* s = streams; s != NULL; s = s->next) {
    if (!first) fputs(", ", f);
    json_string(f, "stream never destroyed");
    first = 0;
  }
  fputs("]}\n", f);
  fclose(f);
}
