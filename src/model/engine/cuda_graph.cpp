// libtorch's CUDA graphs (at::cuda::CUDAGraph) behind a C interface for src/model/engine/cuda_graph.rs:
// tch does not wrap them. Every function catches what libtorch throws and returns it as a
// message (NULL on success) for the caller to free with qwencodec_error_free.

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>

struct QwencodecGraph {
  at::cuda::CUDAGraph graph;
  c10::DeviceIndex device;
  // Capture needs a stream other than the default one; warm-up runs there too, so that the
  // stream's cuBLAS workspace exists before capture.
  c10::cuda::CUDAStream side_stream;
  std::optional<c10::cuda::CUDAStream> previous_stream;
  c10::DeviceIndex previous_device = -1;

  explicit QwencodecGraph(c10::DeviceIndex index)
      : device(index), side_stream(c10::cuda::getStreamFromPool(false, index)) {}
};

namespace {

char* message(const char* text) {
  size_t length = std::strlen(text);
  char* copy = static_cast<char*>(std::malloc(length + 1));
  if (copy != nullptr) {
    std::memcpy(copy, text, length + 1);
  }
  return copy;
}

template <typename F>
char* guarded(F&& work) {
  try {
    work();
    return nullptr;
  } catch (const std::exception& error) {
    return message(error.what());
  } catch (...) {
    return message("unknown C++ exception");
  }
}

}  // namespace

extern "C" {

char* qwencodec_graph_new(int32_t device, QwencodecGraph** out) {
  *out = nullptr;
  return guarded([&] { *out = new QwencodecGraph(static_cast<c10::DeviceIndex>(device)); });
}

void qwencodec_graph_free(QwencodecGraph* graph) {
  try {
    delete graph;
  } catch (...) {
    // A destructor that throws leaks the graph rather than ending the process.
  }
}

// Makes the graph's device and its side stream current on this thread (capture reads both),
// once the device finished its queued work (weights, a fresh state).
char* qwencodec_graph_enter_side_stream(QwencodecGraph* graph) {
  return guarded([&] {
    graph->previous_device = c10::cuda::current_device();
    c10::cuda::set_device(graph->device);
    c10::cuda::device_synchronize();
    graph->previous_stream = c10::cuda::getCurrentCUDAStream(graph->device);
    c10::cuda::setCurrentCUDAStream(graph->side_stream);
  });
}

// Waits for the side stream's work, then makes the earlier stream and device current again.
char* qwencodec_graph_leave_side_stream(QwencodecGraph* graph) {
  return guarded([&] {
    if (graph->previous_stream) {
      c10::cuda::setCurrentCUDAStream(*graph->previous_stream);
      graph->previous_stream.reset();
    }
    c10::cuda::device_synchronize();
    if (graph->previous_device >= 0) {
      c10::cuda::set_device(graph->previous_device);
      graph->previous_device = -1;
    }
  });
}

// Thread-local mode: other threads' CUDA calls (another element freeing tensors) cannot
// break this capture. With `share_pool_of`, the graph takes its memory from that graph's pool
// instead of a pool of its own: graphs replayed one at a time can reuse each other's scratch.
char* qwencodec_graph_capture_begin(QwencodecGraph* graph, const QwencodecGraph* share_pool_of) {
  return guarded([&] {
    decltype(graph->graph.pool()) pool = {0, 0};
    if (share_pool_of != nullptr) {
      pool = const_cast<QwencodecGraph*>(share_pool_of)->graph.pool();
    }
    graph->graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
  });
}

char* qwencodec_graph_capture_end(QwencodecGraph* graph) {
  return guarded([&] { graph->graph.capture_end(); });
}

// Launches the captured kernels on the current stream.
char* qwencodec_graph_replay(QwencodecGraph* graph) {
  return guarded([&] { graph->graph.replay(); });
}

// Device memory libtorch's caching allocator holds on `device` (graph pools included).
char* qwencodec_cuda_reserved_bytes(int32_t device, uint64_t* out) {
  *out = 0;
  return guarded([&] {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    *out = static_cast<uint64_t>(
        stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current);
  });
}

void qwencodec_error_free(char* error) { std::free(error); }

}  // extern "C"
