// What the kernels that multiply in AMX tiles share (pointwise.cpp, skinny_gemm.cpp,
// conv_amx.cpp): the tiles' configuration and the fences around them. Every such
// kernel uses tile registers 0-6 as rows of 64 bytes: 0-2 sums (16 rows, or fewer, by 16
// float32), 3 the left side (as many rows by 32 bfloat16), 4-6 right sides (16 pairs of inputs by
// 16 outputs, as bfloat16 pairs); but conv_amx.cpp, which uses all eight as 16 rows of 64 bytes
// (load_eight_tile_config). Whether the
// CPU has AMX-BF16 and the process may use it: qwencodec_amx_bf16 (amx.cpp), asked by shim.rs.
#pragma once

#include "intrinsics.h"

#include <cstdint>

namespace qwencodec {

// Rows and bytes per row of every tile used.
constexpr int64_t kAmxRows = 16;
// Pairs of bfloat16 inputs a product takes from each row: 64 bytes.
constexpr int64_t kAmxPairs = 16;

struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "AMX's tile configuration is 64 bytes");

// GCC 12's _tile_loadconfig tells the compiler that it reads 8 bytes of the configuration, which
// then dropped the stores of the rest; and its tile loads and stores name no memory at all, so
// the products are fenced from the code around them (compiler_fence). Per thread: the
// configuration is the calling thread's. `left_rows`: the rows of the sums and the left side
// (tiles 0-3), fewer than 16 for a product of fewer rows.
__attribute__((target("amx-tile"))) inline void load_tile_config(int64_t left_rows = kAmxRows) {
  TileConfig config;
  for (int t = 0; t < 7; ++t) {
    config.rows[t] = static_cast<uint8_t>(t < 4 ? left_rows : kAmxRows);
    config.bytes_per_row[t] = 64;
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(config));
}

// All eight tiles as 16 rows of 64 bytes (conv_amx.cpp: four sums, two left sides, two right).
__attribute__((target("amx-tile"))) inline void load_eight_tile_config() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = static_cast<uint8_t>(kAmxRows);
    config.bytes_per_row[t] = 64;
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(config));
}

__attribute__((target("amx-tile"))) inline void release_tiles() { _tile_release(); }

// The sums (tiles 0-2) to zero.
__attribute__((target("amx-tile"))) inline void zero_sums() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
}

// The left side of the products that follow (tile 3), from `left`, rows `left_stride` bytes
// apart.
__attribute__((target("amx-tile"))) inline void load_left(const void* left, int64_t left_stride) {
  _tile_loadd(3, left, left_stride);
}

// Tile `t` of the sums (0-2) += the left side (`load_left`) times the right side at `right`
// (rows `right_stride` bytes apart), through tile 4 + t. (GCC's tile intrinsics take their
// tiles' numbers as written.)
template <int t>
__attribute__((target("amx-tile,amx-bf16"))) inline void multiply_into(const void* right, int64_t right_stride) {
  static_assert(t >= 0 && t < 3, "three sums");
  if constexpr (t == 0) {
    _tile_loadd(4, right, right_stride);
    _tile_dpbf16ps(0, 3, 4);
  } else if constexpr (t == 1) {
    _tile_loadd(5, right, right_stride);
    _tile_dpbf16ps(1, 3, 5);
  } else {
    _tile_loadd(6, right, right_stride);
    _tile_dpbf16ps(2, 3, 6);
  }
}

// Each of the sums += the left side at `left` times its own of three right sides, `right_step`
// bytes apart, each with rows `right_stride` bytes apart.
__attribute__((target("amx-tile,amx-bf16"))) inline void multiply_into_three(const void* left, int64_t left_stride,
                                                                             const void* right, int64_t right_step,
                                                                             int64_t right_stride) {
  const char* r = static_cast<const char*>(right);
  load_left(left, left_stride);
  multiply_into<0>(r, right_stride);
  multiply_into<1>(r + right_step, right_stride);
  multiply_into<2>(r + 2 * right_step, right_stride);
}

// The sums as 16 rows (or fewer, as configured) of 16 float32 each, 64 bytes a row.
__attribute__((target("amx-tile"))) inline void store_sums(float (&sums)[3][kAmxRows * 16]) {
  _tile_stored(0, sums[0], 64);
  _tile_stored(1, sums[1], 64);
  _tile_stored(2, sums[2], 64);
}

inline void compiler_fence() { __asm__ volatile("" ::: "memory"); }

}  // namespace qwencodec
