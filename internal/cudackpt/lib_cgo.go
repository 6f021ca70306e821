//go:build cgo && linux && !nonvml

package cudackpt

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// The layouts of cuda.h's argument structs (CUcheckpointLockArgs and the
// rest are 64 bytes; reserved fields must be zero).
typedef struct { unsigned int timeoutMs, reserved0; unsigned long long reserved1[7]; } gantry_lock_args;
typedef struct { unsigned long long reserved[8]; } gantry_plain_args;
typedef struct { unsigned char oldUuid[16], newUuid[16]; } gantry_gpu_pair;
typedef struct { gantry_gpu_pair *gpuPairs; unsigned int gpuPairsCount; char reserved[52]; } gantry_restore_args;

typedef int (*gantry_lock_fn)(int, gantry_lock_args *);
typedef int (*gantry_plain_fn)(int, gantry_plain_args *);
typedef int (*gantry_restore_fn)(int, gantry_restore_args *);
typedef int (*gantry_state_fn)(int, int *);
typedef int (*gantry_init_fn)(unsigned int);
typedef int (*gantry_version_fn)(int *);
typedef int (*gantry_errname_fn)(int, const char **);

static int gantry_call_lock(void *f, int pid, unsigned int timeout) {
	gantry_lock_args a;
	memset(&a, 0, sizeof a);
	a.timeoutMs = timeout;
	return ((gantry_lock_fn)f)(pid, &a);
}
static int gantry_call_plain(void *f, int pid) {
	gantry_plain_args a;
	memset(&a, 0, sizeof a);
	return ((gantry_plain_fn)f)(pid, &a);
}
static int gantry_call_restore(void *f, int pid, gantry_gpu_pair *pairs, unsigned int n) {
	gantry_restore_args a;
	memset(&a, 0, sizeof a);
	a.gpuPairs = pairs;
	a.gpuPairsCount = n;
	return ((gantry_restore_fn)f)(pid, n ? &a : NULL);
}
static int gantry_call_state(void *f, int pid, int *st) { return ((gantry_state_fn)f)(pid, st); }
static int gantry_call_init(void *f) { return ((gantry_init_fn)f)(0); }
static int gantry_call_version(void *f, int *v) { return ((gantry_version_fn)f)(v); }
static const char *gantry_call_errname(void *f, int code) {
	const char *s = NULL;
	if (!f || ((gantry_errname_fn)f)(code, &s) != 0) return NULL;
	return s;
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// PairsVersion is the first CUDA driver API version (cuDriverGetVersion)
// whose restore takes GPU UUID pairs: driver r580 (CUDA 13.0).
const PairsVersion = 13000

type cudaLib struct {
	h                                                 unsafe.Pointer
	lockF, ckptF, restoreF, unlockF, stateF, errnameF unsafe.Pointer
}

func sym(h unsafe.Pointer, name string) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return C.dlsym(h, cs)
}

// load opens libcuda and finds the API; noAPI reports a driver without it.
// A restore calls cuInit first (the driver wants it, or persistence mode,
// to restore).
func load(lib string, restore, pairs bool) (api, bool, error) {
	name := lib
	if name == "" {
		name = "libcuda.so.1"
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	h := C.dlopen(cs, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return nil, false, fmt.Errorf("loading %s: %s", name, C.GoString(C.dlerror()))
	}
	l := &cudaLib{h: h}
	for _, s := range []struct {
		p    *unsafe.Pointer
		name string
	}{
		{&l.lockF, "cuCheckpointProcessLock"}, {&l.ckptF, "cuCheckpointProcessCheckpoint"},
		{&l.restoreF, "cuCheckpointProcessRestore"}, {&l.unlockF, "cuCheckpointProcessUnlock"},
		{&l.stateF, "cuCheckpointProcessGetState"},
	} {
		if *s.p = sym(h, s.name); *s.p == nil {
			C.dlclose(h)
			return nil, true, fmt.Errorf("%s has no %s", name, s.name)
		}
	}
	l.errnameF = sym(h, "cuGetErrorName")
	if pairs {
		var v C.int
		f := sym(h, "cuDriverGetVersion")
		if f == nil || C.gantry_call_version(f, &v) != 0 || int(v) < PairsVersion {
			C.dlclose(h)
			return nil, true, fmt.Errorf("%s reports CUDA %d.%d: restoring onto other GPUs needs %d.%d (driver r580)", name, int(v)/1000, int(v)%1000/10, PairsVersion/1000, PairsVersion%1000/10)
		}
	}
	if restore {
		f := sym(h, "cuInit")
		if f == nil {
			C.dlclose(h)
			return nil, false, fmt.Errorf("%s has no cuInit", name)
		}
		if r := C.gantry_call_init(f); r != 0 {
			C.dlclose(h)
			return nil, false, fmt.Errorf("cuInit: %s (CUresult %d)", l.name(int(r)), int(r))
		}
	}
	return l, false, nil
}

func (l *cudaLib) name(code int) string {
	if s := C.gantry_call_errname(l.errnameF, C.int(code)); s != nil {
		return C.GoString(s)
	}
	return fmt.Sprintf("CUDA error %d", code)
}

func (l *cudaLib) result(r C.int) (int, string) {
	if r == 0 {
		return 0, ""
	}
	return int(r), l.name(int(r))
}

func (l *cudaLib) lock(pid int, timeoutMS uint) (int, string) {
	return l.result(C.gantry_call_lock(l.lockF, C.int(pid), C.uint(timeoutMS)))
}
func (l *cudaLib) checkpoint(pid int) (int, string) {
	return l.result(C.gantry_call_plain(l.ckptF, C.int(pid)))
}
func (l *cudaLib) unlock(pid int) (int, string) {
	return l.result(C.gantry_call_plain(l.unlockF, C.int(pid)))
}

func (l *cudaLib) restore(pid int, pairs [][2][16]byte) (int, string) {
	if len(pairs) == 0 {
		return l.result(C.gantry_call_restore(l.restoreF, C.int(pid), nil, 0))
	}
	// C memory: the array is handed to the driver.
	n := len(pairs)
	p := (*C.gantry_gpu_pair)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.gantry_gpu_pair{}))))
	defer C.free(unsafe.Pointer(p))
	arr := unsafe.Slice(p, n)
	for i, pr := range pairs {
		for j := 0; j < 16; j++ {
			arr[i].oldUuid[j] = C.uchar(pr[0][j])
			arr[i].newUuid[j] = C.uchar(pr[1][j])
		}
	}
	return l.result(C.gantry_call_restore(l.restoreF, C.int(pid), p, C.uint(n)))
}

func (l *cudaLib) state(pid int) (int, int, string) {
	var st C.int
	code, name := l.result(C.gantry_call_state(l.stateF, C.int(pid), &st))
	return int(st), code, name
}

func (l *cudaLib) close() { C.dlclose(l.h) }
