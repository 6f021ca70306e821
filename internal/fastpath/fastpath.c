//go:build cgo

// The pass-through fast path of gantry-runtime, a constructor the C
// library's start-up runs before the Go runtime starts (see doc.go). Every constant copied from Go
// is pinned by constants_test.go.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fastpath.h"

const char *const gantry_runtime_names[] = {"gantry-runtime", "nvidia-container-runtime", NULL};
const char *const gantry_ctk_names[] = {"nvidia-ctk", NULL};
const char *const gantry_hook_names[] = {"gantry-hook", "nvidia-container-runtime-hook", "nvidia-container-toolkit", NULL}; // hook.Names
const char gantry_config_env[] = "GANTRY_CONFIG";               // config.EnvPath
const char gantry_config_default[] = "/etc/gantry/config.toml"; // config.DefaultPath
const char gantry_no_fastpath_env[] = "GANTRY_NO_FASTPATH";
// shim.DefaultPath: where the low-level runtime is looked for without PATH.
const char gantry_default_path[] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const long long gantry_max_spec_size = 16 << 20; // ocibundle.MaxSpecSize
// The create server (package createserver): its protocol and where it listens.
const char gantry_server_magic[] = "gantry-create/1";              // createproto.ServerProtocol
const char gantry_server_socket[] = "/run/gantry/runtime.sock";   // createproto.DefaultServerSocket
const char gantry_server_socket_env[] = "GANTRY_RUNTIME_SOCKET";  // createproto.ServerSocketEnv
const char gantry_server_flag[] = "--create-server";               // createproto.ServerFlag
const char gantry_hook_magic[] = "gantry-hook/1";                  // createproto.HookProtocol
const long long gantry_max_hook_state = 32 << 10;                 // createproto.MaxHookState
const long long gantry_max_state_size = 1 << 20;                  // ocibundle.MaxStateSize
// How long a create waits for the server (createproto.Server*Timeout, in ms), and
// the byte a server sends first on a connection it took (createproto.ServerAccepted).
const long long gantry_server_connect_ms = 300;   // createproto.ServerConnectTimeout
const long long gantry_server_ack_ms = 500;       // createproto.ServerAckTimeout
const long long gantry_server_answer_ms = 15000;  // createproto.ServerAnswerTimeout
const char gantry_server_accepted = '+';          // createproto.ServerAccepted

// Text in config.json without which no container asks for a GPU under a
// configuration of neutral keys only: the variables a request is read from
// (NVIDIA_VISIBLE_DEVICES; CUDA_VERSION, which makes a legacy image ask for
// all GPUs), the last element of the volume-mount device list's root (what
// survives path.Clean) and the default CDI annotation prefix. Any backslash
// means a JSON escape could spell one of them differently, so it counts
// too. This is a superset test: a hit sends the container to Go, which decides.
const char *const gantry_request_needles[] = {
	"NVIDIA_VISIBLE_DEVICES", "CUDA_VERSION", "nvidia-container-devices", "cdi.k8s.io/", "\\", NULL};

// Configuration keys (dotted from the top) that cannot make a container
// ask for a GPU (they only narrow a request, or say where things are). A
// configuration with any other key (cdi.annotation-prefixes,
// runtime.swarm-resource, a key this list does not know) sends every create
// to Go; constants_test.go classifies every key of config.Config.
const char *const gantry_neutral_keys[] = {
	"gpus", "driver-root", "dev-root", "library-search-paths", "log-level",
	"runtime.low-level", "runtime.cache-dir", "runtime.accept-env-unprivileged",
	"runtime.accept-volume-mounts", "runtime.log-file", "runtime.disable-require",
	"runtime.kubernetes-env", "runtime.kubelet-dir", "runtime.no-cgroups",
	"runtime.driver-layout", "runtime.driver-tree-dir", "runtime.driver-tree-path",
	"runtime.gantry-path", "runtime.exclusive-gpus",
	"cdi.kind", "cdi.spec-dirs", "cdi.hook-path", NULL};

// runc's flags that take a value (shim's args.go has the same lists).
const char *const gantry_global_value_flags[] = {"log", "log-format", "root", "criu", "rootless", NULL};
const char *const gantry_create_value_flags[] = {"bundle", "b", "console-socket", "pidfd-socket", "pid-file", "preserve-fds", NULL};
// create/run's boolean flags; any other flag leaves the line to Go.
static const char *const create_bool_flags[] = {"detach", "d", "no-pivot", "no-new-keyring", "no-subreaper", "keep", NULL};

