/*
 * cuda-check: proves that a container can use its GPUs through the CUDA
 * driver API. It loads libcuda.so.1 the way CUDA programs do (dlopen by
 * SONAME, so the dynamic loader's normal rules decide which file is used),
 * then on every visible device creates a context, JIT-compiles an embedded PTX
 * kernel, runs it over N integers (out[i] = A*i + B) and checks every element
 * on the host.
 *
 * Built without CUDA headers or libraries, so any machine with gcc can build
 * it (the types and constants below are the driver API's documented ABI):
 *
 *   gcc -O2 -Wall -o bin/cuda-check scripts/cuda-check.c -ldl
 *
 * Usage:
 *   cuda-check               run the kernel on every visible device
 *   cuda-check --load-only [--hold SECONDS]
 *                            only dlopen libcuda.so.1, cuInit, cuDriverGetVersion
 *                            (for the fake driver of `gantry sim driver-root`),
 *                            then keep libcuda loaded SECONDS seconds (a CUDA
 *                            process to checkpoint)
 *   cuda-check --mem MIB[,MIB...] [--hold SECONDS]
 *                            also, on each device after the kernel, print the
 *                            memory cuMemGetInfo reports and try to allocate
 *                            each MIB MiB in turn ("alloc MIB MiB: ok" or the
 *                            error; not a failure: an MPS client's memory limit
 *                            shows this way), then keep the context SECONDS
 *                            seconds (two clients of one MPS server at once)
 *
 * Output: one "cuda-check: device ..." line per device (index, name, UUID, PCI
 * bus id), then "cuda-check: OK ...". Exit status 0 on success, 1 on any
 * failure, with a one-line error naming the call and the CUresult.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct { unsigned char bytes[16]; } CUuuid;

/* CUjit_option values used with cuModuleLoadDataEx to get the JIT's log. */
enum { CU_JIT_ERROR_LOG_BUFFER = 5, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6 };

#define N_ELEMS (1u << 20)
#define MUL_A 3u
#define ADD_B 7u

/*
 * fill(out, n, a, b): out[i] = a*i + b for i < n, one thread per element.
 * PTX ISA 7.0 for sm_50 is JIT-compiled by every current driver for the GPU
 * it runs on (Hopper included), so one string serves all devices.
 */
static const char ptx[] =
	".version 7.0\n"
	".target sm_50\n"
	".address_size 64\n"
	"\n"
	".visible .entry fill(\n"
	"	.param .u64 p_out,\n"
	"	.param .u32 p_n,\n"
	"	.param .u32 p_a,\n"
	"	.param .u32 p_b\n"
	")\n"
	"{\n"
	"	.reg .pred %p<2>;\n"
	"	.reg .b32 %r<9>;\n"
	"	.reg .b64 %rd<5>;\n"
	"\n"
	"	ld.param.u64 %rd1, [p_out];\n"
	"	ld.param.u32 %r1, [p_n];\n"
	"	ld.param.u32 %r2, [p_a];\n"
	"	ld.param.u32 %r3, [p_b];\n"
	"	mov.u32 %r4, %ctaid.x;\n"
	"	mov.u32 %r5, %ntid.x;\n"
	"	mov.u32 %r6, %tid.x;\n"
	"	mad.lo.u32 %r7, %r4, %r5, %r6;\n"
	"	setp.ge.u32 %p1, %r7, %r1;\n"
	"	@%p1 bra DONE;\n"
	"	mad.lo.u32 %r8, %r7, %r2, %r3;\n"
	"	cvta.to.global.u64 %rd2, %rd1;\n"
	"	mul.wide.u32 %rd3, %r7, 4;\n"
	"	add.s64 %rd4, %rd2, %rd3;\n"
	"	st.global.u32 [%rd4], %r8;\n"
	"DONE:\n"
	"	ret;\n"
	"}\n";

static void *lib;
static CUresult (*pGetErrorName)(CUresult, const char **);
static CUresult (*pGetErrorString)(CUresult, const char **);

