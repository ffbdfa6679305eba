// runtime.cc: the CUDA emulator's runtime (docs/gpu.md, "Emulation"): device memory, streams,
// events, graphs, errors, and the kernel scheduler.
//
// A launch runs its blocks one after another, in an order shuffled per launch (REMAX_EMU_SEED),
// on the calling thread. Inside a block every CUDA thread is a fiber: a fiber runs threads one
// after another (cheap: no switch) until one of them reaches __syncthreads or a warp operation;
// that thread is parked and the next thread gets another fiber. Warps (in a shuffled order, their
// lanes too) run until every lane waits at the block barrier or has exited; a warp operation
// completes when every lane of its mask has reached it. A barrier or warp operation that cannot
// complete is a fault naming the kernel, the block and the threads, reported like a device fault
// (by the next synchronising call or cudaGetLastError).
#include "cuda_runtime.h"
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define RX_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RX_EMU_ASAN 1
#endif
#endif
#ifdef RX_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// ---------------------------------------------------------------- errors

static std::recursive_mutex emu_lock;   // one launch or runtime call at a time
static cudaError_t launch_error = cudaSuccess;   // a failed launch or call: returned once by cudaGetLastError
static cudaError_t pending_fault = cudaSuccess;  // a fault while executing: returned once by the next sync
static cudaError_t detail_code = cudaSuccess;
static char detail[1024];

static void set_detail(cudaError_t e, const char *fmt, va_list ap) {
  vsnprintf(detail, sizeof detail, fmt, ap);
  detail_code = e;
}

static cudaError_t call_error(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cudaError_t call_error(cudaError_t e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_detail(e, fmt, ap);
  va_end(ap);
  launch_error = e;
  return e;
}

extern "C" void rx_emu_fault(cudaError_t e, const char *fmt, ...) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  va_list ap;
  va_start(ap, fmt);
  set_detail(e, fmt, ap);
  va_end(ap);
  if (pending_fault == cudaSuccess) pending_fault = e;
  fprintf(stderr, "remax cuda emulator: %s\n", detail);
}

// The fault found while executing earlier work, once.
static cudaError_t take_fault(void) {
  cudaError_t e = pending_fault;
  pending_fault = cudaSuccess;
  return e;
}

extern "C" const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorAssert: return "cudaErrorAssert";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorUnknown: return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

// The emulator's detailed message for the most recent error of this code, else the generic text.
extern "C" const char *cudaGetErrorString(cudaError_t e) {
  if (e == detail_code && detail[0]) return detail;
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return cudaGetErrorName(e);
  }
}

extern "C" cudaError_t cudaGetLastError(void) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  cudaError_t e = launch_error != cudaSuccess ? launch_error : pending_fault;
  launch_error = cudaSuccess;
  pending_fault = cudaSuccess;
  return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  return launch_error != cudaSuccess ? launch_error : pending_fault;
}

// ---------------------------------------------------------------- device

extern "C" cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
extern "C" cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : call_error(cudaErrorInvalidDevice, "cudaSetDevice(%d): the emulator has one device, 0", device);
}
extern "C" cudaError_t cudaGetDevice(int *device) {
  *device = 0;
  return cudaSuccess;
}
static void check_guards(const char *when);
extern "C" cudaError_t cudaDeviceSynchronize(void) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  check_guards("after the work queued on the device");
  return take_fault();
}
extern "C" cudaError_t cudaDeviceReset(void) { return cudaSuccess; }

// ---------------------------------------------------------------- memory
// Every allocation is its own host allocation: AddressSanitizer (CI builds the emulator with it)
// sees an access past either end. Without it, GUARD bytes on either side hold a pattern that
// cudaFree and every synchronisation check, so a write past the end is still reported.

#ifdef RX_EMU_ASAN
static const size_t GUARD = 0;
#else
static const size_t GUARD = 256;
#endif
static const unsigned char GUARD_BYTE = 0xA5;
// The emulator's tables are never destroyed: device memory and fibers outlive static destructors
// (LeakSanitizer checks after them, and would find what they point to unreachable).
static std::map<uintptr_t, size_t> &allocations = *new std::map<uintptr_t, size_t>;   // device pointer -> bytes
static size_t bytes_in_use;

static size_t device_total(void) {
  static size_t total;
  if (!total) {
    const char *s = getenv("REMAX_EMU_MEMORY_MB");
    long mb = s ? atol(s) : 0;
    total = (size_t)(mb > 0 ? mb : 16384) << 20;   // 16 GiB unless told otherwise
  }
  return total;
}