static int in_list(const char *const *list, const char *s) {
	for (int i = 0; list[i]; i++)
		if (strcmp(list[i], s) == 0) return 1;
	return 0;
}

static int is_name(const char *const *names, const char *argv0) {
	const char *base = strrchr(argv0, '/');
	return in_list(names, base ? base + 1 : argv0);
}

static int is_runtime_name(const char *argv0) { return is_name(gantry_runtime_names, argv0); }

// flag_name copies the name of flag a ("-x", "--x", "--x=v") into buf:
// the length of the name, or 0 if it does not fit.
static size_t flag_name(const char *a, char *buf, size_t size, const char **rest) {
	const char *name = a + 1;
	if (*name == '-') name++;
	size_t n = strcspn(name, "=");
	if (n >= size) return 0;
	memcpy(buf, name, n);
	buf[n] = 0;
	*rest = name + n;
	return n;
}

// subcommand returns the index of the runc subcommand, -1 if there is none
// or the line is one we leave to Go (help, version, a flag missing its value).
static int subcommand(int argc, char **argv) {
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0) return i + 1 < argc ? i + 1 : -1;
		if (a[0] != '-' || a[1] == 0) return i;
		char buf[32];
		const char *rest;
		if (!flag_name(a, buf, sizeof buf, &rest)) continue;
		if (strcmp(buf, "h") == 0 || strcmp(buf, "help") == 0 || strcmp(buf, "v") == 0 || strcmp(buf, "version") == 0 ||
		    strcmp(buf, gantry_server_flag + 2) == 0)
			return -1;
		if (*rest == '=' || !in_list(gantry_global_value_flags, buf)) continue;
		if (i + 1 >= argc) return -1;
		i++;
	}
	return -1;
}

static char *trim(char *s) {
	while (*s == ' ' || *s == '\t') s++;
	char *e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = 0;
	return s;
}

// bare reports whether s is a TOML bare key (dots allowed, no spaces).
static int bare(const char *s) {
	if (!*s || *s == '.') return 0;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '-' || *s == '_' || *s == '.'))
			return 0;
	return 1;
}

// simple_string: a one-line quoted string without escapes at *p; moves *p
// past it. 1 if so.
static int simple_string(char **p) {
	char q = **p;
	if (q != '"' && q != '\'') return 0;
	char *end = strchr(*p + 1, q);
	if (!end || memchr(*p + 1, '\\', end - *p - 1)) return 0;
	// """ and ''' open multi-line strings.
	if (end == *p + 1 && end[1] == q) return 0;
	*p = end + 1;
	return 1;
}

// simple_value: a value the fast path understands fully: a simple string,
// true or false, or a one-line array of simple strings; then nothing but a
// comment.
static int simple_value(char *v) {
	if (strncmp(v, "true", 4) == 0) v += 4;
	else if (strncmp(v, "false", 5) == 0) v += 5;
	else if (*v == '[') {
		v = trim(v + 1);
		while (*v != ']') {
			if (!simple_string(&v)) return 0;
			v = trim(v);
			if (*v == ',') v = trim(v + 1);
			else if (*v != ']') return 0;
		}
		v++;
	} else if (!simple_string(&v))
		return 0;
	v = trim(v);
	return *v == 0 || *v == '#';
}

