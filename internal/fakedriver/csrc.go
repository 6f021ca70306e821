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
// ckptParams is what the fake libcuda's checkpoint API is built with
// (Options.CheckpointDir): the record directory, the driver root (where the
// host's device nodes are) and the GPUs.
type ckptParams struct {
	Dir, Root string
	IDs       []Identity
}

func librarySource(stem, version string, cudaVersion int, ck ckptParams) string {
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
`, cudaVersion)
		fmt.Fprintf(&b, "#define GANTRY_CKPT_DIR %s\n#define GANTRY_FAKE_ROOT %s\n#define GANTRY_CKPT_IDS", cString(ck.Dir), cString(ck.Root))
		for _, id := range ck.IDs {
			fmt.Fprintf(&b, " {%d, %s, %s},", id.Minor, cString(id.UUID), cString(id.Name))
		}
		b.WriteString("\n")
		b.WriteString(checkpointSource)
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
`+strings.ReplaceAll(mpsControlSource, "%", "%%")+`

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
	if (strcmp(name, "nvidia-cuda-mps-control") == 0)
		return fake_mps_control(argc, argv);
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

// mpsControlSource is the fake nvidia-cuda-mps-control, with the real
// one's process model and line protocol, so that MPS sharing can be set up
// on simulated GPUs: -d starts a daemon (detached, its own session) that
// listens on $CUDA_MPS_PIPE_DIRECTORY/control, logs "start
// <CUDA_VISIBLE_DEVICES>" and each command to
// $CUDA_MPS_LOG_DIRECTORY/control.log, answers
// get_default_active_thread_percentage with the value set last, takes the
// set_default_* commands, and exits on quit; without -d it sends the lines
// of its standard input to that daemon and prints the replies.
const mpsControlSource = `
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int mps_addr(struct sockaddr_un *a) {
	const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
	memset(a, 0, sizeof *a);
	a->sun_family = AF_UNIX;
	if (!pipe) pipe = "/tmp/nvidia-mps";
	return snprintf(a->sun_path, sizeof a->sun_path, "%s/control", pipe) < (int)sizeof a->sun_path ? 0 : -1;
}

static int mps_dial(void) {
	struct sockaddr_un a;
	int fd;
	if (mps_addr(&a) < 0) return -1;
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fd < 0) return -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) { close(fd); return -1; }
	return fd;
}

static int mps_readline(int fd, char *buf, int n) {
	int i = 0;
	char c;
	while (i + 1 < n) {
		ssize_t r = read(fd, &c, 1);
		if (r <= 0) { if (i == 0) return -1; break; }
		if (c == '\n') break;
		buf[i++] = c;
	}
	buf[i] = 0;
	return i;
}

static void mps_daemon(void) {
	struct sockaddr_un a;
	char logp[4096], line[512], threads[32] = "100.0";
	const char *logdir = getenv("CUDA_MPS_LOG_DIRECTORY");
	FILE *log;
	int ln, fd;
	if (!logdir) logdir = "/var/log/nvidia-mps";
	snprintf(logp, sizeof logp, "%s/control.log", logdir);
	log = fopen(logp, "a");
	if (mps_addr(&a) < 0) exit(1);
	unlink(a.sun_path);
	ln = socket(AF_UNIX, SOCK_STREAM, 0);
	if (ln < 0 || bind(ln, (struct sockaddr *)&a, sizeof a) < 0 || listen(ln, 16) < 0) exit(1);
	chmod(a.sun_path, 0666);
	if (log) { fprintf(log, "start %s\n", getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : ""); fflush(log); }
	signal(SIGPIPE, SIG_IGN);
	for (;;) {
		fd = accept(ln, 0, 0);
		if (fd < 0) continue;
		while (mps_readline(fd, line, sizeof line) >= 0) {
			char reply[64] = "";
			if (log) { fprintf(log, "%s\n", line); fflush(log); }
			if (strcmp(line, "quit") == 0) {
				unlink(a.sun_path);
				exit(0);
			} else if (strcmp(line, "get_default_active_thread_percentage") == 0) {
				snprintf(reply, sizeof reply, "%s", threads);
			} else if (strncmp(line, "set_default_active_thread_percentage ", 37) == 0) {
				snprintf(threads, sizeof threads, "%s.0", line + 37);
			} else if (strncmp(line, "set_default_device_pinned_mem_limit ", 36) != 0 && line[0]) {
				snprintf(reply, sizeof reply, "unknown command");
			}
			strcat(reply, "\n");
			if (write(fd, reply, strlen(reply)) < 0) break;
		}
		close(fd);
	}
}

