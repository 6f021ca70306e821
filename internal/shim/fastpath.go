package shim

// The pass-through fast path. Engines call the runtime for every step of a
// container's life (create, start, state, kill, delete, ...), and only
// create and run need Gantry. Starting the Go runtime and running every
// package's init costs a few milliseconds per call; for the other
// subcommands a C constructor, which the dynamic loader runs before the Go
// runtime starts (as runc's nsenter does), execs the low-level runtime at
// once. It acts only when the program's name is gantry-runtime or
// nvidia-container-runtime, and it gives up (leaving the work to Main, which
// does the same thing slower) whenever anything is unusual: an unclear
// command line, a configuration file it cannot read simply, a runtime it
// cannot find. GANTRY_NO_FASTPATH=1 turns it off.

/*
#cgo CFLAGS: -O2 -Wall
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_runtime_name(const char *argv0) {
	const char *base = strrchr(argv0, '/');
	base = base ? base + 1 : argv0;
	return strcmp(base, "gantry-runtime") == 0 || strcmp(base, "nvidia-container-runtime") == 0;
}

// Global runc flags that take a value (the same list as args.go).
static int global_takes_value(const char *name) {
	static const char *const names[] = {"log", "log-format", "root", "criu", "rootless", NULL};
	for (int i = 0; names[i]; i++)
		if (strcmp(name, names[i]) == 0) return 1;
	return 0;
}

// subcommand returns the runc subcommand, NULL if there is none or the
// line is one we leave to Go (help, version, a flag missing its value).
static const char *subcommand(int argc, char **argv) {
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0) return i + 1 < argc ? argv[i + 1] : NULL;
		if (a[0] != '-' || a[1] == 0) return a;
		const char *name = a + 1;
		if (*name == '-') name++;
		char buf[32];
		size_t n = strcspn(name, "=");
		if (n >= sizeof buf) continue;
		memcpy(buf, name, n);
		buf[n] = 0;
		if (strcmp(buf, "h") == 0 || strcmp(buf, "help") == 0 || strcmp(buf, "v") == 0 || strcmp(buf, "version") == 0)
			return NULL;
		if (name[n] == '=' || !global_takes_value(buf)) continue;
		if (i + 1 >= argc) return NULL;
		i++;
	}
	return NULL;
}

static char *trim(char *s) {
	while (*s == ' ' || *s == '\t') s++;
	char *e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = 0;
	return s;
}

// low_level reads runtime.low-level from the configuration file into out.
// 1: found or defaulted; 0: give up (the Go side parses the file properly).
static int low_level(char *out, size_t size) {
	const char *path = getenv("GANTRY_CONFIG");
	int explicit = path && *path;
	if (!explicit) path = "/etc/gantry/config.toml";
	strcpy(out, "runc");
	// Not blocking on a FIFO, and only a regular file: anything else is
	// left to the Go side, which refuses it with an error naming it.
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) return !explicit && errno == ENOENT;
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return 0;
	}
	static char buf[65536];
	ssize_t len = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (len < 0 || len == (ssize_t)sizeof buf - 1) return 0;
	buf[len] = 0;
	char table[64] = "";
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
		char *s = trim(line);
		if (*s == 0 || *s == '#') continue;
		if (*s == '[') {
			if (s[1] == '[') { strcpy(table, "?"); continue; }
			char *end = strchr(s, ']');
			if (!end) return 0;
			*end = 0;
			char *name = trim(s + 1);
			if (strlen(name) >= sizeof table) return 0;
			strcpy(table, name);
			continue;
		}
		char *eq = strchr(s, '=');
		if (!eq) return 0;
		*eq = 0;
		char *key = trim(s), *val = trim(eq + 1);
		int ours = (strcmp(table, "runtime") == 0 && strcmp(key, "low-level") == 0) ||
		           (table[0] == 0 && strcmp(key, "runtime.low-level") == 0);
		if (!ours) {
			// Anything else that could set it in a way we do not parse.
			if (strstr(key, "low-level") || (table[0] == 0 && strcmp(key, "runtime") == 0)) return 0;
			continue;
		}
		char q = val[0];
		if (q != '"' && q != '\'') return 0;
		char *end = strchr(val + 1, q);
		if (!end || end == val + 1 || memchr(val + 1, '\\', end - val - 1)) return 0;
		char *rest = trim(end + 1);
		if (*rest != 0 && *rest != '#') return 0;
		size_t n = end - val - 1;
		if (n >= size) return 0;
		memcpy(out, val + 1, n);
		out[n] = 0;
	}
	return 1;
}

// resolve finds name like Main's findRuntime: a path as given, else the
// first executable in PATH (DefaultPath when PATH is unset or empty) that
// is not this program.
static int resolve(const char *name, char *out, size_t size) {
	if (strchr(name, '/')) {
		if (strlen(name) >= size || access(name, X_OK) != 0) return 0;
		strcpy(out, name);
		return 1;
	}
	struct stat self;
	if (stat("/proc/self/exe", &self) != 0) return 0;
	const char *path = getenv("PATH");
	// As Main's findRuntime: engines that call the runtime with an empty
	// environment (Podman's delete and kill) get the usual directories.
	if (!path || !*path) path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
	while (*path) {
		size_t n = strcspn(path, ":");
		const char *dir = n ? path : ".";
		size_t dn = n ? n : 1;
		if (dn + 1 + strlen(name) < size) {
			memcpy(out, dir, dn);
			out[dn] = '/';
			strcpy(out + dn + 1, name);
			struct stat st;
			if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111) &&
			    !(st.st_dev == self.st_dev && st.st_ino == self.st_ino))
				return 1;
		}
		path += n;
		if (*path == ':') path++;
	}
	return 0;
}

#include <time.h>

// When the constructor ran, for the log's startup time.
long long gantry_start_ns;

static long long gantry_now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

__attribute__((constructor)) static void gantry_runtime_fastpath(int argc, char **argv, char **envp) {
	gantry_start_ns = gantry_now_ns();
	if (argc < 2 || !argv || !argv[0] || !is_runtime_name(argv[0])) return;
	const char *e = getenv("GANTRY_NO_FASTPATH");
	if (e && *e && strcmp(e, "0") != 0) return;
	const char *cmd = subcommand(argc, argv);
	if (!cmd || strcmp(cmd, "create") == 0 || strcmp(cmd, "run") == 0) return;
	char name[PATH_MAX], path[PATH_MAX];
	if (!low_level(name, sizeof name) || !resolve(name, path, sizeof path)) return;
	argv[0] = path;
	execve(path, argv, envp);
	// Failed: Main reports it properly.
}
*/
import "C"

// startupMillis is the time since the constructor ran, in milliseconds.
func startupMillis() float64 {
	return float64(C.gantry_now_ns()-C.gantry_start_ns) / 1e6
}
