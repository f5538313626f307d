#ifndef TRELLIS_CSQLITE_SHIM_H
#define TRELLIS_CSQLITE_SHIM_H
#include <sqlite3.h>

/// SQLITE_TRANSIENT is a macro cast of -1 that Swift does not import.
static inline void trellis_sqlite3_bind_text_transient(sqlite3_stmt *s, int i, const char *p, int n) {
    sqlite3_bind_text(s, i, p, n, SQLITE_TRANSIENT);
}
static inline void trellis_sqlite3_bind_blob_transient(sqlite3_stmt *s, int i, const void *p, int n) {
    sqlite3_bind_blob(s, i, p, n, SQLITE_TRANSIENT);
}
/// sqlite3_config is variadic, which Swift does not call: SQLITE_CONFIG_MEMSTATUS alone.
static inline int trellis_sqlite3_config_memstatus(int on) {
    return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, on);
}
#endif
