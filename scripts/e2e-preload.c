// A hostile image's LD_PRELOAD library for scripts/gpu-e2e.sh check i (the
// CVE-2025-23266 class): if any program that runs as host root for a
// container (a CDI createContainer hook, say) is handed the image's
// environment and runs a dynamic loader, this constructor runs in it and
// writes the file named by E2E_MARKER, a host path. The check fails if the
// file exists afterwards. Inside the container the host path does not
// exist, so the container's own programs, which load it too, leave no mark.
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void mark(void) {
	const char *path = getenv("E2E_MARKER");
	if (!path || !*path) return;
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0) return;
	char exe[256];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n < 0) n = 0;
	exe[n] = '\n';
	(void)!write(fd, exe, n + 1);
	close(fd);
}
