// libtorch's op profiler (Kineto, CPU activity) behind a C interface, and named scopes that it
// records: the network's stages and the shims' kernels, which libtorch's dispatcher never sees.
// The profiler's callbacks belong to the thread that starts it: the device's compute thread.

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <fstream>
#include <set>

#include "shim.h"

namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

const std::set<ActivityType> kActivities{ActivityType::CPU};

}  // namespace

extern "C" {

bool qwencodec_op_profiler_start(char* error, size_t error_size) {
  return qwencodec::guarded(error, error_size, [] {
    const ProfilerConfig config(ProfilerState::KINETO);
    profiler::prepareProfiler(config, kActivities);
    profiler::enableProfiler(config, kActivities);
  });
}

// Stops the profiler this thread started and writes its CPU events to `path`, one per line:
// thread, start and end (ns), `scope` (named scopes) or `op`, name, tab-separated; none when
// `path` is null.
bool qwencodec_op_profiler_stop(const char* path, char* error, size_t error_size) {
  return qwencodec::guarded(error, error_size, [&] {
    const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
    if (path == nullptr) return;
    std::ofstream out(path);
    TORCH_CHECK(out, "cannot write ", path);
    for (const profiler::KinetoEvent& event : result->events()) {
      if (event.deviceType() != c10::DeviceType::CPU) continue;
      out << event.startThreadId() << '\t' << event.startNs() << '\t' << event.endNs() << '\t'
          << (event.scope() == static_cast<uint8_t>(at::RecordScope::USER_SCOPE) ? "scope" : "op") << '\t'
          << event.name() << '\n';
    }
    out.close();
    TORCH_CHECK(out, "cannot write ", path);
  });
}

// A scope named `name` (which must outlive it) while a profiler listens; null otherwise, and
// then nearly free.
void* qwencodec_scope_begin(const char* name) {
  if (!at::hasCallbacks()) return nullptr;
  auto* scope = new at::RecordFunction(at::RecordScope::USER_SCOPE);
  if (!scope->isActive()) {
    delete scope;
    return nullptr;
  }
  scope->before(name, c10::ArrayRef<const c10::IValue>{});
  return scope;
}

void qwencodec_scope_end(void* scope) { delete static_cast<at::RecordFunction*>(scope); }

}  // extern "C"