int gantry_parse_config(char *text, char *out, size_t size) {
	int neutral = 1;
	char table[64] = "";
	if (size < sizeof "runc") return -1;
	strcpy(out, "runc");
	char *save = NULL;
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *s = trim(line);
		if (*s == 0 || *s == '#') continue;
		if (*s == '[') {
			if (s[1] == '[') { neutral = 0; strcpy(table, "?"); continue; }
			char *end = strchr(s, ']');
			if (!end) return -1;
			*end = 0;
			char *rest = trim(end + 1);
			char *name = trim(s + 1);
			if (strlen(name) >= sizeof table) return -1;
			strcpy(table, name);
			if (!bare(name) || (*rest && *rest != '#') || (strcmp(name, "runtime") != 0 && strcmp(name, "cdi") != 0))
				neutral = 0;
			continue;
		}
		char *eq = strchr(s, '=');
		if (!eq) return -1;
		*eq = 0;
		char *key = trim(s), *val = trim(eq + 1);
		// A multi-line string's next lines are not keys: leave the file to Go.
		if (strstr(val, "\"\"\"") || strstr(val, "'''")) return -1;
		char full[192];
		if (!bare(key) || strlen(table) + strlen(key) + 2 > sizeof full) {
			neutral = 0;
			full[0] = 0;
		} else {
			strcpy(full, table);
			if (*table) strcat(full, ".");
			strcat(full, key);
		}
		if (!in_list(gantry_neutral_keys, full) || !simple_value(val)) neutral = 0;
		if (strcmp(full, "runtime.low-level") != 0) {
			// Anything else that could set it in a way we do not parse.
			if (strstr(key, "low-level") || (table[0] == 0 && strcmp(key, "runtime") == 0)) return -1;
			continue;
		}
		char q = val[0];
		if (q != '"' && q != '\'') return -1;
		char *end = strchr(val + 1, q);
		if (!end || end == val + 1 || memchr(val + 1, '\\', end - val - 1)) return -1;
		char *rest = trim(end + 1);
		if (*rest != 0 && *rest != '#') return -1;
		size_t n = end - val - 1;
		if (n >= size) return -1;
		memcpy(out, val + 1, n);
		out[n] = 0;
	}
	return neutral;
}

// low_level reads the configuration file: gantry_parse_config's answer.
static int low_level(char *out, size_t size) {
	const char *path = getenv(gantry_config_env);
	int explicit = path && *path;
	if (!explicit) path = gantry_config_default;
	if (size < sizeof "runc") return -1;
	strcpy(out, "runc");
	// Not blocking on a FIFO, and only a regular file (or /dev/null, the
	// defaults, as in Go): anything else is left to the Go side, which
	// refuses it with an error naming it.
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) return !explicit && errno == ENOENT ? 1 : -1;
	struct stat st;
	if (fstat(fd, &st) != 0) {
		close(fd);
		return -1;
	}
	if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3)) {
		close(fd);
		return 1;
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return -1;
	}
	static char buf[65536];
	ssize_t len = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (len < 0 || len == (ssize_t)sizeof buf - 1 || memchr(buf, 0, len)) return -1;
	buf[len] = 0;
	return gantry_parse_config(buf, out, size);
}

// resolve finds name like Main's findRuntime: a path as given, else the
// first executable in PATH (gantry_default_path when PATH is unset or
// empty: engines such as Podman call delete and kill with an empty
// environment) that is not this program.
static int resolve(const char *name, char *out, size_t size) {
	if (strchr(name, '/')) {
		if (strlen(name) >= size || access(name, X_OK) != 0) return 0;
		strcpy(out, name);
		return 1;
	}
	struct stat self;
	if (stat("/proc/self/exe", &self) != 0) return 0;
	const char *path = getenv("PATH");
	if (!path || !*path) path = gantry_default_path;
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

int gantry_no_request(const char *buf, size_t len) {
	if (len == 0 || memchr(buf, 0, len)) return 0;
	for (int i = 0; gantry_request_needles[i]; i++)
		if (memmem(buf, len, gantry_request_needles[i], strlen(gantry_request_needles[i]))) return 0;
	return 1;
}

// create_bundle finds config.json of a create/run line whose subcommand is
// argv[at]: 1 and out filled (and *dir, *id: the bundle directory and the
// container ID as given), or 0 to leave it to Go.
static int create_bundle(int argc, char **argv, int at, char *out, size_t size, const char **dir, const char **id) {
	const char *bundle = NULL;
	int ids = 0;
	for (int i = at + 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0) {
			if (i + 1 < argc) *id = argv[i + 1];
			ids += argc - i - 1;
			break;
		}
		if (a[0] != '-' || a[1] == 0) {
			*id = a;
			ids++;
			continue;
		}
		char buf[32];
		const char *rest;
		if (!flag_name(a, buf, sizeof buf, &rest)) return 0;
		if (in_list(create_bool_flags, buf)) {
			if (*rest == '=') return 0;
			continue;
		}
		if (!in_list(gantry_create_value_flags, buf)) return 0;
		const char *val = *rest == '=' ? rest + 1 : (i + 1 < argc ? argv[++i] : NULL);
		if (!val) return 0;
		if (strcmp(buf, "bundle") == 0 || strcmp(buf, "b") == 0) bundle = val;
	}
	if (ids != 1) return 0;
	if (!bundle || !*bundle) bundle = ".";
	if (strlen(bundle) + sizeof "/config.json" > size) return 0;
	strcpy(out, bundle);
	strcat(out, "/config.json");
	*dir = bundle;
	return 1;
}

