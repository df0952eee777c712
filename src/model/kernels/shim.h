// What the CPU shims share: a C++ exception never crosses into Rust; libtorch's message is
// copied into the caller's buffer instead (shim.rs reads it). Each kernel names itself with
// RECORD_FUNCTION, so that libtorch's op profiler sees it as it sees its own ops.
#pragma once

#include <ATen/record_function.h>

#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>

namespace qwencodec {

// Runs `work`; returns false on an exception, with its message in `error` (of `error_size`
// bytes, NUL-terminated).
template <typename F>
bool guarded(char* error, size_t error_size, F&& work) {
  try {
    work();
    return true;
  } catch (const std::exception& caught) {
    std::strncpy(error, caught.what(), error_size - 1);
  } catch (...) {
    std::strncpy(error, "unknown C++ exception", error_size - 1);
  }
  error[error_size - 1] = '\0';
  return false;
}

// A thread's buffer of at least `floats` floats, one per `Tag` (a type the caller declares),
// kept from call to call: a fresh allocation of megabytes comes from the kernel as zeroed pages,
// which cost as much as the work done in them. Its contents are not kept.
template <typename Tag>
float* thread_buffer(size_t floats) {
  thread_local std::unique_ptr<float[]> buffer;
  thread_local size_t capacity = 0;
  if (capacity < floats) {
    buffer.reset(new float[floats]);
    capacity = floats;
  }
  return buffer.get();
}

}  // namespace qwencodec