static void fail(const char *fmt, ...)
{
	va_list ap;
	fputs("cuda-check: FAIL: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

/* sym resolves a driver API entry point or fails naming it. */
static void *sym(const char *name)
{
	void *p = dlsym(lib, name);
	if (!p)
		fail("libcuda.so.1 has no symbol %s (%s): not a usable NVIDIA driver library", name, dlerror());
	return p;
}

/* check turns a CUresult into success or a one-line error naming the call. */
static void check(CUresult r, const char *call)
{
	const char *name = NULL, *desc = NULL;
	if (r == 0)
		return;
	if (pGetErrorName)
		pGetErrorName(r, &name);
	if (pGetErrorString)
		pGetErrorString(r, &desc);
	fail("%s: CUresult %d (%s: %s)", call, r, name ? name : "?", desc ? desc : "no description");
}

static void format_uuid(const CUuuid *u, char *out, size_t len)
{
	const unsigned char *b = u->bytes;
	snprintf(out, len,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
		 b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

int main(int argc, char **argv)
{
	int load_only = 0, ndev = 0, version = 0, i;
	long probe_mib[4], hold = 0;
	int nprobe = 0;
	Dl_info info;
	CUresult (*cuInit)(unsigned);
	CUresult (*cuDriverGetVersion)(int *);

	for (i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--load-only") == 0) {
			load_only = 1;
		} else if (strcmp(argv[i], "--mem") == 0 && i + 1 < argc) {
			char *p = argv[++i];
			while (nprobe < 4 && *p) {
				probe_mib[nprobe++] = strtol(p, &p, 10);
				if (*p == ',')
					p++;
				else
					break;
			}
		} else if (strcmp(argv[i], "--hold") == 0 && i + 1 < argc) {
			hold = strtol(argv[++i], NULL, 10);
		} else {
			fprintf(stderr, "usage: cuda-check [--load-only [--hold SECONDS]] [--mem MIB [--hold SECONDS]]\n");
			return 2;
		}
	}

	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		fail("cannot load libcuda.so.1: %s (no NVIDIA driver library is visible here: "
		     "on a host install the driver; in a container request GPUs, e.g. NVIDIA_VISIBLE_DEVICES=all)",
		     dlerror());
	pGetErrorName = (CUresult (*)(CUresult, const char **))dlsym(lib, "cuGetErrorName");
	pGetErrorString = (CUresult (*)(CUresult, const char **))dlsym(lib, "cuGetErrorString");
	cuInit = (CUresult (*)(unsigned))sym("cuInit");
	cuDriverGetVersion = (CUresult (*)(int *))sym("cuDriverGetVersion");
	/* The file the loader chose, links resolved: its name carries the driver version. */
	static char real[4096];
	const char *path = "libcuda.so.1";
	if (dladdr((void *)cuInit, &info) && info.dli_fname)
		path = realpath(info.dli_fname, real) ? real : info.dli_fname;

	check(cuInit(0), "cuInit");
	check(cuDriverGetVersion(&version), "cuDriverGetVersion");
	if (load_only) {
		printf("cuda-check: OK cuInit succeeded, driver-api=%d.%d libcuda=%s\n",
		       version / 1000, (version % 1000) / 10, path);
		fflush(stdout);
		/* sleep returns early when interrupted: a CRIU dump ends an
		 * interrupted sleep with EINTR. */
		for (unsigned left = hold > 0 ? (unsigned)hold : 0; left > 0;)
			left = sleep(left);
		return 0;
	}

	CUresult (*cuDeviceGetCount)(int *) = sym("cuDeviceGetCount");
	CUresult (*cuDeviceGet)(CUdevice *, int) = sym("cuDeviceGet");
	CUresult (*cuDeviceGetName)(char *, int, CUdevice) = sym("cuDeviceGetName");
	CUresult (*cuDeviceGetUuid)(CUuuid *, CUdevice) = sym("cuDeviceGetUuid");
	CUresult (*cuDeviceGetPCIBusId)(char *, int, CUdevice) = sym("cuDeviceGetPCIBusId");
	CUresult (*cuCtxCreate)(CUcontext *, unsigned, CUdevice) = sym("cuCtxCreate_v2");
	CUresult (*cuCtxDestroy)(CUcontext) = sym("cuCtxDestroy_v2");
	CUresult (*cuCtxSynchronize)(void) = sym("cuCtxSynchronize");
	CUresult (*cuModuleLoadDataEx)(CUmodule *, const void *, unsigned, int *, void **) = sym("cuModuleLoadDataEx");
	CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) = sym("cuModuleGetFunction");
	CUresult (*cuModuleUnload)(CUmodule) = sym("cuModuleUnload");
	CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
	CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree_v2");
	CUresult (*cuMemsetD32)(CUdeviceptr, unsigned, size_t) = sym("cuMemsetD32_v2");
	CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = sym("cuMemcpyDtoH_v2");
	CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym("cuMemGetInfo_v2");
	CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				   unsigned, CUstream, void **, void **) = sym("cuLaunchKernel");

	check(cuDeviceGetCount(&ndev), "cuDeviceGetCount");
	if (ndev == 0)
		fail("cuDeviceGetCount: no CUDA devices visible (driver API %d.%d loaded from %s)",
		     version / 1000, (version % 1000) / 10, path);

	uint32_t *host = malloc(N_ELEMS * sizeof *host);
	if (!host)
		fail("out of memory");
	for (i = 0; i < ndev; i++) {
		CUdevice dev;
		CUcontext ctx;
		CUmodule mod;
		CUfunction fn;
		CUdeviceptr out;
		CUuuid uuid;
		char name[256], bus[64], uuidstr[64], jitlog[4096] = "";
		char call[64];
		int jitopt[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
		void *jitval[2] = {jitlog, (void *)(uintptr_t)sizeof jitlog};
		unsigned n = N_ELEMS, a = MUL_A, b = ADD_B, threads = 256;
		void *params[] = {&out, &n, &a, &b};
		CUresult r;

		snprintf(call, sizeof call, "cuDeviceGet(%d)", i);
		check(cuDeviceGet(&dev, i), call);
		check(cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
		check(cuDeviceGetUuid(&uuid, dev), "cuDeviceGetUuid");
		check(cuDeviceGetPCIBusId(bus, sizeof bus, dev), "cuDeviceGetPCIBusId");
		format_uuid(&uuid, uuidstr, sizeof uuidstr);
		printf("cuda-check: device %d: %s (UUID: %s) bus %s\n", i, name, uuidstr, bus);
		fflush(stdout);

		check(cuCtxCreate(&ctx, 0, dev), "cuCtxCreate_v2");
		r = cuModuleLoadDataEx(&mod, ptx, 2, jitopt, jitval);
		if (r != 0 && jitlog[0])
			fprintf(stderr, "cuda-check: PTX JIT log: %s\n", jitlog);
		check(r, "cuModuleLoadDataEx (PTX JIT)");
		check(cuModuleGetFunction(&fn, mod, "fill"), "cuModuleGetFunction(fill)");
		check(cuMemAlloc(&out, N_ELEMS * sizeof *host), "cuMemAlloc_v2");
		/* Poison the buffer so a kernel that did not run cannot pass. */
		check(cuMemsetD32(out, 0xdeadbeef, N_ELEMS), "cuMemsetD32_v2");
		check(cuLaunchKernel(fn, (N_ELEMS + threads - 1) / threads, 1, 1, threads, 1, 1, 0, NULL, params, NULL),
		      "cuLaunchKernel");
		check(cuCtxSynchronize(), "cuCtxSynchronize");
		memset(host, 0, N_ELEMS * sizeof *host);
		check(cuMemcpyDtoH(host, out, N_ELEMS * sizeof *host), "cuMemcpyDtoH_v2");
		for (uint32_t k = 0; k < N_ELEMS; k++) {
			uint32_t want = MUL_A * k + ADD_B;
			if (host[k] != want)
				fail("device %d (%s): out[%u] = %u, want %u: the kernel's result is wrong",
				     i, name, k, host[k], want);
		}
		check(cuMemFree(out), "cuMemFree_v2");
		if (nprobe > 0) {
			size_t mfree = 0, mtotal = 0;
			check(cuMemGetInfo(&mfree, &mtotal), "cuMemGetInfo_v2");
			printf("cuda-check: device %d: memory total=%zu MiB free=%zu MiB\n", i, mtotal >> 20, mfree >> 20);
			for (int k = 0; k < nprobe; k++) {
				CUdeviceptr big;
				const char *en = "?";
				r = cuMemAlloc(&big, (size_t)probe_mib[k] << 20);
				if (r == 0) {
					printf("cuda-check: device %d: alloc %ld MiB: ok\n", i, probe_mib[k]);
					check(cuMemFree(big), "cuMemFree_v2");
				} else {
					if (pGetErrorName)
						pGetErrorName(r, &en);
					printf("cuda-check: device %d: alloc %ld MiB: %s\n", i, probe_mib[k], en);
				}
			}
			fflush(stdout);
			/* The whole hold, as with --load-only: a CRIU dump (a
			 * checkpoint with --leave-running) ends an interrupted
			 * sleep early, and the calls below would then run
			 * while the CUDA state is checkpointed. */
			for (unsigned left = hold > 0 ? (unsigned)hold : 0; left > 0;)
				left = sleep(left);
		}
		check(cuModuleUnload(mod), "cuModuleUnload");
		check(cuCtxDestroy(ctx), "cuCtxDestroy_v2");
		printf("cuda-check: device %d: kernel out[i] = %u*i + %u over %u ints: all correct\n",
		       i, MUL_A, ADD_B, N_ELEMS);
	}
	free(host);
	printf("cuda-check: OK devices=%d driver-api=%d.%d libcuda=%s\n",
	       ndev, version / 1000, (version % 1000) / 10, path);
	return 0;
}