static int guards_intact(uintptr_t p, size_t bytes) {
  if (!GUARD) return 1;
  const unsigned char *lo = (const unsigned char *)p - GUARD, *hi = (const unsigned char *)p + bytes;
  for (size_t i = 0; i < GUARD; i++)
    if (lo[i] != GUARD_BYTE || hi[i] != GUARD_BYTE) return 0;
  return 1;
}

// Checks every allocation's guards; a broken one is a fault (device memory written out of bounds).
static void check_guards(const char *when) {
  if (!GUARD) return;
  for (auto &a : allocations)
    if (!guards_intact(a.first, a.second)) {
      rx_emu_fault(cudaErrorIllegalAddress, "%s: memory just outside the device allocation at %p (%zu bytes) was "
                   "written: an out-of-bounds write", when, (void *)a.first, a.second);
      memset((unsigned char *)a.first - GUARD, GUARD_BYTE, GUARD);   // report it once
      memset((unsigned char *)a.first + a.second, GUARD_BYTE, GUARD);
    }
}

extern "C" cudaError_t cudaMalloc(void **ptr, size_t bytes) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  *ptr = NULL;
  if (bytes > device_total() - bytes_in_use)
    return call_error(cudaErrorMemoryAllocation, "cudaMalloc(%zu bytes): the emulated device has %zu of %zu bytes free "
                      "(REMAX_EMU_MEMORY_MB sets its size)", bytes, device_total() - bytes_in_use, device_total());
  void *raw = NULL;
  if (posix_memalign(&raw, 256, GUARD + (bytes ? bytes : 1) + GUARD) != 0)
    return call_error(cudaErrorMemoryAllocation, "cudaMalloc(%zu bytes): the host is out of memory", bytes);
  unsigned char *p = (unsigned char *)raw + GUARD;
  memset(raw, GUARD_BYTE, GUARD);
  memset(p + bytes, GUARD_BYTE, GUARD);
  memset(p, 0xFF, bytes);   // uninitialised device memory reads as NaN (or -1), never as a plausible 0
  allocations[(uintptr_t)p] = bytes;
  bytes_in_use += bytes;
  *ptr = p;
  return cudaSuccess;
}

extern "C" cudaError_t cudaFree(void *ptr) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  if (!ptr) return cudaSuccess;
  auto it = allocations.find((uintptr_t)ptr);
  if (it == allocations.end())
    return call_error(cudaErrorInvalidDevicePointer, "cudaFree(%p): not a pointer cudaMalloc returned (or freed twice)", ptr);
  if (!guards_intact(it->first, it->second))
    rx_emu_fault(cudaErrorIllegalAddress, "cudaFree: memory just outside the device allocation at %p (%zu bytes) was "
                 "written: an out-of-bounds write", ptr, it->second);
  bytes_in_use -= it->second;
  allocations.erase(it);
  free((unsigned char *)ptr - GUARD);
  return cudaSuccess;
}

extern "C" cudaError_t cudaMallocHost(void **ptr, size_t bytes) {
  *ptr = malloc(bytes ? bytes : 1);
  return *ptr ? cudaSuccess : call_error(cudaErrorMemoryAllocation, "cudaMallocHost(%zu bytes): out of host memory", bytes);
}
extern "C" cudaError_t cudaFreeHost(void *ptr) {
  free(ptr);
  return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  *free_bytes = device_total() - bytes_in_use;
  *total_bytes = device_total();
  return cudaSuccess;
}

// The allocation holding [p, p + bytes), or 0.
static int in_device(const void *p, size_t bytes) {
  auto it = allocations.upper_bound((uintptr_t)p);
  if (it == allocations.begin()) return 0;
  --it;
  return (uintptr_t)p >= it->first && (uintptr_t)p + bytes <= it->first + it->second;
}

extern "C" int rx_emu_is_device_range(const void *p, size_t bytes) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  return in_device(p, bytes);
}

// ---------------------------------------------------------------- streams, events, graphs

