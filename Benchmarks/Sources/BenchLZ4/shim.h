#ifndef TETHER_BENCH_LZ4_SHIM_H
#define TETHER_BENCH_LZ4_SHIM_H
#include <lz4.h>
#endif
