#ifndef TETHER_BENCH_SQLITE_SHIM_H
#define TETHER_BENCH_SQLITE_SHIM_H
// Debian's libsqlite3 is built with the session extension and the pre-update
// hook (the patchset baselines use them); their declarations are only visible
// with these defined.
#define SQLITE_ENABLE_SESSION 1
#define SQLITE_ENABLE_PREUPDATE_HOOK 1
#include <sqlite3.h>

// SQLITE_TRANSIENT is a cast of -1 to a function pointer, which Swift cannot
// import as a macro.
static inline sqlite3_destructor_type bench_sqlite_transient(void) { return SQLITE_TRANSIENT; }
#endif