struct rx_emu_graph {
  std::vector<std::function<void()>> work;
};
struct rx_emu_graph_exec {
  std::vector<std::function<void()>> work;
};
struct rx_emu_stream {
  rx_emu_graph *capture = nullptr;   // recording instead of running
};
struct rx_emu_event {
  double when = 0;
};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Runs work now, or records it when the stream is capturing a graph (cublas.cc queues its GEMMs
// through it too).
namespace rx_emu {
cudaError_t submit(cudaStream_t s, std::function<void()> work);
}
static cudaError_t submit(cudaStream_t s, std::function<void()> work) { return rx_emu::submit(s, std::move(work)); }
cudaError_t rx_emu::submit(cudaStream_t s, std::function<void()> work) {
  if (s && s->capture) {
    s->capture->work.push_back(std::move(work));
    return cudaSuccess;
  }
  work();
  return cudaSuccess;
}

static int capturing(cudaStream_t s) { return s && s->capture; }

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  *s = new rx_emu_stream;
  return cudaSuccess;
}
extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s) { delete s->capture; delete s; }
  return cudaSuccess;
}
extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  if (capturing(s))
    return call_error(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize on a stream that is capturing a graph");
  check_guards("after the work queued on the stream");
  return take_fault();
}
extern "C" cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }
extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) { return cudaSuccess; }

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  *e = new rx_emu_event;
  return cudaSuccess;
}
extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  if (!e) return call_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: no event");
  return submit(s, [e] { e->when = now_ms(); });
}
extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  return take_fault();
}
extern "C" cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaSuccess; }
extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = (float)(end->when - start->when);
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  if (!s) return call_error(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: the legacy default stream cannot capture");
  if (s->capture) return call_error(cudaErrorIllegalAddress, "cudaStreamBeginCapture: the stream is already capturing");
  s->capture = new rx_emu_graph;
  return cudaSuccess;
}
extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  if (!s || !s->capture) return call_error(cudaErrorInvalidValue, "cudaStreamEndCapture: the stream is not capturing");
  *graph = s->capture;
  s->capture = nullptr;
  return cudaSuccess;
}
extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
  *exec = new rx_emu_graph_exec;
  (*exec)->work = graph->work;
  return cudaSuccess;
}
extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  if (!exec) return call_error(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: no graph");
  for (auto &w : exec->work) submit(s, w);
  return cudaSuccess;
}
extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

// ---------------------------------------------------------------- copies

static const char *kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "host to host";
    case cudaMemcpyHostToDevice: return "host to device";
    case cudaMemcpyDeviceToHost: return "device to host";
    case cudaMemcpyDeviceToDevice: return "device to device";
    default: return "default";
  }
}

// A copy's sides must be where its kind says: a device side inside one allocation.
static cudaError_t check_copy(const char *call, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  const int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost) return cudaSuccess;
  if (dst_dev && !in_device(dst, bytes))
    return call_error(cudaErrorInvalidValue, "%s(%s, %zu bytes): destination %p is not %zu bytes of one device allocation",
                      call, kind_name(kind), bytes, dst, bytes);
  if (src_dev && !in_device(src, bytes))
    return call_error(cudaErrorInvalidValue, "%s(%s, %zu bytes): source %p is not %zu bytes of one device allocation",
                      call, kind_name(kind), bytes, src, bytes);
  if (!dst_dev && in_device(dst, 1))
    return call_error(cudaErrorInvalidValue, "%s(%s): destination %p is device memory", call, kind_name(kind), dst);
  if (!src_dev && in_device(src, 1))
    return call_error(cudaErrorInvalidValue, "%s(%s): source %p is device memory", call, kind_name(kind), src);
  return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  if (!bytes) return cudaSuccess;
  cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, bytes, kind);
  if (e != cudaSuccess) return e;
  return submit(s, [=] { memmove(dst, src, bytes); });
}
extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  cudaError_t e = take_fault();
  if (e != cudaSuccess) return e;
  if (!bytes) return cudaSuccess;
  e = check_copy("cudaMemcpy", dst, src, bytes, kind);
  if (e != cudaSuccess) return e;
  memmove(dst, src, bytes);
  return cudaSuccess;
}
extern "C" cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  if (!bytes) return cudaSuccess;
  if (!in_device(dst, bytes))
    return call_error(cudaErrorInvalidValue, "cudaMemsetAsync(%p, %zu bytes): not inside one device allocation", dst, bytes);
  return submit(s, [=] { memset(dst, value, bytes); });
}
extern "C" cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
  cudaError_t e = cudaMemsetAsync(dst, value, bytes, 0);
  return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}
extern "C" cudaError_t rx_emu_memcpy_to_symbol(void *symbol, size_t symbol_bytes, const void *src, size_t bytes,
                                               size_t offset, cudaMemcpyKind kind, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  if (offset + bytes > symbol_bytes)
    return call_error(cudaErrorInvalidValue, "cudaMemcpyToSymbol: %zu bytes at offset %zu overrun the %zu-byte symbol",
                      bytes, offset, symbol_bytes);
  if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
    return call_error(cudaErrorInvalidMemcpyDirection, "cudaMemcpyToSymbol: direction %s", kind_name(kind));
  char *dst = (char *)symbol + offset;
  return submit(s, [=] { memcpy(dst, src, bytes); });
}

// ---------------------------------------------------------------- fibers
// A fiber is a stack and a saved stack pointer. x86-64 switches with a few instructions (the
// callee-saved registers); elsewhere ucontext. Under
// AddressSanitizer every switch is announced, so that it follows the stack in use.

