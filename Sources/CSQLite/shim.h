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
/// The `documents` table's row key (docs/ARCHITECTURE.md, "The row key"): `trellis_key(collection, id)`
/// is the collection's length in bytes in decimal, `:`, the collection, `:`, the `_id` key;
/// `trellis_key_end(collection)` is the same prefix with `;` in place of the last `:`, so the
/// keys of one collection are exactly those in `[trellis_key(c, ''), trellis_key_end(c))`, in
/// `_id` key order. The length makes the key injective whatever bytes the two strings hold
/// (U+0000 and `:` included). Other values count as their text (a blob as its bytes, as in a
/// damaged row of an earlier store); NULL for a NULL argument.
static inline void trellis_key_build(sqlite3_context *ctx, sqlite3_value *c, sqlite3_value *id, int end) {
    if (sqlite3_value_type(c) == SQLITE_NULL || (!end && sqlite3_value_type(id) == SQLITE_NULL)) {
        sqlite3_result_null(ctx);
        return;
    }
    const unsigned char *cp = sqlite3_value_text(c);
    int cn = sqlite3_value_bytes(c);
    const unsigned char *ip = end ? (const unsigned char *)"" : sqlite3_value_text(id);
    int in = end ? 0 : sqlite3_value_bytes(id);
    if (!cp || !ip) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    char rev[24];  /* the length's decimal digits, last first */
    int dn = 0;
    unsigned long long v = (unsigned long long)cn;
    do { rev[dn++] = (char)('0' + v % 10); v /= 10; } while (v);
    sqlite3_int64 total = (sqlite3_int64)dn + 1 + cn + 1 + in;
    char *out = sqlite3_malloc64((sqlite3_uint64)total + 1);
    if (!out) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    char *w = out;
    for (int i = dn - 1; i >= 0; i--) *w++ = rev[i];
    *w++ = ':';
    for (int i = 0; i < cn; i++) *w++ = (char)cp[i];
    *w++ = end ? ';' : ':';
    for (int i = 0; i < in; i++) *w++ = (char)ip[i];
    *w = 0;
    sqlite3_result_text64(ctx, out, (sqlite3_uint64)total, sqlite3_free, SQLITE_UTF8);
}
static void trellis_key_function(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
    (void)argc;
    trellis_key_build(ctx, argv[0], argv[1], 0);
}
static void trellis_key_end_function(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
    (void)argc;
    trellis_key_build(ctx, argv[0], 0, 1);
}
/// Registers `trellis_key` and `trellis_key_end` on a connection; SQLITE_OK or an error code.
static inline int trellis_register_key_functions(sqlite3 *db) {
    int flags = SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_INNOCUOUS;
    int rc = sqlite3_create_function_v2(db, "trellis_key", 2, flags, 0, trellis_key_function, 0, 0, 0);
    if (rc != SQLITE_OK) return rc;
    return sqlite3_create_function_v2(db, "trellis_key_end", 1, flags, 0, trellis_key_end_function, 0, 0, 0);
}
#endif
