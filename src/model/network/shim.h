// What the CPU shims share: a C++ exception never crosses into Rust; libtorch's message is
// copied into the caller's buffer instead (shim.rs reads it). Each kernel names itself with
// RECORD_FUNCTION, so that libtorch's op profiler sees it as it sees its own ops.
#pragma once

#include <ATen/record_function.h>

#include <cstddef>
#include <cstring>
#include <exception>

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

}  // namespace qwencodec