struct fiber {
  char *stack = nullptr;     // lowest address (a guard page below the usable part)
  size_t size = 0;
  void *sp = nullptr;
  void *fake_stack = nullptr;
  int chain = 0;             // the order position its next run starts from
  bool idle = true;          // no thread parked on it
};

static const size_t FIBER_STACK = (size_t)256 << 10;
static fiber sched_ctx;                  // the scheduler: the launching thread's own stack
static fiber *current_fiber = &sched_ctx;
static fiber *switched_from;             // who switched to the context now running
static void fiber_main(void);

#if defined(__x86_64__)
extern "C" void rx_emu_switch(void **save_sp, void *load_sp);
asm(R"(
  .text
  .globl rx_emu_switch
  .hidden rx_emu_switch
  .type rx_emu_switch,@function
rx_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size rx_emu_switch, .-rx_emu_switch
)");

static void fiber_reset(fiber *f) {
  // The first switch into it pops six registers, then returns to fiber_main with the stack
  // aligned as after a call. (The SSE and x87 control words are not switched: no kernel changes
  // the rounding mode.)
  uintptr_t top = ((uintptr_t)(f->stack + f->size)) & ~(uintptr_t)15;
  uint64_t *sp = (uint64_t *)top;
  *--sp = 0;                                  // fiber_main's return address: none
  *--sp = (uint64_t)(uintptr_t)&fiber_main;   // where the switch returns to
  for (int i = 0; i < 6; i++) *--sp = 0;      // rbp rbx r12 r13 r14 r15
  f->sp = sp;
}
static inline void raw_switch(void **save, void *load) { rx_emu_switch(save, load); }
#else
#include <ucontext.h>
static void fiber_reset(fiber *f) {
  ucontext_t *uc = new ucontext_t;
  getcontext(uc);
  uc->uc_stack.ss_sp = f->stack;
  uc->uc_stack.ss_size = f->size;
  uc->uc_link = nullptr;
  makecontext(uc, fiber_main, 0);
  f->sp = uc;
}
static inline void raw_switch(void **save, void *load) {
  ucontext_t self;
  *save = &self;
  swapcontext(&self, (ucontext_t *)load);
}
#endif

static fiber *fiber_new(void) {
  fiber *f = new fiber;
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  f->size = FIBER_STACK;
  void *m = mmap(NULL, f->size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    fprintf(stderr, "remax cuda emulator: cannot map a %zu-byte fiber stack: %s\n", f->size, strerror(errno));
    abort();
  }
  mprotect(m, page, PROT_NONE);   // a stack overflow faults instead of corrupting a neighbour
  f->stack = (char *)m + page;
  fiber_reset(f);
  return f;
}

// Switches from the running context (the scheduler or a fiber) to `to`; returns when something
// switches back. Under AddressSanitizer each switch is announced; the scheduler's stack bounds are
// learned from the first switch away from it.
static void switch_ctx(fiber *to) {
  fiber *from = current_fiber;
  current_fiber = to;
  switched_from = from;
#ifdef RX_EMU_ASAN
  __sanitizer_start_switch_fiber(&from->fake_stack, to->stack, to->size);
#endif
  raw_switch(&from->sp, to->sp);
#ifdef RX_EMU_ASAN
  const void *bottom;
  size_t size;
  __sanitizer_finish_switch_fiber(from->fake_stack, &bottom, &size);
  if (switched_from == &sched_ctx) { sched_ctx.stack = (char *)bottom; sched_ctx.size = size; }
#endif
}

// ---------------------------------------------------------------- the scheduler

enum thread_state { NEW, RUNNING, READY, AT_BARRIER, AT_WARP, DONE };

struct thread_rec {
  uint3 idx;
  int state;
  fiber *f;
  int op, arg, width;
  unsigned mask;
  uint64_t value, result;
};

extern "C" {
uint3 rx_emu_thread_idx, rx_emu_block_idx;
dim3 rx_emu_block_dim, rx_emu_grid_dim;
}

// The launch in flight.
static struct {
  const char *name;
  const rx_emu::kernel_call *call;
  int nthreads, nwarps;
  std::vector<thread_rec> threads;
  std::vector<int> order;   // threads in execution order (warps, then lanes, both shuffled)
  std::vector<int> pos;     // thread -> its place in order
  int lane_order[32];       // lanes of a warp in execution order (the same for every warp of a launch)
  int lane_pos[32];         // lane -> its place in lane_order
  // per warp: lanes that may run (new or ready) and lanes not started, as bits of places in
  // lane_order; lanes waiting at a warp operation, as bits of lanes
  unsigned runnable[32], fresh[32], arrived[32];
  int cur;                  // the running thread
  unsigned char *shared;
  size_t shared_bytes;
  bool faulted;
} L;