static void set_timeout(int s, int opt, long long ms) {
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
	setsockopt(s, SOL_SOCKET, opt, &tv, sizeof tv);
}

// read_byte reads one byte from s: 1, or 0 on EOF, error or timeout.
static int read_byte(int s, char *b) {
	ssize_t got;
	do got = read(s, b, 1);
	while (got < 0 && errno == EINTR);
	return got == 1;
}

// server_connect connects to the create server, with its timeouts set: the
// socket, or -1.
static int server_connect(void) {
	const char *sock = getenv(gantry_server_socket_env);
	if (!sock || !*sock) sock = gantry_server_socket;
	struct sockaddr_un addr;
	memset(&addr, 0, sizeof addr);
	addr.sun_family = AF_UNIX;
	if (strlen(sock) >= sizeof addr.sun_path) return -1;
	strcpy(addr.sun_path, sock);
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0) return -1;
	// A server that accepts no more (stopped, frozen, its backlog full)
	// costs gantry_server_connect_ms: on a unix socket the send timeout
	// bounds connect too; one that queues the connection but never takes
	// it, gantry_server_ack_ms more (server_ask).
	set_timeout(s, SO_SNDTIMEO, gantry_server_connect_ms);
	struct ucred cred;
	socklen_t len = sizeof cred;
	if (connect(s, (struct sockaddr *)&addr, sizeof addr) != 0 ||
	    getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != 0) {
		// Only root's server is believed.
		close(s);
		return -1;
	}
	set_timeout(s, SO_RCVTIMEO, gantry_server_ack_ms);
	return s;
}

// server_header writes the fields every request starts with into msg: the
// protocol, this executable's identity and the configuration file Go would
// read (and whether it was named): its length, or 0 to leave the work to Go.
static int server_header(char *msg, size_t size, const char *magic) {
	struct stat self;
	if (stat("/proc/self/exe", &self) != 0) return 0;
	const char *cfg = getenv(gantry_config_env);
	int explicit = cfg && *cfg;
	if (!explicit) cfg = gantry_config_default;
	// A relative path is Go's to resolve against this process's directory,
	// which the server does not share.
	if (cfg[0] != '/') return 0;
	int n = snprintf(msg, size, "%s%c%llu:%llu:%lld:%lld.%09ld%c%s%c%d%c", magic, 0, (unsigned long long)self.st_dev,
	                 (unsigned long long)self.st_ino, (long long)self.st_size, (long long)self.st_mtim.tv_sec,
	                 (long)self.st_mtim.tv_nsec, 0, cfg, 0, explicit, 0);
	return n > 0 && n < (int)size ? n : 0;
}

// server_ask sends msg (with fd beside it, unless -1) on s and reads the
// one-byte answer: 1 when it is "done".
static int server_ask(int s, const char *msg, size_t n, int fd) {
	struct iovec iov = {.iov_base = (void *)msg, .iov_len = n};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	memset(&ctl, 0, sizeof ctl);
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof ctl.buf;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	if (sendmsg(s, &mh, MSG_NOSIGNAL) != (ssize_t)n) return 0;
	// The server takes the connection (its first byte) within
	// gantry_server_ack_ms, or Go does the work; once taken, the work may
	// last up to gantry_server_answer_ms.
	char answer;
	if (!read_byte(s, &answer) || answer != gantry_server_accepted) return 0;
	set_timeout(s, SO_RCVTIMEO, gantry_server_answer_ms);
	return read_byte(s, &answer) && answer == 'Y';
}

// server_create asks the create server (package createserver) to make this
// create's GPU changes: 1 when it answered that it did, so the low-level
// runtime can run now; 0 (no server, any doubt, any error) leaves the
// create to Go in-process, as without a server. The request: the header,
// the bundle and container ID as given and the constructor's start time,
// NUL-separated, with the bundle directory open (O_PATH) beside it.
static int server_create(const char *bundle, const char *id) {
	static char msg[4 * 4096];
	int n = server_header(msg, sizeof msg, gantry_server_magic);
	if (!n) return 0;
	int m = snprintf(msg + n, sizeof msg - n, "%s%c%s%c%lld%c", bundle, 0, id, 0, gantry_start_ns, 0);
	if (m <= 0 || m >= (int)sizeof msg - n) return 0;
	int s = server_connect();
	if (s < 0) return 0;
	int done = 0;
	int dir = open(bundle, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dir >= 0) {
		done = server_ask(s, msg, n + m, dir);
		close(dir);
	}
	close(s);
	return done;
}

