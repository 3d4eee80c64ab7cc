#ifndef TETHER_CLZ4_SHIM_H
#define TETHER_CLZ4_SHIM_H
#include <lz4.h>
#endif
