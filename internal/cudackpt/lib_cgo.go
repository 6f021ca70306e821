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
// The probe's CUDA process: device, context and memory calls.
typedef int (*gantry_int_fn)(int *);
typedef int (*gantry_devget_fn)(int *, int);
typedef int (*gantry_uuid_fn)(unsigned char *, int);
typedef int (*gantry_name_fn)(char *, int, int);
typedef int (*gantry_retain_fn)(void **, int);
typedef int (*gantry_setcur_fn)(void *);
typedef int (*gantry_alloc_fn)(unsigned long long *, size_t);
typedef int (*gantry_htod_fn)(unsigned long long, const void *, size_t);
typedef int (*gantry_dtoh_fn)(void *, unsigned long long, size_t);
static int gantry_call_int(void *f, int *v) { return ((gantry_int_fn)f)(v); }
static int gantry_call_devget(void *f, int *d, int i) { return ((gantry_devget_fn)f)(d, i); }
static int gantry_call_uuid(void *f, unsigned char *u, int d) { return ((gantry_uuid_fn)f)(u, d); }
static int gantry_call_name(void *f, char *n, int len, int d) { return ((gantry_name_fn)f)(n, len, d); }
static int gantry_call_retain(void *f, void **c, int d) { return ((gantry_retain_fn)f)(c, d); }
static int gantry_call_setcur(void *f, void *c) { return ((gantry_setcur_fn)f)(c); }
static int gantry_call_alloc(void *f, unsigned long long *p, size_t n) { return ((gantry_alloc_fn)f)(p, n); }
static int gantry_call_htod(void *f, unsigned long long d, const void *s, size_t n) { return ((gantry_htod_fn)f)(d, s, n); }
static int gantry_call_dtoh(void *f, void *d, unsigned long long s, size_t n) { return ((gantry_dtoh_fn)f)(d, s, n); }
static const char *gantry_call_errname(void *f, int code) {
	const char *s = NULL;
	if (!f || ((gantry_errname_fn)f)(code, &s) != 0) return NULL;
	return s;
}
*/
import "C"

