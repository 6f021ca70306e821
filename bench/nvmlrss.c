// nvmlrss: the memory a process holds once NVML is up, and nothing else, for
// bench/device-plugin-footprint.sh: the floor under any device plugin that
// uses NVML (Gantry's and NVIDIA's both). It loads libnvidia-ml.so.1,
// initialises it, asks for every GPU's handle and UUID (what a plugin does at
// start), and prints VmRSS with its file and anonymous parts in MiB.
//
//   gcc -O2 -o bin/nvmlrss bench/nvmlrss.c -ldl     (make gpu-e2e builds it)
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static void rss(const char *when) {
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long rss = -1, file = -1, anon = -1;
	if (!f) return;
	while (fgets(line, sizeof line, f)) {
		sscanf(line, "VmRSS: %ld", &rss);
		sscanf(line, "RssFile: %ld", &file);
		sscanf(line, "RssAnon: %ld", &anon);
	}
	fclose(f);
	printf("%-28s VmRSS %6.1f MiB  (file %.1f MiB, anon %.1f MiB)\n", when, rss / 1024.0, file / 1024.0, anon / 1024.0);
}

int main(void) {
	rss("nvmlrss before NVML");
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (!h) {
		fprintf(stderr, "nvmlrss: %s\n", dlerror());
		return 2;
	}
	int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
	int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
	int (*handle)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
	int (*uuid)(void *, char *, unsigned) = (int (*)(void *, char *, unsigned))dlsym(h, "nvmlDeviceGetUUID");
	if (!init || !count || !handle || !uuid || init() != 0) {
		fprintf(stderr, "nvmlrss: NVML did not initialise\n");
		return 2;
	}
	unsigned n = 0;
	count(&n);
	for (unsigned i = 0; i < n; i++) {
		void *d;
		char u[96];
		if (handle(i, &d) == 0) uuid(d, u, sizeof u);
	}
	char label[64];
	snprintf(label, sizeof label, "NVML up (%u GPU%s)", n, n == 1 ? "" : "s");
	rss(label);
	return 0;
}
