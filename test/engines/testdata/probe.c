/*
 * probe: what a CUDA program does first. It loads libcuda.so.1 and
 * libnvidia-ml.so.1 by SONAME, so the image's own dynamic loader and its
 * /etc/ld.so.cache decide which files are used, calls into both, and prints
 * what they report and where the loader found them:
 *
 *   cuda 12040 /usr/lib/x86_64-linux-gnu/libcuda.so.1
 *   nvml 550.54.15 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
 *
 * Exit status 1, with the loader's error, when either step fails.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

static const char *where(void *h) {
	struct link_map *lm = 0;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm)
		return "?";
	return lm->l_name;
}

int main(void) {
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
	if (!cuda) {
		printf("probe: %s\n", dlerror());
		return 1;
	}
	int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
	int (*cu_version)(int *) = (int (*)(int *))dlsym(cuda, "cuDriverGetVersion");
	if (!cu_init || !cu_version) {
		printf("probe: libcuda.so.1 lacks cuInit or cuDriverGetVersion\n");
		return 1;
	}
	int v = 0;
	int r1 = cu_init(0), r2 = cu_version(&v);
	if (r1 != 0 || r2 != 0) {
		printf("probe: cuInit=%d cuDriverGetVersion=%d\n", r1, r2);
		return 1;
	}
	printf("cuda %d %s\n", v, where(cuda));

	void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (!nvml) {
		printf("probe: %s\n", dlerror());
		return 1;
	}
	int (*nv_init)(void) = (int (*)(void))dlsym(nvml, "nvmlInit_v2");
	int (*nv_version)(char *, unsigned) = (int (*)(char *, unsigned))dlsym(nvml, "nvmlSystemGetDriverVersion");
	if (!nv_init || !nv_version) {
		printf("probe: libnvidia-ml.so.1 lacks nvmlInit_v2 or nvmlSystemGetDriverVersion\n");
		return 1;
	}
	char d[96] = "";
	r1 = nv_init();
	r2 = nv_version(d, sizeof d);
	if (r1 != 0 || r2 != 0) {
		printf("probe: nvmlInit_v2=%d nvmlSystemGetDriverVersion=%d\n", r1, r2);
		return 1;
	}
	printf("nvml %s %s\n", d, where(nvml));
	return 0;
}
