// libtorch's inference mode for the calling thread, for the rest of its life (tch offers only
// no_grad). Under no_grad every op still passes libtorch's autograd and view-tracking dispatch
// keys, and each tensor gets a version counter; inference mode skips both.
#include <c10/core/InferenceMode.h>
#include <omp.h>

#include "shim.h"

extern "C" bool qwencodec_enter_inference_mode(char* error, size_t error_size) {
  return qwencodec::guarded(error, error_size, [] {
    // Never destroyed: its destructor would restore the thread's previous mode.
    new c10::InferenceMode(true);
  });
}

extern "C" bool qwencodec_is_inference_mode() { return c10::InferenceMode::is_enabled(); }

// The calling thread's OpenMP team for libtorch's ops and ours, and nobody else's.
// at::set_num_threads would also set the process's default, which every thread that first
// computes later takes (an in-process talker's, whose rounding would then follow ours).
// MKL keeps the count it was given when the thread first computed.
extern "C" void qwencodec_set_thread_team(int threads) { omp_set_num_threads(threads); }
