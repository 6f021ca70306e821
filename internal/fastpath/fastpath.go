//go:build cgo

package fastpath

// #cgo CFLAGS: -O2 -Wall
// #include <stdlib.h>
// #include "fastpath.h"
import "C"

import (
	"runtime"
	"syscall"
	"unsafe"
)

// Enabled is whether this build has the C fast path (cgo).
const Enabled = true

// StartupMillis is the time since the C constructor ran, in milliseconds.
func StartupMillis() float64 {
	return float64(C.gantry_now_ns()-C.gantry_start_ns) / 1e6
}

// RestoreAffinity gives the calling OS thread the CPU affinity the process
// started with, which the C constructor narrows to one CPU for a create
// that Go handles (the Go runtime then starts with one P). Call it just
// before executing the low-level runtime: it locks the goroutine to its
// thread, since the mask is per thread and execve keeps the caller's.
func RestoreAffinity() error {
	runtime.LockOSThread()
	if e := C.gantry_restore_affinity(); e != 0 {
		return syscall.Errno(e)
	}
	return nil
}

// NoRequest is the C fast path's decision on the text of a config.json:
// true means it hands create and run straight to the low-level runtime
// (when the configuration allows it, see ParseConfig).
func NoRequest(spec []byte) bool {
	if len(spec) == 0 {
		return false
	}
	return C.gantry_no_request((*C.char)(unsafe.Pointer(&spec[0])), C.size_t(len(spec))) == 1
}

// ParseConfig is the C reading of a configuration file's text: the
// low-level runtime it names, ok false when the fast path leaves everything
// to Go, and create true when a create without a request may skip Go.
func ParseConfig(text []byte) (lowLevel string, ok, create bool) {
	buf := C.CBytes(append(text, 0))
	defer C.free(buf)
	out := (*C.char)(C.malloc(4096))
	defer C.free(unsafe.Pointer(out))
	r := C.gantry_parse_config((*C.char)(buf), out, 4096)
	if r < 0 {
		return "", false, false
	}
	return C.GoString(out), true, r == 1
}

// list reads a NULL-terminated C string array.
func list(p **C.char) []string {
	var out []string
	for ; *p != nil; p = (**C.char)(unsafe.Add(unsafe.Pointer(p), unsafe.Sizeof(p))) {
		out = append(out, C.GoString(*p))
	}
	return out
}

// Constants are the values fastpath.c copies from Go, for TestConstants.
type Constants struct {
	RequestNeedles, NeutralKeys, RuntimeNames  []string
	HookNames, CTKNames                        []string
	GlobalValueFlags, CreateValueFlags         []string
	ConfigEnv, ConfigDefault, DefaultPath      string
	NoFastPathEnv                              string
	ServerMagic, ServerSocket, ServerSocketEnv string
	ServerFlag, HookMagic                      string
	MaxSpecSize, MaxHookState, MaxStateSize    int64
	// The create server's timeouts, in ms, and its acceptance byte.
	ServerConnectMS, ServerAckMS, ServerAnswerMS int64
	ServerAccepted                               byte
}

// CConstants returns fastpath.c's constants.
func CConstants() Constants {
	return Constants{
		RequestNeedles:   list((**C.char)(unsafe.Pointer(&C.gantry_request_needles))),
		NeutralKeys:      list((**C.char)(unsafe.Pointer(&C.gantry_neutral_keys))),
		RuntimeNames:     list((**C.char)(unsafe.Pointer(&C.gantry_runtime_names))),
		HookNames:        list((**C.char)(unsafe.Pointer(&C.gantry_hook_names))),
		CTKNames:         list((**C.char)(unsafe.Pointer(&C.gantry_ctk_names))),
		GlobalValueFlags: list((**C.char)(unsafe.Pointer(&C.gantry_global_value_flags))),
		CreateValueFlags: list((**C.char)(unsafe.Pointer(&C.gantry_create_value_flags))),
		ConfigEnv:        C.GoString((*C.char)(unsafe.Pointer(&C.gantry_config_env))),
		ConfigDefault:    C.GoString((*C.char)(unsafe.Pointer(&C.gantry_config_default))),
		DefaultPath:      C.GoString((*C.char)(unsafe.Pointer(&C.gantry_default_path))),
		NoFastPathEnv:    C.GoString((*C.char)(unsafe.Pointer(&C.gantry_no_fastpath_env))),
		MaxSpecSize:      int64(C.gantry_max_spec_size),
		ServerMagic:      C.GoString((*C.char)(unsafe.Pointer(&C.gantry_server_magic))),
		ServerSocket:     C.GoString((*C.char)(unsafe.Pointer(&C.gantry_server_socket))),
		ServerSocketEnv:  C.GoString((*C.char)(unsafe.Pointer(&C.gantry_server_socket_env))),
		ServerFlag:       C.GoString((*C.char)(unsafe.Pointer(&C.gantry_server_flag))),
		HookMagic:        C.GoString((*C.char)(unsafe.Pointer(&C.gantry_hook_magic))),
		MaxHookState:     int64(C.gantry_max_hook_state),
		MaxStateSize:     int64(C.gantry_max_state_size),
		ServerConnectMS:  int64(C.gantry_server_connect_ms),
		ServerAckMS:      int64(C.gantry_server_ack_ms),
		ServerAnswerMS:   int64(C.gantry_server_answer_ms),
		ServerAccepted:   byte(C.gantry_server_accepted),
	}
}