static std::vector<fiber *> &fiber_pool = *new std::vector<fiber *>;

// Every change of a thread's state goes through here, keeping the warp's masks.
static inline void set_state(int t, int st) {
  thread_rec &r = L.threads[t];
  const int w = t >> 5;
  const unsigned bit = 1u << L.lane_pos[t & 31], lane = 1u << (t & 31);
  if (r.state == NEW) L.fresh[w] &= ~bit;
  if (r.state == NEW || r.state == READY) L.runnable[w] &= ~bit;
  if (r.state == AT_WARP) L.arrived[w] &= ~lane;
  r.state = st;
  if (st == NEW) { L.fresh[w] |= bit; L.runnable[w] |= bit; }
  else if (st == READY) L.runnable[w] |= bit;
  else if (st == AT_WARP) L.arrived[w] |= lane;
}

static void set_thread(int t) {
  L.cur = t;
  rx_emu_thread_idx = L.threads[t].idx;
}

// A fiber's life: run the threads from its chain position on while they are new and complete;
// then go idle until the scheduler hands it another chain.
static void fiber_main(void) {
#ifdef RX_EMU_ASAN
  const void *bottom;
  size_t size;
  __sanitizer_finish_switch_fiber(nullptr, &bottom, &size);
  if (switched_from == &sched_ctx) { sched_ctx.stack = (char *)bottom; sched_ctx.size = size; }
#endif
  for (;;) {
    fiber *f = current_fiber;
    for (int p = f->chain; p < L.nthreads && !L.faulted; p++) {
      const int t = L.order[p];
      thread_rec &r = L.threads[t];
      if (r.state != NEW) break;
      set_state(t, RUNNING);
      r.f = f;
      set_thread(t);
      L.call->run();
      set_state(t, DONE);
      f = current_fiber;
    }
    f->idle = true;
    switch_ctx(&sched_ctx);
  }
}

static void block_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void block_fault(const char *fmt, ...) {
  char msg[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!L.faulted)
    rx_emu_fault(cudaErrorLaunchFailure, "kernel %s, block (%u,%u,%u) of grid (%u,%u,%u), %u x %u x %u threads: %s",
                 L.name, rx_emu_block_idx.x, rx_emu_block_idx.y, rx_emu_block_idx.z, rx_emu_grid_dim.x,
                 rx_emu_grid_dim.y, rx_emu_grid_dim.z, rx_emu_block_dim.x, rx_emu_block_dim.y, rx_emu_block_dim.z, msg);
  L.faulted = true;
}

static int resolve_warp(int w);

// The thread to run after `self` parks: the next ready lane of its warp (in the launch's lane
// order); when none is ready, the warp's operations that can complete do, and self continues if
// it was among them; -1 (the scheduler) when a lane of the warp has not started yet or nothing
// can run.
static int next_in_warp(int self) {
  const int w = self >> 5, at = L.lane_pos[self & 31];
  for (int pass = 0; pass < 2; pass++) {
    const unsigned ready = L.runnable[w] & ~L.fresh[w];
    if (ready) {
      const unsigned later = ready & ~((2u << at) - 1u);   // places after self's, then from the start
      return (self & ~31) + L.lane_order[__builtin_ctz(later ? later : ready)];
    }
    if (L.fresh[w] || pass == 1 || L.faulted || !resolve_warp(w)) return -1;
    if (L.threads[self].state == READY) return self;
  }
  return -1;
}

// The running thread waits (at a barrier or a warp operation): switch to the next thread of its
// warp, or to the scheduler; returns when the thread may go on.
static void park(int state) {
  const int self = L.cur;
  set_state(self, state);
  const int t = next_in_warp(self);
  if (t == self) {
    set_state(self, RUNNING);
    return;
  }
  fiber *to = &sched_ctx;
  if (t >= 0) {
    set_state(t, RUNNING);
    set_thread(t);
    to = L.threads[t].f;
  }
  switch_ctx(to);
}

extern "C" void rx_emu_syncthreads(void) {
  if (!L.call) return;   // host code
  park(AT_BARRIER);
}

extern "C" void *rx_emu_dynamic_shared(void) { return L.shared; }

extern "C" uint64_t rx_emu_warp(int op, unsigned mask, uint64_t value, int arg, int width) {
  if (!L.call) return value;
  thread_rec &r = L.threads[L.cur];
  r.op = op;
  r.mask = mask;
  r.value = value;
  r.arg = arg;
  r.width = width;
  park(AT_WARP);
  return L.threads[L.cur].result;
}