static int fake_mps_control(int argc, char **argv) {
	char line[512], reply[512];
	int fd, i;
	if (argc > 1 && strcmp(argv[1], "-d") == 0) {
		pid_t pid;
		if ((fd = mps_dial()) >= 0) {
			close(fd);
			printf("An instance of this daemon is already running\n");
			return 1;
		}
		pid = fork();
		if (pid < 0) return 1;
		if (pid == 0) {
			int null = open("/dev/null", O_RDWR);
			setsid();
			/* Let go of the caller's output, /dev/null or not. */
			if (null >= 0) { dup2(null, 0); dup2(null, 1); dup2(null, 2); if (null > 2) close(null); }
			else { close(0); close(1); close(2); }
			mps_daemon();
			return 0;
		}
		/* Return once the daemon answers, as the real one does. */
		for (i = 0; i < 500; i++) {
			struct timespec ts = {0, 10000000};
			if ((fd = mps_dial()) >= 0) { close(fd); return 0; }
			nanosleep(&ts, 0);
		}
		return 1;
	}
	if ((fd = mps_dial()) < 0) {
		fprintf(stderr, "Cannot find MPS control daemon process\n");
		return 1;
	}
	while (fgets(line, sizeof line, stdin)) {
		int n = strlen(line);
		while (n > 0 && (line[n-1] == '\n' || line[n-1] == ' ')) line[--n] = 0;
		if (n == 0) continue;
		strcat(line, "\n");
		if (write(fd, line, strlen(line)) < 0) return 1;
		if (mps_readline(fd, reply, sizeof reply) < 0) {
			if (strcmp(line, "quit\n") == 0) return 0;
			fprintf(stderr, "daemon closed the connection\n");
			return 1;
		}
		if (reply[0]) printf("%s\n", reply);
	}
	return 0;
}
`

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

// checkpointSource is the fake CUDA process checkpoint API (driver r570+:
// cuCheckpointProcessLock, ...Checkpoint, ...Restore, ...Unlock,
// ...GetState, ...GetRestoreThreadId) and the few device, context and
// memory calls a small CUDA program makes. As in the driver, a process's
// state (running, locked, checkpointed; the GPUs it was checkpointed on; its
// context's GPU; its "device memory") lives in that process: in variables
// of its own copy of this library, which the calls, made from another
// process, read and write through /proc/PID/mem. So it goes into a CRIU
// image with the process and comes back with it under its new PID. A call
// made in the wrong state fails (CUDA_ERROR_ILLEGAL_STATE), as on a GPU, so
// a caller that skips or reorders a step fails; a process that does not map
// libcuda has no state (CUDA_ERROR_NOT_INITIALIZED).
//
// The devices are GANTRY_CKPT_IDS (minor, UUID, model) whose /dev/nvidiaN
// node the process sees (its root's /dev, else the fake driver root's dev/,
// as a host process of a fake driver has no /dev/nvidiaN). A checkpoint
// notes the GPUs the process sees. A restore is checked as the driver's
// documentation and observed behaviour say: GPU UUID pairs, when given,
// must name every checkpointed GPU once (CUDA_ERROR_INVALID_VALUE), onto
// known GPUs (CUDA_ERROR_INVALID_DEVICE) of the same model
// (CUDA_ERROR_INVALID_VALUE); and every GPU restored onto must have its
// /dev/nvidiaN node in the process's mount namespace, else
// CUDA_ERROR_NOT_SUPPORTED (what 580 drivers answer when CRIU left the
// checkpoint's nodes in the container's /dev instead of the new GPU's).
//
// Each call is recorded in GANTRY_CKPT_DIR/calls as "OP PID ok|fail
// [detail]", and a line "OP" or "OP PID" in GANTRY_CKPT_DIR/fail makes it
// fail (CUDA_ERROR_UNKNOWN); a line "remap" makes every restore whose pairs
// move a GPU fail with CUDA_ERROR_NOT_SUPPORTED (a driver that cannot
// restore onto other GPUs). A restore's GPU UUID pairs are recorded as
// "pairs=OLD>NEW,..." in hex. 64-bit only (it needs libc).
const checkpointSource = `
#if __SIZEOF_POINTER__ == 8
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
enum { CKPT_RUNNING = 0, CKPT_LOCKED = 1, CKPT_CHECKPOINTED = 2 };
static const struct { int minor; const char *uuid, *name; } ckpt_ids[] = { GANTRY_CKPT_IDS {-1, 0, 0} };
volatile int gantry_ckpt_state = CKPT_RUNNING;
/* The GPUs (bits by minor) the process was checkpointed on, and its
 * context's GPU (a minor, -1 for none). */
