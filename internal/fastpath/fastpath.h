//go:build cgo

// The C half of package fastpath (fastpath.c): what Go calls, for the log's
// start-up time and for the tests that hold the C decisions against Go's.
#ifndef GANTRY_FASTPATH_H
#define GANTRY_FASTPATH_H
#include <stddef.h>

extern long long gantry_start_ns;
long long gantry_now_ns(void);

// gantry_restore_affinity gives the calling thread back the CPU affinity
// the process started with, when the constructor narrowed it for a create
// that Go handles; 0 or an errno.
int gantry_restore_affinity(void);

// gantry_no_request: 1 when the text of a config.json cannot hold a GPU request.
int gantry_no_request(const char *buf, size_t len);

// gantry_parse_config parses configuration text (NUL-terminated, modified in
// place): low-level (size bytes) gets runtime.low-level ("runc" by default).
// Returns -1 when the file is left to Go (the pass-through gives up), 0 when
// low-level is known but the file may change what a request is (create goes
// to Go), 1 when low-level is known and every key is one that cannot.
int gantry_parse_config(char *text, char *low_level, size_t size);

// The constants copied from Go, NULL-terminated, for the pinning test.
extern const char *const gantry_request_needles[];
extern const char *const gantry_neutral_keys[];
extern const char *const gantry_runtime_names[];
extern const char *const gantry_hook_names[];
extern const char *const gantry_ctk_names[];
extern const char *const gantry_global_value_flags[];
extern const char *const gantry_create_value_flags[];
extern const char gantry_config_env[], gantry_config_default[], gantry_default_path[], gantry_no_fastpath_env[];
extern const long long gantry_max_spec_size;
extern const char gantry_server_magic[], gantry_server_socket[], gantry_server_socket_env[], gantry_server_flag[];
extern const char gantry_hook_magic[];
extern const long long gantry_max_hook_state, gantry_max_state_size;
extern const long long gantry_server_connect_ms, gantry_server_ack_ms, gantry_server_answer_ms;
extern const char gantry_server_accepted;
#endif