static const char *op_name(int op) {
  switch (op) {
    case RX_EMU_SHFL_IDX: return "__shfl_sync";
    case RX_EMU_SHFL_XOR: return "__shfl_xor_sync";
    case RX_EMU_SHFL_DOWN: return "__shfl_down_sync";
    case RX_EMU_SHFL_UP: return "__shfl_up_sync";
    case RX_EMU_BALLOT: return "__ballot_sync";
    case RX_EMU_ANY: return "__any_sync";
    case RX_EMU_ALL: return "__all_sync";
    case RX_EMU_SYNCWARP: return "__syncwarp";
  }
  return "a warp operation";
}

static const char *state_name(int s) {
  switch (s) {
    case DONE: return "has exited";
    case AT_BARRIER: return "waits at __syncthreads";
    case AT_WARP: return "waits at another warp operation";
    default: return "has not arrived";
  }
}

static void thread_name(char *buf, size_t n, int t) __attribute__((noinline));
static void thread_name(char *buf, size_t n, int t) {
  const uint3 i = L.threads[t].idx;
  snprintf(buf, n, "thread (%u,%u,%u) (warp %d lane %d)", i.x, i.y, i.z, t / 32, t % 32);
}

// Completes the warp operations of warp w whose whole mask has arrived; 1 when any completed.
static int resolve_warp(int w) {
  const int base = w * 32, lanes = L.nthreads - base < 32 ? L.nthreads - base : 32;
  const unsigned present = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
  int progress = 0;
  unsigned todo = L.arrived[w];
  while (todo && !L.faulted) {
    const int l = __builtin_ctz(todo);
    const thread_rec &r = L.threads[base + l];
    const unsigned m = r.mask;
    const int op = r.op;
    char who[96], other[96];
    if (!(m & (1u << l)) || (m & ~present) || r.width < 1 || r.width > 32 || (r.width & (r.width - 1))) {
      thread_name(who, sizeof who, base + l);
      if (!(m & (1u << l)))
        block_fault("%s calls %s with mask 0x%08x, which leaves out the calling lane", who, op_name(op), m);
      else if (m & ~present)
        block_fault("%s calls %s with mask 0x%08x, but the warp has only lanes 0..%d (mask 0x%08x)", who, op_name(op),
                    m, lanes - 1, present);
      else
        block_fault("%s calls %s with width %d (a power of two up to 32)", who, op_name(op), r.width);
      return 0;
    }
    if (m & ~L.arrived[w]) {   // some lane of the mask is still on its way
      todo &= ~m;
      continue;
    }
    unsigned ballot = 0;
    for (unsigned b = m; b; b &= b - 1) {
      const int j = __builtin_ctz(b);
      const thread_rec &o = L.threads[base + j];
      if (o.mask != m || o.op != op) {
        thread_name(who, sizeof who, base + l);
        thread_name(other, sizeof other, base + j);
        block_fault("%s calls %s with mask 0x%08x while %s, in that mask, calls %s with mask 0x%08x", who,
                    op_name(op), m, other, op_name(o.op), o.mask);
        return 0;
      }
      if (o.value) ballot |= 1u << j;
    }
    for (unsigned b = m; b; b &= b - 1) {
      const int j = __builtin_ctz(b);
      thread_rec &o = L.threads[base + j];
      const int seg = j & ~(o.width - 1), end = seg + o.width;
      int src = j;
      switch (op) {
        case RX_EMU_SHFL_IDX: src = seg + (o.arg & (o.width - 1)); break;
        case RX_EMU_SHFL_XOR: src = j ^ o.arg; if (src >= end || src < 0 || src > 31) src = j; break;
        case RX_EMU_SHFL_DOWN: src = j + o.arg; if (src >= end) src = j; break;
        case RX_EMU_SHFL_UP: src = j - o.arg; if (src < seg) src = j; break;
        case RX_EMU_BALLOT: o.result = ballot; continue;
        case RX_EMU_ANY: o.result = ballot != 0; continue;
        case RX_EMU_ALL: o.result = ballot == m; continue;
        default: o.result = 0; continue;   // __syncwarp
      }
      if (!(m & (1u << src))) {
        thread_name(other, sizeof other, base + j);
        block_fault("%s reads lane %d with %s(mask 0x%08x, ...), but lane %d is not in the mask: its value is undefined",
                    other, src, op_name(op), m, src);
        return 0;
      }
      o.result = L.threads[base + src].value;
    }
    for (unsigned b = m; b; b &= b - 1) set_state(base + __builtin_ctz(b), READY);
    todo &= ~m;
    progress = 1;
  }
  return progress;
}

static fiber *get_fiber(void) {
  if (fiber_pool.empty()) return fiber_new();
  fiber *f = fiber_pool.back();
  fiber_pool.pop_back();
  return f;
}