volatile unsigned long long gantry_ckpt_gpus = 0;
volatile int gantry_ctx_minor = -1;
static unsigned char gantry_devmem[1 << 16];
static unsigned long gantry_devmem_used = 0;
/* ckpt_addr is where pid's copy of var is: its libcuda's first mapping
 * plus the variable's offset in this copy. */
static unsigned long ckpt_addr(int pid, volatile void *var) {
	Dl_info info;
	if (!dladdr((void *)&gantry_ckpt_state, &info) || !info.dli_fbase) return 0;
	unsigned long off = (unsigned long)((char *)var - (char *)info.dli_fbase);
	char p[64], line[4096], path[4096];
	snprintf(p, sizeof p, "/proc/%d/maps", pid);
	FILE *f = fopen(p, "r");
	if (!f) return 0;
	unsigned long base = 0, start, pgoff;
	while (!base && fgets(line, sizeof line, f)) {
		path[0] = 0;
		if (sscanf(line, "%lx-%*x %*s %lx %*s %*s %4095s", &start, &pgoff, path) < 3) continue;
		const char *b = strrchr(path, '/');
		b = b ? b + 1 : path;
		if (pgoff == 0 && !strncmp(b, "libcuda.so", 10)) base = start;
	}
	fclose(f);
	return base ? base + off : 0;
}
static int ckpt_var(int pid, volatile void *var, void *buf, size_t n, int write) {
	unsigned long a = ckpt_addr(pid, var);
	if (!a) return -1;
	char p[64];
	snprintf(p, sizeof p, "/proc/%d/mem", pid);
	int fd = open(p, (write ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	if (fd < 0) return -1;
	ssize_t r = write ? pwrite(fd, buf, n, (off_t)a) : pread(fd, buf, n, (off_t)a);
	close(fd);
	return r == (ssize_t)n ? 0 : -1;
}
static int ckpt_mem(int pid, int *st, int write) { return ckpt_var(pid, &gantry_ckpt_state, st, sizeof *st, write); }
static int ckpt_path(char *buf, size_t n, const char *name) {
	if (!GANTRY_CKPT_DIR[0]) return -1;
	snprintf(buf, n, "%s/%s", GANTRY_CKPT_DIR, name);
	return 0;
}
static int ckpt_should_fail(const char *op, int pid) {
	char p[4096], line[256], o[32];
	int who;
	if (ckpt_path(p, sizeof p, "fail")) return 0;
	FILE *f = fopen(p, "r");
	if (!f) return 0;
	int fail = 0;
	while (!fail && fgets(line, sizeof line, f)) {
		int n = sscanf(line, "%31s %d", o, &who);
		if (n >= 1 && !strcmp(o, op) && (n == 1 || who == pid)) fail = 1;
	}
	fclose(f);
	return fail;
}
static void ckpt_record(const char *op, int pid, const char *res, const char *detail) {
	char p[4096], line[8192];
	if (ckpt_path(p, sizeof p, "calls")) return;
	int fd = open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) return;
	int n = snprintf(line, sizeof line, "%s %d %s%s%s\n", op, pid, res, detail[0] ? " " : "", detail);
	if (n > 0) (void)!write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
	close(fd);
}
/* ckpt_sees reports whether process pid sees GPU minor's device node. */
static int ckpt_sees(int pid, int minor) {
	char p[4096];
	struct stat st;
	snprintf(p, sizeof p, "/proc/%d/root/dev/nvidia%d", pid, minor);
	if (stat(p, &st) == 0 && !S_ISDIR(st.st_mode)) return 1;
	if (!GANTRY_FAKE_ROOT[0]) return 0;
	snprintf(p, sizeof p, "/proc/%d/root%s/dev/nvidia%d", pid, GANTRY_FAKE_ROOT, minor);
	return stat(p, &st) == 0 && !S_ISDIR(st.st_mode);
}
static int ckpt_hex(char c) {
	if (c >= '0' && c <= '9') return c - '0';
	if (c >= 'a' && c <= 'f') return c - 'a' + 10;
	if (c >= 'A' && c <= 'F') return c - 'A' + 10;
	return -1;
}
static void ckpt_uuid(int i, unsigned char out[16]) {
	const char *s = ckpt_ids[i].uuid + 4;
	int n = 0;
	memset(out, 0, 16);
	for (; *s && n < 32; s++) {
		int h = ckpt_hex(*s);
		if (h < 0) continue;
		out[n / 2] |= (unsigned char)(n % 2 ? h : h << 4);
		n++;
	}
}
static int ckpt_find(const unsigned char u[16]) {
	unsigned char b[16];
	for (int i = 0; ckpt_ids[i].minor >= 0; i++) {
		ckpt_uuid(i, b);
		if (!memcmp(b, u, 16)) return i;
	}
	return -1;
}
static int ckpt_index_of_minor(int minor) {
	for (int i = 0; ckpt_ids[i].minor >= 0; i++)
		if (ckpt_ids[i].minor == minor) return i;
	return -1;
}
/* ckpt_seen is the GPUs process pid sees, by minor. */
static unsigned long long ckpt_seen(int pid) {
	unsigned long long m = 0;
	for (int i = 0; ckpt_ids[i].minor >= 0; i++)
		if (ckpt_ids[i].minor < 64 && ckpt_sees(pid, ckpt_ids[i].minor)) m |= 1ULL << ckpt_ids[i].minor;
	return m;
}
/* ckpt_step checks pid's state, records the call and moves pid to next. */
static int ckpt_step(const char *op, int pid, int want, int next, const char *detail) {
	int st;
	if (pid <= 0 || ckpt_mem(pid, &st, 0)) { ckpt_record(op, pid, "fail", "no-cuda"); return 3; /* CUDA_ERROR_NOT_INITIALIZED */ }
	if (st != want) { ckpt_record(op, pid, "fail", "illegal-state"); return 401; /* CUDA_ERROR_ILLEGAL_STATE */ }
	if (ckpt_should_fail(op, pid)) { ckpt_record(op, pid, "fail", "injected"); return 999; /* CUDA_ERROR_UNKNOWN */ }
	if (ckpt_mem(pid, &next, 1)) { ckpt_record(op, pid, "fail", "mem"); return 999; }
	ckpt_record(op, pid, "ok", detail);
	return 0;
}
typedef struct { unsigned int timeoutMs, reserved0; unsigned long long reserved1[7]; } ckpt_lock_args;
typedef struct { unsigned char old_uuid[16], new_uuid[16]; } ckpt_gpu_pair;
typedef struct { ckpt_gpu_pair *gpuPairs; unsigned int gpuPairsCount; char reserved[52]; } ckpt_restore_args;
int cuCheckpointProcessLock(int pid, ckpt_lock_args *a) {
	char d[32] = "";
	if (a) snprintf(d, sizeof d, "timeout=%u", a->timeoutMs);
	return ckpt_step("lock", pid, CKPT_RUNNING, CKPT_LOCKED, d);
}
int cuCheckpointProcessCheckpoint(int pid, void *a) {
	(void)a;
	unsigned long long seen = ckpt_seen(pid);
	int r = ckpt_step("checkpoint", pid, CKPT_LOCKED, CKPT_CHECKPOINTED, "");
	if (r == 0) ckpt_var(pid, &gantry_ckpt_gpus, &seen, sizeof seen, 1);
	return r;
}
int cuCheckpointProcessRestore(int pid, ckpt_restore_args *a) {
	char d[4096] = "";
	int st, ctx = -1;
	unsigned long long had = 0, onto = 0, olds = 0;
	if (pid <= 0 || ckpt_mem(pid, &st, 0)) { ckpt_record("restore", pid, "fail", "no-cuda"); return 3; }
	if (st != CKPT_CHECKPOINTED) { ckpt_record("restore", pid, "fail", "illegal-state"); return 401; }
	ckpt_var(pid, &gantry_ckpt_gpus, &had, sizeof had, 0);
	ckpt_var(pid, &gantry_ctx_minor, &ctx, sizeof ctx, 0);
	int newctx = ctx;
	if (a && a->gpuPairsCount) {
		size_t n = 0;
		int moved = 0;
		n += snprintf(d + n, sizeof d - n, "pairs=");
		for (unsigned int i = 0; i < a->gpuPairsCount && n < sizeof d - 80; i++) {
			if (i) d[n++] = ',';
			for (int j = 0; j < 16; j++) n += snprintf(d + n, sizeof d - n, "%02x", a->gpuPairs[i].old_uuid[j]);
			d[n++] = '>';
			for (int j = 0; j < 16; j++) n += snprintf(d + n, sizeof d - n, "%02x", a->gpuPairs[i].new_uuid[j]);
			if (memcmp(a->gpuPairs[i].old_uuid, a->gpuPairs[i].new_uuid, 16)) moved = 1;
		}
		d[n] = 0;
		if (moved && ckpt_should_fail("remap", 0)) { ckpt_record("restore", pid, "fail", "not-supported remap"); return 801; /* CUDA_ERROR_NOT_SUPPORTED */ }
		if (ckpt_ids[0].minor >= 0) {
			for (unsigned int i = 0; i < a->gpuPairsCount; i++) {
				int o = ckpt_find(a->gpuPairs[i].old_uuid), w = ckpt_find(a->gpuPairs[i].new_uuid);
				if (o < 0 || w < 0) { ckpt_record("restore", pid, "fail", "unknown-gpu"); return 101; /* CUDA_ERROR_INVALID_DEVICE */ }
				unsigned long long ob = 1ULL << ckpt_ids[o].minor, wb = 1ULL << ckpt_ids[w].minor;
				if ((olds & ob) || (onto & wb)) { ckpt_record("restore", pid, "fail", "duplicate-pair"); return 1; /* CUDA_ERROR_INVALID_VALUE */ }
				if (strcmp(ckpt_ids[o].name, ckpt_ids[w].name)) { ckpt_record("restore", pid, "fail", "other-model"); return 1; }
				olds |= ob;
				onto |= wb;
				if (ckpt_ids[o].minor == ctx) newctx = ckpt_ids[w].minor;
			}
			if ((had & ~olds) != 0) { ckpt_record("restore", pid, "fail", "pairs-miss-a-checkpointed-gpu"); return 1; }
		}
	} else {
		onto = had;
	}
	for (int m = 0; m < 64; m++)
		if ((onto >> m & 1) && !ckpt_sees(pid, m)) {
			char why[64];
			snprintf(why, sizeof why, "not-supported no-node=/dev/nvidia%d", m);
			ckpt_record("restore", pid, "fail", why);
			return 801;
		}
	int r = ckpt_step("restore", pid, CKPT_CHECKPOINTED, CKPT_LOCKED, d);
	if (r == 0 && newctx != ctx) ckpt_var(pid, &gantry_ctx_minor, &newctx, sizeof newctx, 1);
	return r;
}
int cuCheckpointProcessUnlock(int pid, void *a) { (void)a; return ckpt_step("unlock", pid, CKPT_LOCKED, CKPT_RUNNING, ""); }
int cuCheckpointProcessGetState(int pid, int *state) {
	if (!state) return 1;
	return ckpt_mem(pid, state, 0) ? 3 : 0;
}
int cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
	if (!tid || pid <= 0) return 1;
	*tid = pid;
	return 0;
}
int cuGetErrorName(int code, const char **s) {
	static const struct { int code; const char *name; } names[] = {
		{0, "CUDA_SUCCESS"}, {1, "CUDA_ERROR_INVALID_VALUE"}, {3, "CUDA_ERROR_NOT_INITIALIZED"},
		{101, "CUDA_ERROR_INVALID_DEVICE"}, {304, "CUDA_ERROR_OPERATING_SYSTEM"},
		{401, "CUDA_ERROR_ILLEGAL_STATE"}, {801, "CUDA_ERROR_NOT_SUPPORTED"}, {999, "CUDA_ERROR_UNKNOWN"}, {-1, 0}};
	if (!s) return 1;
	for (int i = 0; names[i].name; i++)
		if (names[i].code == code) { *s = names[i].name; return 0; }
	return 1;
}
/* Devices: the GPUs this process sees, in minor order of the table. */
static int ckpt_ordinal_minor(int ordinal) {
	int k = 0;
	for (int i = 0; ckpt_ids[i].minor >= 0; i++)
		if (ckpt_sees(getpid(), ckpt_ids[i].minor) && k++ == ordinal) return ckpt_ids[i].minor;
	return -1;
}
int cuDeviceGetCount(int *n) {
	if (!n) return 1;
	*n = 0;
	while (ckpt_ordinal_minor(*n) >= 0) (*n)++;
	return 0;
}
int cuDeviceGet(int *dev, int ordinal) {
	if (!dev || ckpt_ordinal_minor(ordinal) < 0) return 101;
	*dev = ordinal;
	return 0;
}
int cuDeviceGetUuid(unsigned char *uuid, int dev) {
	int m = ckpt_ordinal_minor(dev);
	if (!uuid || m < 0) return 101;
	ckpt_uuid(ckpt_index_of_minor(m), uuid);
	return 0;
}
int cuDeviceGetUuid_v2(unsigned char *uuid, int dev) { return cuDeviceGetUuid(uuid, dev); }
int cuDeviceGetName(char *name, int len, int dev) {
	int m = ckpt_ordinal_minor(dev);
	if (!name || len <= 0 || m < 0) return 101;
	snprintf(name, (size_t)len, "%s", ckpt_ids[ckpt_index_of_minor(m)].name);
	return 0;
}
int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
	int m = ckpt_ordinal_minor(dev);
	if (!ctx || m < 0) return 101;
	gantry_ctx_minor = m;
	*ctx = (void *)(long)(m + 1);
	return 0;
}
int cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
int cuCtxGetDevice(int *dev) {
	if (!dev) return 1;
	if (gantry_ctx_minor < 0) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
	if (gantry_ckpt_state != CKPT_RUNNING) return 401;
	for (int k = 0; ckpt_ordinal_minor(k) >= 0; k++)
		if (ckpt_ordinal_minor(k) == gantry_ctx_minor) { *dev = k; return 0; }
	return 101;
}
int cuMemAlloc_v2(unsigned long long *p, size_t n) {
	if (!p || gantry_ctx_minor < 0) return 201;
	if (n > sizeof gantry_devmem - gantry_devmem_used) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
	*p = (unsigned long long)(gantry_devmem + gantry_devmem_used);
	gantry_devmem_used += (n + 255) & ~255UL;
	return 0;
}
int cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n) {
	if (gantry_ckpt_state != CKPT_RUNNING) return 401;
	memcpy((void *)dst, src, n);
	return 0;
}
int cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n) {
	if (gantry_ckpt_state != CKPT_RUNNING) return 401;
	memcpy(dst, (void *)src, n);
	return 0;
}
#else
int cuDeviceGetCount(int *n) {
	if (!n) return 1;
	*n = 0;
	return 0;
}
#endif
`
