#ifndef TETHER_CSQLITE_SHIM_H
#define TETHER_CSQLITE_SHIM_H
// Debian's libsqlite3 is built with the session extension and the pre-update
// hook; their declarations are only visible with these defined.
#define SQLITE_ENABLE_SESSION 1
#define SQLITE_ENABLE_PREUPDATE_HOOK 1
#include <sqlite3.h>

// SQLITE_TRANSIENT and SQLITE_STATIC are casts of integers to function
// pointers, which Swift cannot import as macros.
static inline sqlite3_destructor_type tether_sqlite_transient(void) { return SQLITE_TRANSIENT; }
static inline sqlite3_destructor_type tether_sqlite_static(void) { return SQLITE_STATIC; }

// Extended result codes are macros built with shifts, which Swift does not import.
static const int TETHER_SQLITE_CONSTRAINT_UNIQUE = SQLITE_CONSTRAINT_UNIQUE;
static const int TETHER_SQLITE_CONSTRAINT_PRIMARYKEY = SQLITE_CONSTRAINT_PRIMARYKEY;
static const int TETHER_SQLITE_CONSTRAINT_NOTNULL = SQLITE_CONSTRAINT_NOTNULL;
static const int TETHER_SQLITE_CONSTRAINT_CHECK = SQLITE_CONSTRAINT_CHECK;
static const int TETHER_SQLITE_CONSTRAINT_FOREIGNKEY = SQLITE_CONSTRAINT_FOREIGNKEY;
static const int TETHER_SQLITE_CONSTRAINT_DATATYPE = SQLITE_CONSTRAINT_DATATYPE;
static const int TETHER_SQLITE_CONSTRAINT_TRIGGER = SQLITE_CONSTRAINT_TRIGGER;

// sqlite3_db_config is variadic, which Swift cannot call: whether this connection's statements
// run the schema's triggers (TEMP triggers always run).
static inline int tether_sqlite_enable_triggers(sqlite3 *db, int enabled) {
    return sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_TRIGGER, enabled, (int *)0);
}
// SQLite's way to empty a database in place (https://sqlite.org/c3ref/c_dbconfig_defensive.html#sqlitedbconfigresetdatabase):
// on, then VACUUM, then off. Other connections see an empty database, not a deleted file.
static inline int tether_sqlite_reset_database(sqlite3 *db, int on) {
    return sqlite3_db_config(db, SQLITE_DBCONFIG_RESET_DATABASE, on, (int *)0);
}
#endif
