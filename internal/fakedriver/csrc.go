package fakedriver

import (
	"fmt"
	"strings"
)

// The C sources below use no libc, so the same source builds as a 64-bit
// library linked the usual way and as a 32-bit one with -nostdlib (hosts
// rarely have a 32-bit libc, but gcc -m32 can still emit the object).

// librarySource is the body every fake library gets: a marker naming it,
// plus the real entry points that programs call for the few libraries that
// have them.
func librarySource(stem, version string, cudaVersion int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "/* gantry fakedriver stand-in for %s, driver %s */\n", stem, version)
	fmt.Fprintf(&b, "const char gantry_fake_library[] = %q;\n", stem)
	fmt.Fprintf(&b, "const char gantry_fake_driver_version[] = %q;\n", version)
	switch stem {
	case "libcuda.so":
		fmt.Fprintf(&b, `
/* CUDA driver API: cuInit succeeds, cuDriverGetVersion reports the CUDA
 * version this driver supports (major*1000 + minor*10). */
int cuInit(unsigned int flags) { (void)flags; return 0; }
int cuDriverGetVersion(int *v) {
	if (!v) return 1; /* CUDA_ERROR_INVALID_VALUE */
	*v = %d;
	return 0;
}
int cuDeviceGetCount(int *n) {
	if (!n) return 1;
	*n = 0;
	return 0;
}
`, cudaVersion)
	case "libnvidia-ml.so":
		b.WriteString(`
/* NVML: initialisation succeeds and the driver version can be read. */
int nvmlInit_v2(void) { return 0; }
int nvmlInit(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char *buf, unsigned int len) {
	unsigned int i = 0;
	if (!buf || len == 0) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
	for (; gantry_fake_driver_version[i] && i + 1 < len; i++)
		buf[i] = gantry_fake_driver_version[i];
	buf[i] = 0;
	return gantry_fake_driver_version[i] ? 7 /* NVML_ERROR_INSUFFICIENT_SIZE */ : 0;
}
`)
	}
	return b.String()
}

// programSource is the fake nvidia-smi, also copied under the other binary
// names. It says it is fake, and counts the /dev/nvidiaN nodes it can see,
// so a container test can check which GPUs it was given.
func programSource(version string, cudaVersion int, ids []Identity) string {
	var table strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&table, "\t{%d, %s, %s},\n", id.Minor, cString(id.UUID), cString(id.Name))
	}
	table.WriteString("\t{-1, 0, 0},\n")
	return fmt.Sprintf(`/* gantry fakedriver: fake NVIDIA driver program */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const struct { int minor; const char *uuid, *name; } ids[] = {
%s};

static int visible(int i) {
	char p[64];
	struct stat st;
	snprintf(p, sizeof p, "/dev/nvidia%%d", i);
	return stat(p, &st) == 0;
}

int main(int argc, char **argv) {
	const char *name = strrchr(argv[0], '/');
	int i, n = 0;
	name = name ? name + 1 : argv[0];
	if (strcmp(name, "nvidia-smi") != 0) {
		printf("%%s: fake NVIDIA driver program (gantry fakedriver), driver %s\n", name);
		return 0;
	}
	if (argc > 1 && strcmp(argv[1], "-L") == 0) {
		for (i = 0; i < 64; i++) {
			int k;
			if (!visible(i))
				continue;
			for (k = 0; ids[k].minor >= 0 && ids[k].minor != i; k++)
				;
			if (ids[k].minor == i)
				printf("GPU %%d: %%s (UUID: %%s)\n", i, ids[k].name, ids[k].uuid);
			else
				printf("GPU %%d: Fake NVIDIA GPU (UUID: GPU-fa4e0000-0000-4000-8000-%%012d)\n", i, i);
		}
		return 0;
	}
	for (i = 0; i < 64; i++)
		n += visible(i);
	printf("NVIDIA-SMI fake (gantry fakedriver)   Driver Version: %s   CUDA Version: %d.%d\n");
	printf("%%d GPU device node(s) visible\n", n);
	return 0;
}
`, table.String(), version, version, cudaVersion/1000, (cudaVersion%1000)/10)
}

// cString is s as a C string literal (UUIDs and model names are printable
// ASCII; anything else is escaped octally).
func cString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c >= 0x7f:
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
