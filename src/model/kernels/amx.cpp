// Whether the kernels may multiply in AMX tiles here (see amx.h).

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

extern "C" {

// Whether this CPU has AMX-BF16 and the kernel lets this process use its tiles (Linux asks each
// process to request them: without, their first instruction is fatal). Once per process.
bool qwencodec_amx_bf16() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;
  if ((edx & (kAmxBf16 | kAmxTile)) != (kAmxBf16 | kAmxTile)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // extern "C"
