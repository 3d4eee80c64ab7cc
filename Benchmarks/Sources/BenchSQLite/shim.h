#ifndef TETHER_BENCH_SQLITE_SHIM_H
#define TETHER_BENCH_SQLITE_SHIM_H
#include <sqlite3.h>

// SQLITE_TRANSIENT is a cast of -1 to a function pointer, which Swift cannot
// import as a macro.
static inline sqlite3_destructor_type bench_sqlite_transient(void) { return SQLITE_TRANSIENT; }
#endif
