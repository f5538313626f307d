#ifndef TRELLIS_CLIBEDIT_SHIM_H
#define TRELLIS_CLIBEDIT_SHIM_H
#include <stdio.h>
#include <wchar.h>
#include <histedit.h>

/// el_set and history are variadic, which Swift does not import: one typed shim per use.

/// el_init on the process's standard input, output and error (C globals Swift 6 refuses to read).
static inline EditLine *trellis_el_init_std(const char *program) { return el_init(program, stdin, stdout, stderr); }

typedef char *(*trellis_el_prompt_fn)(EditLine *);
typedef unsigned char (*trellis_el_command_fn)(EditLine *, int);
typedef int (*trellis_el_getc_fn)(EditLine *, wchar_t *);

static inline int trellis_el_set_prompt(EditLine *e, trellis_el_prompt_fn f) { return el_set(e, EL_PROMPT, f); }
static inline int trellis_el_set_editor(EditLine *e, const char *mode) { return el_set(e, EL_EDITOR, mode); }
static inline int trellis_el_set_signal(EditLine *e, int on) { return el_set(e, EL_SIGNAL, on); }
static inline int trellis_el_set_history(EditLine *e, History *h) { return el_set(e, EL_HIST, history, h); }
static inline int trellis_el_set_getc(EditLine *e, trellis_el_getc_fn f) { return el_set(e, EL_GETCFN, f); }
static inline int trellis_el_set_clientdata(EditLine *e, void *data) { return el_set(e, EL_CLIENTDATA, data); }
static inline void *trellis_el_clientdata(EditLine *e) {
    void *data = NULL;
    el_get(e, EL_CLIENTDATA, &data);
    return data;
}
static inline int trellis_el_refresh(EditLine *e) { return el_set(e, EL_REFRESH); }
static inline int trellis_el_addfn(EditLine *e, const char *name, const char *help, trellis_el_command_fn f) {
    return el_set(e, EL_ADDFN, name, help, f);
}
/// `bind KEY COMMAND`.
static inline int trellis_el_bind(EditLine *e, const char *key, const char *command) {
    return el_set(e, EL_BIND, key, command, NULL);
}

static inline int trellis_history_setsize(History *h, int size) {
    HistEvent ev;
    return history(h, &ev, H_SETSIZE, size);
}
static inline int trellis_history_setunique(History *h, int on) {
    HistEvent ev;
    return history(h, &ev, H_SETUNIQUE, on);
}
static inline int trellis_history_enter(History *h, const char *line) {
    HistEvent ev;
    return history(h, &ev, H_ENTER, line);
}
static inline int trellis_history_load(History *h, const char *file) {
    HistEvent ev;
    return history(h, &ev, H_LOAD, file);
}
static inline int trellis_history_save(History *h, const char *file) {
    HistEvent ev;
    return history(h, &ev, H_SAVE, file);
}
#endif
