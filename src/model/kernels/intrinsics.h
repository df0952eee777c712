// The x86 intrinsics, included before anything else (libtorch's headers include them too):
// GCC 12 warns that the AVX-512 intrinsics' own `__Y = __Y` is used uninitialized wherever they
// are inlined (GCC bug 105593, fixed in GCC 13), a false alarm we silence for their lines only.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