import (
	"fmt"
	"strings"
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

// cudaVersion is cuDriverGetVersion's answer (0 when it has none).
func (l *cudaLib) cudaVersion() int {
	var v C.int
	if f := sym(l.h, "cuDriverGetVersion"); f == nil || C.gantry_call_version(f, &v) != 0 {
		return 0
	}
	return int(v)
}

// call finds a function of the library, for the probe's CUDA process.
func (l *cudaLib) fn(names ...string) (unsafe.Pointer, error) {
	for _, n := range names {
		if f := sym(l.h, n); f != nil {
			return f, nil
		}
	}
	return nil, fmt.Errorf("libcuda has no %s", strings.Join(names, " or "))
}

// cudaErr is a failed call of the probe's process.
func (l *cudaLib) cudaErr(call string, r C.int) error {
	return fmt.Errorf("%s: %s (CUresult %d)", call, l.name(int(r)), int(r))
}

// childGPUs lists the GPUs CUDA shows this process, in ordinal order.
func (l *cudaLib) childGPUs() ([]probeGPU, error) {
	countF, err := l.fn("cuDeviceGetCount")
	if err != nil {
		return nil, err
	}
	getF, err := l.fn("cuDeviceGet")
	if err != nil {
		return nil, err
	}
	uuidF, err := l.fn("cuDeviceGetUuid_v2", "cuDeviceGetUuid")
	if err != nil {
		return nil, err
	}
	nameF, err := l.fn("cuDeviceGetName")
	if err != nil {
		return nil, err
	}
	var n C.int
	if r := C.gantry_call_int(countF, &n); r != 0 {
		return nil, l.cudaErr("cuDeviceGetCount", r)
	}
	var out []probeGPU
	for i := 0; i < int(n); i++ {
		var d C.int
		if r := C.gantry_call_devget(getF, &d, C.int(i)); r != 0 {
			return nil, l.cudaErr("cuDeviceGet", r)
		}
		var u [16]C.uchar
		if r := C.gantry_call_uuid(uuidF, &u[0], d); r != 0 {
			return nil, l.cudaErr("cuDeviceGetUuid", r)
		}
		var name [256]C.char
		if r := C.gantry_call_name(nameF, &name[0], 256, d); r != 0 {
			return nil, l.cudaErr("cuDeviceGetName", r)
		}
		var b [16]byte
		for j := range b {
			b[j] = byte(u[j])
		}
		out = append(out, probeGPU{UUID: uuidString(b), Name: C.GoString(&name[0])})
	}
	return out, nil
}

// probeMem is the probe process's GPU buffer and the pattern in it.
type probeMem struct {
	ptr  C.ulonglong
	want []byte
}

// childContext makes a context on GPU ordinal and fills a buffer there.
func (l *cudaLib) childContext(ordinal int) (any, error) {
	getF, err := l.fn("cuDeviceGet")
	if err != nil {
		return nil, err
	}
	retainF, err := l.fn("cuDevicePrimaryCtxRetain")
	if err != nil {
		return nil, err
	}
	setF, err := l.fn("cuCtxSetCurrent")
	if err != nil {
		return nil, err
	}
	allocF, err := l.fn("cuMemAlloc_v2")
	if err != nil {
		return nil, err
	}
	htodF, err := l.fn("cuMemcpyHtoD_v2")
	if err != nil {
		return nil, err
	}
	var d C.int
	if r := C.gantry_call_devget(getF, &d, C.int(ordinal)); r != 0 {
		return nil, l.cudaErr("cuDeviceGet", r)
	}
	var ctx unsafe.Pointer
	if r := C.gantry_call_retain(retainF, &ctx, d); r != 0 {
		return nil, l.cudaErr("cuDevicePrimaryCtxRetain", r)
	}
	if r := C.gantry_call_setcur(setF, ctx); r != 0 {
		return nil, l.cudaErr("cuCtxSetCurrent", r)
	}
	m := &probeMem{want: make([]byte, 4096)}
	for i := range m.want {
		m.want[i] = byte(i*7 + 3)
	}
	if r := C.gantry_call_alloc(allocF, &m.ptr, C.size_t(len(m.want))); r != 0 {
		return nil, l.cudaErr("cuMemAlloc", r)
	}
	src := C.CBytes(m.want)
	defer C.free(src)
	if r := C.gantry_call_htod(htodF, m.ptr, src, C.size_t(len(m.want))); r != 0 {
		return nil, l.cudaErr("cuMemcpyHtoD", r)
	}
	return m, nil
}

// childCheck reports the GPU the context is on now and whether the
// buffer kept its pattern.
func (l *cudaLib) childCheck(mem any) (string, bool, error) {
	m := mem.(*probeMem)
	curF, err := l.fn("cuCtxGetDevice")
	if err != nil {
		return "", false, err
	}
	uuidF, err := l.fn("cuDeviceGetUuid_v2", "cuDeviceGetUuid")
	if err != nil {
		return "", false, err
	}
	dtohF, err := l.fn("cuMemcpyDtoH_v2")
	if err != nil {
		return "", false, err
	}
	var d C.int
	if r := C.gantry_call_int(curF, &d); r != 0 {
		return "", false, l.cudaErr("cuCtxGetDevice", r)
	}
	var u [16]C.uchar
	if r := C.gantry_call_uuid(uuidF, &u[0], d); r != 0 {
		return "", false, l.cudaErr("cuDeviceGetUuid", r)
	}
	var b [16]byte
	for j := range b {
		b[j] = byte(u[j])
	}
	dst := C.malloc(C.size_t(len(m.want)))
	defer C.free(dst)
	if r := C.gantry_call_dtoh(dtohF, dst, m.ptr, C.size_t(len(m.want))); r != 0 {
		return uuidString(b), false, l.cudaErr("cuMemcpyDtoH", r)
	}
	got := C.GoBytes(dst, C.int(len(m.want)))
	return uuidString(b), string(got) == string(m.want), nil
}

// childLoad loads libcuda and initialises it, for the probe's process.
func childLoad(lib string) (probeLib, error) {
	a, _, err := load(lib, true, false)
	if err != nil {
		return nil, err
	}
	return a.(*cudaLib), nil
}

// parentLoad loads libcuda for the probe's calls; noAPI reports a driver
// without the checkpoint API or GPU pairs.
func parentLoad(lib string) (probeLib, bool, error) {
	a, noAPI, err := load(lib, true, true)
	if err != nil {
		return nil, noAPI, err
	}
	return a.(*cudaLib), false, nil
}