// fail_hook ends the hook as its Go code ends it on an error reading its
// stdin: one line on stderr, exit 1 (the runtime then fails the container).
static void fail_hook(const char *what, int err) {
	char line[256];
	int n = snprintf(line, sizeof line, "gantry-hook: %s: %s\n", what, strerror(err));
	if (n > 0) {
		ssize_t w = write(2, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
		(void)w;
	}
	_exit(1);
}

// write_all writes n bytes of buf to fd: 0, or an errno.
static int write_all(int fd, const char *buf, size_t n) {
	while (n > 0) {
		ssize_t w = write(fd, buf, n);
		if (w < 0 && errno == EINTR) continue;
		if (w <= 0) return w < 0 ? errno : EIO;
		buf += w;
		n -= w;
	}
	return 0;
}

// hook_by_server: the prestart hook (Docker's --gpus path) done by the
// create server. It reads the OCI state from stdin and sends it, after the
// header and the constructor's start time; when the server answers that
// it did the work, the hook exits 0 here. Otherwise (no server, any
// doubt) the hook's Go code runs as without a server, and reads from
// stdin exactly what was there: what this read, then the rest of it (up
// to what Go reads at most), in a memory file put on fd 0. A read or
// write that fails ends the hook here, with the error Go would report.
static void hook_by_server(void) {
	int fl = fcntl(0, F_GETFL);
	if (fl < 0 || (fl & O_NONBLOCK) || (fl & O_ACCMODE) == O_WRONLY) return;
	// Where stdin goes back for Go: made first, so that nothing is
	// read that could not be given back.
	int mem = memfd_create("gantry-hook-state", MFD_CLOEXEC);
	if (mem < 0) return;
	// The header, the state and its closing NUL.
	static char msg[4 * 4096 + (32 << 10) + 2];
	int n = server_header(msg, sizeof msg, gantry_hook_magic);
	if (n) {
		int m = snprintf(msg + n, sizeof msg - n, "%lld%c", gantry_start_ns, 0);
		n = m > 0 && m < (int)sizeof msg - n ? n + m : 0;
	}
	char *state = msg + n;
	// One byte more than a state the server takes, to tell a larger
	// one, and room for the NUL after it.
	size_t room = sizeof msg - n - 1;
	if (room > (size_t)gantry_max_hook_state + 1) room = gantry_max_hook_state + 1;
	size_t got = 0;
	ssize_t r = 1;
	while (got < room && (r = read(0, state + got, room - got)) != 0) {
		if (r < 0) {
			if (errno == EINTR) continue;
			fail_hook("reading the container state on stdin", errno);
		}
		got += r;
	}
	if (n && r == 0 && got > 0 && got <= (size_t)gantry_max_hook_state && !memchr(state, 0, got)) {
		state[got] = 0;
		int s = server_connect();
		if (s >= 0) {
			int done = server_ask(s, msg, n + got + 1, -1);
			close(s);
			if (done) _exit(0);
		}
	}
	// Give Go its stdin back: what was read, then the rest (Go reads
	// at most gantry_max_state_size + 1 bytes and refuses more).
	int err = write_all(mem, state, got);
	size_t total = got;
	while (!err && r != 0 && total <= (size_t)gantry_max_state_size) {
		char buf[8192];
		r = read(0, buf, sizeof buf);
		if (r < 0 && errno == EINTR) continue;
		if (r < 0) fail_hook("reading the container state on stdin", errno);
		err = write_all(mem, buf, r);
		total += r;
	}
	if (err) fail_hook("keeping the container state for the hook", err);
	if (lseek(mem, 0, SEEK_SET) != 0 || dup2(mem, 0) != 0) fail_hook("keeping the container state for the hook", errno);
	close(mem);
}

// spec_has_no_request: 1 when config.json (a regular file of at most
// gantry_max_spec_size bytes, as Go's ocibundle reads it) cannot hold a
// GPU request.
static int spec_has_no_request(const char *path) {
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) return 0;
	struct stat st;
	int ok = 0;
	// A usual config.json (a few KiB) is read into a static buffer: no
	// malloc arena to set up (brk calls, page faults) before the exec.
	static char small[256 << 10];
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && st.st_size <= gantry_max_spec_size) {
		char *buf = st.st_size <= (off_t)sizeof small ? small : malloc(st.st_size);
		if (buf) {
			size_t got = 0;
			ssize_t n;
			while (got < (size_t)st.st_size && (n = read(fd, buf + got, st.st_size - got)) > 0) got += n;
			ok = got == (size_t)st.st_size && gantry_no_request(buf, got);
			if (buf != small) free(buf);
		}
	}
	close(fd);
	return ok;
}