// Runs thread t (new: on a fresh chain; parked: resumes its fiber); returns when some fiber
// switches back to the scheduler.
static void step(int t) {
  thread_rec &r = L.threads[t];
  fiber *f;
  if (r.state == NEW) {
    f = get_fiber();
    f->chain = L.pos[t];
    f->idle = false;
  } else {
    f = r.f;
    set_state(t, RUNNING);
    set_thread(t);
  }
  switch_ctx(f);
  if (switched_from != &sched_ctx && switched_from->idle) fiber_pool.push_back(switched_from);
}

// After a fault, the fibers still holding a parked thread are reset for reuse.
static void abandon_block(void) {
  for (auto &r : L.threads) {
    if (r.state == DONE || r.state == NEW || !r.f || r.f->idle) continue;
    fiber *f = r.f;
#ifdef RX_EMU_ASAN
    __asan_unpoison_memory_region(f->stack, f->size);
#endif
    f->idle = true;
    f->fake_stack = nullptr;
    fiber_reset(f);
    fiber_pool.push_back(f);
    r.f = nullptr;
  }
}

static uint64_t splitmix(uint64_t &s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void run_block(uint64_t &rng) {
  const int n = L.nthreads;
  // warps in a shuffled order, each warp's lanes in the launch's lane order
  int worder[32];
  for (int w = 0; w < L.nwarps; w++) worder[w] = w;
  for (int w = L.nwarps - 1; w > 0; w--) {
    int j = (int)(splitmix(rng) % (uint64_t)(w + 1)), t = worder[w];
    worder[w] = worder[j];
    worder[j] = t;
  }
  int p = 0;
  for (int wi = 0; wi < L.nwarps; wi++)
    for (int l : L.lane_order) {
      const int t = worder[wi] * 32 + l;
      if (t < n) { L.order[p] = t; L.pos[t] = p; p++; }
    }
  for (int w = 0; w < L.nwarps; w++) L.runnable[w] = L.fresh[w] = L.arrived[w] = 0;
  for (int t = 0; t < n; t++) {
    L.threads[t].state = DONE;
    L.threads[t].f = nullptr;
    set_state(t, NEW);
  }
  if (L.shared_bytes) memset(L.shared, 0xFF, L.shared_bytes);   // shared memory starts undefined: NaN

  for (;;) {
    for (int wi = 0; wi < L.nwarps && !L.faulted; wi++) {
      const int w = worder[wi];
      while (!L.faulted) {
        if (L.runnable[w]) step(w * 32 + L.lane_order[__builtin_ctz(L.runnable[w])]);
        else if (!resolve_warp(w)) break;
      }
    }
    if (L.faulted) break;
    int done = 0, bar = 0, warp = -1, exited = -1;
    for (int t = 0; t < n; t++) {
      const int s = L.threads[t].state;
      if (s == DONE) { done++; if (exited < 0) exited = t; }
      else if (s == AT_BARRIER) bar++;
      else if (s == AT_WARP && warp < 0) warp = t;
    }
    if (done == n) return;
    char who[96], other[96];
    if (warp >= 0) {   // a warp operation that can never complete: name a lane of its mask that is elsewhere
      const thread_rec &r = L.threads[warp];
      const int base = warp / 32 * 32;
      thread_name(who, sizeof who, warp);
      for (int j = 0; j < 32; j++)
        if ((r.mask & (1u << j)) && base + j < n && L.threads[base + j].state != AT_WARP) {
          thread_name(other, sizeof other, base + j);
          block_fault("%s waits at %s(mask 0x%08x) but %s of that mask %s", who, op_name(r.op), r.mask, other,
                      state_name(L.threads[base + j].state));
          break;
        }
      if (!L.faulted) block_fault("%s waits at %s(mask 0x%08x), which never completes", who, op_name(r.op), r.mask);
      break;
    }
    if (done > 0) {   // some threads wait at the barrier, some have exited
      thread_name(other, sizeof other, exited);
      block_fault("__syncthreads reached by %d of %d threads: %s exited without reaching it (a barrier must be "
                  "reached by every thread of the block)", bar, n, other);
      break;
    }
    for (int t = 0; t < n; t++) set_state(t, READY);   // the barrier opens
  }
  abandon_block();
}

static uint64_t launches;
extern "C" uint64_t rx_emu_launch_count(void) { return launches; }

static uint64_t seed(void) {
  static uint64_t s;
  static bool read;
  if (!read) {
    const char *e = getenv("REMAX_EMU_SEED");
    s = e && *e ? strtoull(e, NULL, 0) : 0x5eed;
    read = true;
  }
  return s;
}

static uint64_t gcd(uint64_t a, uint64_t b) {
  while (b) { uint64_t t = a % b; a = b; b = t; }
  return a;
}

static void execute(const std::string &name, const rx_emu::kernel_call &call, dim3 grid, dim3 block, size_t smem) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  uint64_t rng = seed() ^ (0x9e3779b97f4a7c15ull * ++launches);
  splitmix(rng);
  L.name = name.c_str();
  L.call = &call;
  L.nthreads = (int)(block.x * block.y * block.z);
  L.nwarps = (L.nthreads + 31) / 32;
  L.threads.assign((size_t)L.nthreads, thread_rec());
  L.order.assign((size_t)L.nthreads, 0);
  L.pos.assign((size_t)L.nthreads, 0);
  for (int t = 0; t < L.nthreads; t++) {
    uint3 &i = L.threads[t].idx;
    i.x = t % block.x;
    i.y = t / block.x % block.y;
    i.z = t / (block.x * block.y);
  }
  L.shared_bytes = smem;
  L.shared = smem ? (unsigned char *)malloc(smem) : nullptr;
  L.faulted = false;
  rx_emu_block_dim = block;
  rx_emu_grid_dim = grid;
  for (int l = 0; l < 32; l++) L.lane_order[l] = l;
  for (int l = 31; l > 0; l--) std::swap(L.lane_order[l], L.lane_order[splitmix(rng) % (uint64_t)(l + 1)]);
  for (int l = 0; l < 32; l++) L.lane_pos[L.lane_order[l]] = l;
  // blocks in the order i -> (a i + c) mod n, a coprime to n: a different permutation per launch
  const uint64_t nb = (uint64_t)grid.x * grid.y * grid.z;
  uint64_t a = 1, c = 0;
  if (nb > 1) {
    do a = splitmix(rng) % nb; while (a == 0 || gcd(a, nb) != 1);
    c = splitmix(rng) % nb;
  }
  for (uint64_t i = 0; i < nb && !L.faulted; i++) {
    const uint64_t b = (uint64_t)(((unsigned __int128)a * i + c) % nb);
    rx_emu_block_idx.x = (unsigned)(b % grid.x);
    rx_emu_block_idx.y = (unsigned)(b / grid.x % grid.y);
    rx_emu_block_idx.z = (unsigned)(b / ((uint64_t)grid.x * grid.y));
    run_block(rng);
  }
  free(L.shared);
  L.shared = nullptr;
  L.call = nullptr;
}

