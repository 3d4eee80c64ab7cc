#include "BenchRegion.h"

__attribute__((noinline))
void tether_bench_measured_region(void (*body)(void *context), void *context) {
    body(context);
    // Not a tail call: callgrind must see the body return into this function, which it counts
    // in until this function returns.
    __asm__ volatile("" ::: "memory");
}
