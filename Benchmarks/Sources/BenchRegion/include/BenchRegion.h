#ifndef BENCH_REGION_H
#define BENCH_REGION_H

/// Calls body(context): the timed part of every benchmark line runs inside this function, so
/// that the instruction-count mode can tell callgrind to count only there
/// (--toggle-collect=tether_bench_measured_region). In C, in a file of its own, so that the
/// Swift optimizer can neither inline it nor copy it under other names (it does both to a
/// Swift function taking a closure, even one marked @inline(never)).
void tether_bench_measured_region(void (*body)(void *context), void *context);

#endif