static std::map<const void *, int> &max_dynamic_shared = *new std::map<const void *, int>;   // per kernel
static const int SHARED_DEFAULT = 48 << 10, SHARED_OPT_IN = 227 << 10;

extern "C" cudaError_t rx_emu_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > SHARED_OPT_IN)
      return call_error(cudaErrorInvalidValue, "cudaFuncSetAttribute: %d bytes of dynamic shared memory asked, the "
                        "device allows at most %d", value, SHARED_OPT_IN);
    max_dynamic_shared[fn] = value;
  }
  return cudaSuccess;
}

namespace rx_emu {
cudaError_t launch(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   const kernel_call &call) {
  std::lock_guard<std::recursive_mutex> g(emu_lock);
  std::string kname = name;
  if (kname.size() > 2 && kname.front() == '(' && kname.back() == ')') kname = kname.substr(1, kname.size() - 2);
  const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
    return call_error(cudaErrorInvalidConfiguration, "kernel %s: block (%u,%u,%u) = %llu threads (1 to 1024, z at most 64)",
                      kname.c_str(), block.x, block.y, block.z, threads);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return call_error(cudaErrorInvalidConfiguration, "kernel %s: grid (%u,%u,%u) (x from 1 to 2^31-1, y and z from 1 "
                      "to 65535)", kname.c_str(), grid.x, grid.y, grid.z);
  auto it = max_dynamic_shared.find(fn);
  const int limit = it != max_dynamic_shared.end() && it->second > SHARED_DEFAULT ? it->second : SHARED_DEFAULT;
  if (smem > (size_t)limit)
    return call_error(cudaErrorInvalidValue, "kernel %s: %zu bytes of dynamic shared memory, above the %d allowed%s",
                      kname.c_str(), smem, limit,
                      limit == SHARED_DEFAULT ? " without cudaFuncSetAttribute(MaxDynamicSharedMemorySize)" : "");
  if (s && s->capture) {
    std::shared_ptr<kernel_call> copy(call.clone());
    s->capture->work.push_back([kname, copy, grid, block, smem] { execute(kname, *copy, grid, block, smem); });
    return cudaSuccess;
  }
  execute(kname, call, grid, block, smem);
  return cudaSuccess;
}
}   // namespace rx_emu
