package shim

// The pass-through fast path. Engines call the runtime for every step of a
// container's life (create, start, state, kill, delete, ...), and only
// create and run need Gantry, and only for a container that asks for a GPU.
// Starting the Go runtime and running every package's init costs a few
// milliseconds per call; for the other subcommands, and for a create or run
// whose config.json cannot hold a request (none of the text a request is
// read from appears in it, and no JSON escape that could spell it), a C
// constructor, which the dynamic loader runs before the Go runtime starts
// (as runc's nsenter does), execs the low-level runtime at once. The create
// test is conservative by construction (a superset of what Go reads) and
// held against request.Parse by TestFastCreateDecision and its fuzz target.
// Such a create leaves no line in runtime.log-file. It acts only when the program's name is gantry-runtime or
// nvidia-container-runtime, and it gives up (leaving the work to Main, which
// does the same thing slower) whenever anything is unusual: an unclear
// command line, a configuration file it cannot read simply, a runtime it
// cannot find. GANTRY_NO_FASTPATH=1 turns it off.

/*
#cgo CFLAGS: -O2 -Wall
#define _GNU_SOURCE
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

// Set by low_level when the configuration has keys that change what a
// request is (annotation-prefixes, swarm-resource).
static int config_custom_request;

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
		// Keys that change which containers count as asking for a GPU:
		// with them the create fast path leaves the decision to Go.
		if (strstr(key, "annotation-prefixes") || strstr(key, "swarm-resource") || strstr(table, "annotation-prefixes") || strstr(table, "swarm-resource"))
			config_custom_request = 1;
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

// Text in config.json without which no container asks for a GPU: the
// variables a request is read from (NVIDIA_VISIBLE_DEVICES; CUDA_VERSION,
// which makes a legacy image ask for all GPUs), the volume-mount device
// list's root and the default CDI annotation prefix. Any backslash means a
// JSON escape could spell one of them differently, so it counts too. This
// is a superset test: a hit sends the container to Go, which decides.
static const char *const request_needles[] = {
	"NVIDIA_VISIBLE_DEVICES", "CUDA_VERSION", "nvidia-container-devices", "cdi.k8s.io/", "\\", NULL};

// no_request: 1 when the spec text cannot hold a GPU request.
static int no_request(const char *buf, size_t len) {
	if (memchr(buf, 0, len)) return 0;
	for (int i = 0; request_needles[i]; i++)
		if (memmem(buf, len, request_needles[i], strlen(request_needles[i]))) return 0;
	return 1;
}

// create/run flags (the same as args.go's): those taking a value, and the
// booleans runc has; any other flag makes us leave the line to Go.
static int create_flag(const char *name, int *takes_value) {
	static const char *const valued[] = {"bundle", "b", "console-socket", "pidfd-socket", "pid-file", "preserve-fds", NULL};
	static const char *const booleans[] = {"detach", "d", "no-pivot", "no-new-keyring", "no-subreaper", "keep", NULL};
	for (int i = 0; valued[i]; i++)
		if (strcmp(name, valued[i]) == 0) return *takes_value = 1, 1;
	for (int i = 0; booleans[i]; i++)
		if (strcmp(name, booleans[i]) == 0) return *takes_value = 0, 1;
	return 0;
}

// create_bundle finds the bundle directory of a create/run line whose
// subcommand is argv[at]: 1 and out filled, or 0 to leave it to Go.
static int create_bundle(int argc, char **argv, int at, char *out, size_t size) {
	const char *bundle = NULL;
	int ids = 0;
	for (int i = at + 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0) { ids += argc - i - 1; break; }
		if (a[0] != '-' || a[1] == 0) { ids++; continue; }
		const char *name = a + 1;
		if (*name == '-') name++;
		char buf[32];
		size_t n = strcspn(name, "=");
		if (n >= sizeof buf) return 0;
		memcpy(buf, name, n);
		buf[n] = 0;
		int valued;
		if (!create_flag(buf, &valued)) return 0;
		if (!valued) { if (name[n] == '=') return 0; continue; }
		const char *val = name[n] == '=' ? name + n + 1 : (i + 1 < argc ? argv[++i] : NULL);
		if (!val) return 0;
		if (strcmp(buf, "bundle") == 0 || strcmp(buf, "b") == 0) bundle = val;
	}
	if (ids != 1) return 0;
	if (!bundle || !*bundle) bundle = ".";
	if (strlen(bundle) + sizeof "/config.json" > size) return 0;
	strcpy(out, bundle);
	strcat(out, "/config.json");
	return 1;
}

// spec_has_no_request: 1 when config.json (a regular file of at most
// 16 MiB, as Go's ocibundle reads it) cannot hold a GPU request.
static int spec_has_no_request(const char *path) {
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) return 0;
	struct stat st;
	int ok = 0;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && st.st_size <= (16 << 20)) {
		char *buf = malloc(st.st_size);
		if (buf) {
			size_t got = 0;
			ssize_t n;
			while (got < (size_t)st.st_size && (n = read(fd, buf + got, st.st_size - got)) > 0) got += n;
			ok = got == (size_t)st.st_size && no_request(buf, got);
			free(buf);
		}
	}
	close(fd);
	return ok;
}

// subcommand_index is subcommand's position in argv, or -1.
static int subcommand_index(int argc, char **argv, const char *cmd) {
	for (int i = 1; i < argc; i++)
		if (argv[i] == cmd) return i;
	return -1;
}

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
	if (!cmd) return;
	char name[PATH_MAX], path[PATH_MAX];
	if (!low_level(name, sizeof name) || !resolve(name, path, sizeof path)) return;
	if (strcmp(cmd, "create") == 0 || strcmp(cmd, "run") == 0) {
		// A container that cannot be asking for a GPU goes straight to the
		// low-level runtime too; anything else (a possible request, an
		// unusual line or configuration) is Go's to decide.
		char spec[PATH_MAX];
		int at = subcommand_index(argc, argv, cmd);
		if (config_custom_request || at < 0 || !create_bundle(argc, argv, at, spec, sizeof spec) || !spec_has_no_request(spec))
			return;
	}
	argv[0] = path;
	execve(path, argv, envp);
	// Failed: Main reports it properly.
}
*/
import "C"

import "unsafe"

// startupMillis is the time since the constructor ran, in milliseconds.
func startupMillis() float64 {
	return float64(C.gantry_now_ns()-C.gantry_start_ns) / 1e6
}

// fastNoRequest is the C fast path's decision on the text of a config.json:
// true means it hands create and run straight to the low-level runtime.
// For tests, which hold it against request.Parse.
func fastNoRequest(spec []byte) bool {
	if len(spec) == 0 {
		return false
	}
	return C.no_request((*C.char)(unsafe.Pointer(&spec[0])), C.size_t(len(spec))) == 1
}