// When the constructor ran, for the log's startup time.
long long gantry_start_ns;

long long gantry_now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// The caller's CPU affinity while a create runs in Go narrowed to the
// current CPU (narrow_affinity), for gantry_restore_affinity.
static cpu_set_t gantry_affinity;
static int gantry_affinity_narrowed;

// narrow_affinity pins this still single-threaded process to the CPU it
// runs on, so that the Go runtime, which sizes itself by the affinity
// mask, starts with one P: no idle Ps to wake, fewer threads to create
// (on a 16-CPU host, 0.2 ms or more of a create that lasts a few ms).
// Go puts the caller's mask back before it runs the low-level runtime,
// so runc and the container never see the narrowed one.
static void narrow_affinity(void) {
	cpu_set_t one;
	int cpu = sched_getcpu();
	if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof gantry_affinity, &gantry_affinity) != 0) return;
	if (CPU_COUNT(&gantry_affinity) < 2 || !CPU_ISSET(cpu, &gantry_affinity)) return;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	if (sched_setaffinity(0, sizeof one, &one) == 0) gantry_affinity_narrowed = 1;
}

int gantry_restore_affinity(void) {
	if (!gantry_affinity_narrowed) return 0;
	return sched_setaffinity(0, sizeof gantry_affinity, &gantry_affinity) == 0 ? 0 : errno;
}

__attribute__((constructor)) static void gantry_runtime_fastpath(int argc, char **argv, char **envp) {
	gantry_start_ns = gantry_now_ns();
	if (argc >= 1 && argv && argv[0] && is_name(gantry_hook_names, argv[0])) {
		// Docker's --gpus line (nvidia-container-runtime-hook prestart),
		// and hooks.d's: the create server may do it. Any other line, or
		// no server, is Go's.
		const char *e = getenv(gantry_no_fastpath_env);
		if (argc == 2 && (strcmp(argv[1], "prestart") == 0 || strcmp(argv[1], "createRuntime") == 0) &&
		    !(e && *e && strcmp(e, "0") != 0))
			hook_by_server();
		// The prestart hook is all Go and starts no program: one CPU
		// for its few milliseconds, and nothing to restore.
		narrow_affinity();
		return;
	}
	if (argc >= 3 && argv && argv[0] && strcmp(argv[1], "cdi") == 0 && strcmp(argv[2], "generate") == 0 &&
	    is_name(gantry_ctk_names, argv[0])) {
		// nvidia-ctk cdi generate: Go, milliseconds, the inventory
		// usually from the cache; a hand-over to gantry restores the
		// caller's CPUs first (cdicmd.ExecGantry).
		narrow_affinity();
		return;
	}
	if (argc < 2 || !argv || !argv[0] || !is_runtime_name(argv[0])) return;
	const char *e = getenv(gantry_no_fastpath_env);
	if (e && *e && strcmp(e, "0") != 0) return;
	int at = subcommand(argc, argv);
	if (at < 0) return;
	const char *cmd = argv[at];
	char name[PATH_MAX], path[PATH_MAX];
	int conf = low_level(name, sizeof name);
	if (conf < 0 || !resolve(name, path, sizeof path)) return;
	// checkpoint and restore of a GPU container need Go (package ctrckpt):
	// rare, and seconds long, so they all go there.
	if (strcmp(cmd, "checkpoint") == 0 || strcmp(cmd, "restore") == 0) return;
	if (strcmp(cmd, "create") == 0 || strcmp(cmd, "run") == 0) {
		// A container that cannot be asking for a GPU goes straight to the
		// low-level runtime too; anything else (a possible request, an
		// unusual line or configuration) is Go's to decide.
		char spec[PATH_MAX];
		const char *bundle = NULL, *id = NULL;
		int simple = create_bundle(argc, argv, at, spec, sizeof spec, &bundle, &id);
		if ((conf != 1 || !simple || !spec_has_no_request(spec)) && !(simple && id && server_create(bundle, id))) {
			narrow_affinity();
			return;
		}
	}
	argv[0] = path;
	execve(path, argv, envp);
	// Failed: Main reports it properly.
}
