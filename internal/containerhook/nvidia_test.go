package containerhook

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// runNVHook runs the static hook binary under NVIDIA's name, as a runtime
// runs it from a spec nvidia-ctk wrote, with state on stdin. It returns
// stderr and the error.
func runNVHook(t *testing.T, state []byte, args ...string) (string, error) {
	t.Helper()
	hook := buildHook(t)
	nv := filepath.Join(t.TempDir(), "nvidia-cdi-hook")
	if err := os.Symlink(hook, nv); err != nil {
		t.Fatal(err)
	}
	cmd := &exec.Cmd{Path: nv, Args: append([]string{nv}, args...), Stdin: bytes.NewReader(state)}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	return stderr.String(), err
}

func modeOf(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode() & (os.ModePerm | os.ModeSticky | os.ModeSetgid | os.ModeSetuid)
}

// chmod changes what the container has at each path, follows the image's
// symlinks only inside the root, and skips missing paths. The host files
// the image's links name keep their modes.
func TestNVChmod(t *testing.T) {
	dir := basicRoot(t)
	mkdirs(t, dir, "dev/dri", "dev/inside")
	if err := os.Chmod(filepath.Join(dir, "dev/dri"), 0o700); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(t.TempDir(), "host-secret")
	writeFile(t, host, "x")
	if err := os.Chmod(host, 0o600); err != nil {
		t.Fatal(err)
	}
	hostDir := filepath.Dir(host)
	rel, _ := filepath.Rel(filepath.Join(dir, "dev"), host)
	for name, target := range map[string]string{
		"dev/abs":    host,             // absolute: resolves to <root>/<host path>, missing
		"dev/rel":    rel,              // ../../..: clamped at the root
		"dev/hostd":  hostDir,          // a host directory
		"dev/inlink": "/dev/inside",    // inside the root: followed
		"dev/dots":   "../../../../..", // the root itself at worst
	} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	rootMode := modeOf(t, dir)
	hostDirMode := modeOf(t, hostDir)
	state := bundle(t, dir)
	args := []string{"chmod", "--mode", "1755"}
	for _, p := range []string{"/dev/dri", "/dev/abs", "/dev/rel", "/dev/hostd", "/dev/inlink", "/missing/file"} {
		args = append(args, "--path", p)
	}
	if msg, err := runNVHook(t, state, args...); err != nil {
		t.Fatalf("chmod: %v\n%s", err, msg)
	}
	if m := modeOf(t, filepath.Join(dir, "dev/dri")); m != 0o755|os.ModeSticky {
		t.Errorf("/dev/dri mode %v, want 1755", m)
	}
	if m := modeOf(t, filepath.Join(dir, "dev/inside")); m != 0o755|os.ModeSticky {
		t.Errorf("/dev/inside (through an in-root link) mode %v, want 1755", m)
	}
	if m := modeOf(t, host); m != 0o600 {
		t.Errorf("the host file behind an image symlink changed mode: %v", m)
	}
	if m := modeOf(t, hostDir); m != hostDirMode {
		t.Errorf("the host directory behind an image symlink changed mode: %v, was %v", m, hostDirMode)
	}
	if m := modeOf(t, dir); m != rootMode {
		t.Errorf("the root changed mode: %v, was %v", m, rootMode)
	}
	// The same through /dev/dots, which names the root: it is the image's
	// own root directory, never the host's /.
	if msg, err := runNVHook(t, state, "chmod", "--mode", "700", "--path", "/dev/dots"); err != nil {
		t.Fatalf("chmod /dev/dots: %v\n%s", err, msg)
	}
	if m := modeOf(t, dir); m != 0o700 {
		t.Errorf("/dev/dots resolved elsewhere than the root: root mode %v", m)
	}
	if m := modeOf(t, "/"); m&0o077 == 0 {
		t.Errorf("the host's / lost its group and other bits: %v", m)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"chmod", "--path", "/dev/dri"}, "need --mode"},
		{[]string{"chmod", "--mode", "9", "--path", "/dev/dri"}, "octal"},
		{[]string{"chmod", "--mode", "17777", "--path", "/dev/dri"}, "octal"},
		{[]string{"chmod", "--mode", "755", "--path", " "}, "--path"},
	} {
		msg, err := runNVHook(t, state, tc.args...)
		if err == nil || !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 {
			t.Errorf("%v: err %v, stderr %q; want a one-line error with %q", tc.args, err, msg, tc.want)
		}
	}
	// --container-spec names a state file instead of stdin.
	sf := filepath.Join(t.TempDir(), "state.json")
	writeFile(t, sf, string(state))
	if msg, err := runNVHook(t, nil, "chmod", "--mode", "711", "--path", "/dev/dri", "--container-spec", sf); err != nil {
		t.Fatalf("chmod --container-spec: %v\n%s", err, msg)
	}
	if m := modeOf(t, filepath.Join(dir, "dev/dri")); m != 0o711 {
		t.Errorf("/dev/dri mode %v after --container-spec, want 711", m)
	}
}

// enable-cuda-compat then update-ldcache, as a spec of nvidia-ctk 1.18+ runs
// them: the image's newer compat libcuda is what the real loader then loads;
// an older one leaves the host driver's, and no ld.so.conf.d file is made.
func TestNVEnableCUDACompatThroughTheLoader(t *testing.T) {
	for _, tc := range []struct {
		name, compat string
		args         []string
		want         string
	}{
		{"newer major", "libcuda.so.999.1.1", []string{"--host-driver-version", "580.159.04"}, "1"},
		{"same major", "libcuda.so.580.200.1", []string{"--host-driver-version", "580.159.04"}, wantVersion},
		{"older", "libcuda.so.100.1.1", []string{"--host-driver-version", "580.159.04"}, wantVersion},
		{"no versions", "libcuda.so.999.1.1", nil, wantVersion},
		// Without the ELF note the CUDA version alone cannot decide.
		{"cuda version only", "libcuda.so.999.1.1", []string{"--host-cuda-version", "12.0"}, wantVersion},
		{"other directory", "libcuda.so.999.1.1", []string{"--host-driver-version", "580.159.04", "--cuda-compat-container-root", "/opt/compat"}, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			compatDir := CompatDir
			if strings.Contains(tc.name, "other") {
				compatDir = "/opt/compat"
			}
			dir := imageRoot(t, func(dir string) {
				mkdirs(t, dir, compatDir)
				copyFile(t, filepath.Join(artifacts, stubLib), filepath.Join(dir, compatDir, tc.compat))
			})
			state := bundle(t, dir)
			for _, args := range [][]string{
				append([]string{"enable-cuda-compat"}, tc.args...),
				{"create-symlinks", "--link", driverLib + "::" + nvDir + "/libcuda.so.1"},
				{"update-ldcache", "--folder", nvDir, "--ldconfig-path", "/sbin/ldconfig"},
			} {
				if msg, err := runNVHook(t, state, args...); err != nil {
					t.Fatalf("%v: %v\n%s", args, err, msg)
				}
			}
			if out, err := probe(t, dir); err != nil || out != tc.want {
				t.Errorf("probe: %q, %v; want %s", out, err, tc.want)
			}
			confs, _ := filepath.Glob(filepath.Join(dir, "etc/ld.so.conf.d", CompatConfPrefix+"*.conf"))
			if (len(confs) == 1) != (tc.want == "1") || len(confs) > 1 {
				t.Fatalf("compat conf files %v; want one only when compat is used", confs)
			}
			if len(confs) == 1 {
				b, _ := os.ReadFile(confs[0])
				if string(b) != compatDir+"\n" {
					t.Errorf("%s holds %q, want %q", confs[0], b, compatDir+"\n")
				}
				if m := modeOf(t, confs[0]); m != 0o644 {
					t.Errorf("%s mode %v, want 0644 (readable by a non-root user)", confs[0], m)
				}
			}
		})
	}
}

// The .note.cuda.fwd_compatibility ELF note of a real gcc-built library
// decides when present: the host driver's branch must be listed.
func TestNVCompatNote(t *testing.T) {
	needArtifacts(t)
	desc := `{"Format":1,"CUDA Version":"13.0","Driver":[535,550,570],"Device":[]}`
	src := fmt.Sprintf(`struct note { unsigned namesz, descsz, type; char name[20]; char desc[%d]; };
__attribute__((section(".note.cuda.fwd_compatibility"), used, aligned(4)))
static const struct note n = { 19, %d, 1, "NVIDIA Corporation", %q };
int cuDriverGetVersion(int *v) { *v = 1; return 0; }
`, (len(desc)+4)&^3, len(desc), desc)
	dir := basicRoot(t)
	mkdirs(t, dir, CompatDir)
	c := filepath.Join(t.TempDir(), "note.c")
	writeFile(t, c, src)
	lib := filepath.Join(dir, CompatDir, "libcuda.so.580.95.05")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", lib, c).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	r := openRoot(t, dir)
	note, err := readCompatNote(r, CompatDir+"/libcuda.so.580.95.05")
	if err != nil || note == nil || note.CUDAVersion != "13.0" || len(note.Driver) != 3 {
		t.Fatalf("note %+v, %v", note, err)
	}
	for _, tc := range []struct {
		host, cuda string
		want       bool
	}{
		{"570.124.06", "", true},  // listed branch, compat newer
		{"550.54.15", "", true},   // listed branch
		{"575.51.03", "", false},  // branch not listed
		{"580.95.05", "", false},  // the same version: not newer
		{"", "12.8", true},        // no driver version: CUDA 13.0 > 12.8
		{"", "13.0", false},       // not newer
		{"bogus", "12.8", true},   // unreadable driver version: by CUDA version
		{"bogus", "", false},      //
		{"470.256.02", "", false}, // branch not listed
		{"535.261.03", "9", true}, // the driver version decides before the CUDA one
	} {
		conf, err := EnableCUDACompat(r, CompatDir, tc.host, tc.cuda, nil)
		if err != nil || (conf != "") != tc.want {
			t.Errorf("host %q cuda %q: conf %q, %v; want used=%v", tc.host, tc.cuda, conf, err, tc.want)
		}
		if conf != "" {
			os.Remove(filepath.Join(dir, conf))
		}
	}
}

// A compat directory or conf directory that is a symlink out of the image
// resolves inside it: the hook neither reads the host's files nor writes
// through the link.
func TestNVEnableCUDACompatHostileLinks(t *testing.T) {
	dir := basicRoot(t)
	host := t.TempDir()
	mkdirs(t, host, "compat", "conf.d")
	copyFile(t, filepath.Join(artifacts, stubLib), filepath.Join(host, "compat", "libcuda.so.999.1.1"))
	mkdirs(t, dir, "usr/local/cuda")
	if err := os.Symlink(filepath.Join(host, "compat"), filepath.Join(dir, CompatDir)); err != nil {
		t.Fatal(err)
	}
	r := openRoot(t, dir)
	if conf, err := EnableCUDACompat(r, CompatDir, "580.159.04", "", nil); err != nil || conf != "" {
		t.Fatalf("a compat dir linking to the host was used: %q, %v", conf, err)
	}
	// Now a real compat dir, with /etc/ld.so.conf.d a link to a host dir.
	os.Remove(filepath.Join(dir, CompatDir))
	mkdirs(t, dir, CompatDir)
	copyFile(t, filepath.Join(artifacts, stubLib), filepath.Join(dir, CompatDir, "libcuda.so.999.1.1"))
	if err := os.Symlink(filepath.Join(host, "conf.d"), filepath.Join(dir, "etc/ld.so.conf.d")); err != nil {
		t.Fatal(err)
	}
	// The link leads to a directory the root lacks: refused, not created
	// on the host.
	if conf, err := EnableCUDACompat(r, CompatDir, "580.159.04", "", nil); err == nil {
		t.Errorf("wrote %s through a dangling image link", conf)
	}
	mkdirs(t, dir, filepath.Join(host, "conf.d"))
	conf, err := EnableCUDACompat(r, CompatDir, "580.159.04", "", nil)
	if err != nil || conf == "" {
		t.Fatalf("EnableCUDACompat: %q, %v", conf, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(host, "conf.d")); len(ents) != 0 {
		t.Errorf("the hook wrote into the host directory the image linked to: %v", ents)
	}
	if _, err := os.Stat(filepath.Join(dir, host, "conf.d", filepath.Base(conf))); err != nil {
		t.Errorf("the conf file is not where the link resolves inside the root: %v", err)
	}
}

func TestDisabledParams(t *testing.T) {
	for in, want := range map[string]string{
		"ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n": "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\nDeviceFileUID: 0\n",
		"ModifyDeviceFiles: 1":                       "ModifyDeviceFiles: 0\n",
		"ModifyDeviceFiles: 0\nDeviceFileUID: 0\n":   "",
		"DeviceFileUID: 0\n":                         "",
		"ModifyDeviceFiles: 2\nModifyDeviceFiles: 1": "ModifyDeviceFiles: 2\nModifyDeviceFiles: 0\n",
	} {
		if got := string(DisabledParams([]byte(in))); got != want {
			t.Errorf("DisabledParams(%q) = %q, want %q", in, got, want)
		}
	}
}

// MountParams in a mount namespace of its own (unshare -m): the
// container's params file shows the copy, read-only, and the host's file
// and the image are unchanged. A params path that is a symlink out of the
// image is not mounted over.
func TestNVMountParams(t *testing.T) {
	if os.Getenv("GANTRY_TEST_PARAMS_ROOT") != "" {
		mountParamsChild(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: mounting needs root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("skipping: unshare not installed")
	}
	for _, hostile := range []bool{false, true} {
		dir := t.TempDir()
		hostFile := filepath.Join(t.TempDir(), "params")
		writeFile(t, hostFile, "ModifyDeviceFiles: 1\n")
		if hostile {
			mkdirs(t, dir, "proc/driver/nvidia")
			if err := os.Symlink(hostFile, filepath.Join(dir, "proc/driver/nvidia/params")); err != nil {
				t.Fatal(err)
			}
		} else {
			mkdirs(t, dir, "proc/driver/nvidia")
			writeFile(t, filepath.Join(dir, "proc/driver/nvidia/params"), "ModifyDeviceFiles: 1\n")
		}
		tmp := t.TempDir()
		cmd := exec.Command("unshare", "-m", "--propagation", "private", os.Args[0], "-test.run=^TestNVMountParams$", "-test.v")
		cmd.Env = append(os.Environ(), "GANTRY_TEST_PARAMS_ROOT="+dir, fmt.Sprintf("GANTRY_TEST_PARAMS_HOSTILE=%v", hostile), "GANTRY_TEST_PARAMS_HOST="+hostFile, "TMPDIR="+tmp)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS") {
			t.Fatalf("in a private mount namespace (hostile=%v): %v\n%s", hostile, err, out)
		}
		if b, _ := os.ReadFile(hostFile); string(b) != "ModifyDeviceFiles: 1\n" {
			t.Errorf("the host's params file changed: %q", b)
		}
		if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
			t.Errorf("scratch left behind in TMPDIR: %v", ents)
		}
	}
}

func mountParamsChild(t *testing.T) {
	dir := os.Getenv("GANTRY_TEST_PARAMS_ROOT")
	hostile := os.Getenv("GANTRY_TEST_PARAMS_HOSTILE") == "true"
	hostFile := os.Getenv("GANTRY_TEST_PARAMS_HOST")
	r := openRoot(t, dir)
	if err := MountParams(r, DisabledParams([]byte("ModifyDeviceFiles: 1\n"))); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(hostFile); string(b) != "ModifyDeviceFiles: 1\n" {
		t.Fatalf("the host file behind the image's link shows %q", b)
	}
	if hostile {
		return
	}
	p := filepath.Join(dir, "proc/driver/nvidia/params")
	if b, err := os.ReadFile(p); err != nil || string(b) != "ModifyDeviceFiles: 0\n" {
		t.Fatalf("the container's params file reads %q, %v", b, err)
	}
	if err := os.WriteFile(p, []byte("ModifyDeviceFiles: 1\n"), 0o644); err == nil {
		t.Fatal("the params copy is writable")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil || st.Flags&unix.ST_RDONLY == 0 {
		t.Fatalf("the params copy's mount is not read-only: flags %#x, %v", st.Flags, err)
	}
}

// update-application-profile writes the mask of the container's GPU minors;
// a regular file named like a GPU node does not count, and a container
// without GPU nodes gets no profile.
func TestNVUpdateApplicationProfile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: mknod needs root")
	}
	dir := basicRoot(t)
	mkdirs(t, dir, "dev")
	state := bundle(t, dir)
	if msg, err := runNVHook(t, state, "update-application-profile"); err != nil {
		t.Fatalf("no GPUs: %v\n%s", err, msg)
	}
	if _, err := os.Stat(filepath.Join(dir, AppProfileFile)); err == nil {
		t.Fatal("a profile was written for a container without GPU nodes")
	}
	for _, m := range []uint32{0, 3} {
		if err := unix.Mknod(filepath.Join(dir, fmt.Sprintf("dev/nvidia%d", m)), unix.S_IFCHR|0o666, int(unix.Mkdev(195, m))); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "dev/nvidia5"), "not a node")
	if err := unix.Mknod(filepath.Join(dir, "dev/nvidiactl"), unix.S_IFCHR|0o666, int(unix.Mkdev(195, 255))); err != nil {
		t.Fatal(err)
	}
	if msg, err := runNVHook(t, state, "update-application-profile"); err != nil {
		t.Fatalf("update-application-profile: %v\n%s", err, msg)
	}
	b, err := os.ReadFile(filepath.Join(dir, AppProfileFile))
	if err != nil || !strings.Contains(string(b), `"EGLVisibleDGPUDevices",0x9]`) {
		t.Fatalf("profile %q, %v; want mask 0x9", b, err)
	}
}

// noop does nothing and succeeds, without state; it is not listed.
func TestNVNoop(t *testing.T) {
	msg, err := runNVHook(t, nil, "noop")
	if err != nil || msg != "" {
		t.Errorf("noop: %v, %q", err, msg)
	}
	out, _ := exec.Command(buildHook(t), "--help").Output()
	if strings.Contains(string(out), "noop") || !strings.Contains(string(out), "enable-cuda-compat") {
		t.Errorf("--help lists noop or misses enable-cuda-compat:\n%s", out)
	}
}

// The whole disable-device-node-modification command, as the static binary
// runs it: in a private mount namespace whose /proc/driver is a tmpfs
// holding a host params file with ModifyDeviceFiles: 1 (no driver is
// needed), the container's params file then reads 0, and only there.
func TestNVDisableDeviceNodeModificationCommand(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: mounting needs root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("skipping: unshare not installed")
	}
	hook := buildHook(t)
	dir := basicRoot(t)
	mkdirs(t, dir, "proc/driver/nvidia")
	writeFile(t, filepath.Join(dir, "proc/driver/nvidia/params"), "ModifyDeviceFiles: 1\nDeviceFileUID: 0\n")
	state := filepath.Join(t.TempDir(), "state.json")
	writeFile(t, state, string(bundle(t, dir)))
	script := `set -e
mount -t tmpfs tmpfs /proc/driver
mkdir -p /proc/driver/nvidia
printf 'ModifyDeviceFiles: 1\nDeviceFileUID: 0\n' > /proc/driver/nvidia/params
"$1" disable-device-node-modification < "$2"
cat "$3/proc/driver/nvidia/params"
echo host:; cat /proc/driver/nvidia/params`
	out, err := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", hook, state, dir).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := "ModifyDeviceFiles: 0\nDeviceFileUID: 0\nhost:\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n"
	if string(out) != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "proc/driver/nvidia/params")); !strings.Contains(string(b), "ModifyDeviceFiles: 1") {
		t.Errorf("the image's file itself changed: %q", b)
	}
}

func TestIsGPUNode(t *testing.T) {
	for name, want := range map[string]bool{
		"nvidia0": true, "nvidia7": true, "nvidia15": true,
		"nvidia": false, "nvidiactl": false, "nvidia-uvm": false, "nvidia-caps": false,
		"nvidia0x": false, "xnvidia0": false, "nvidia-modeset": false, "nvidia٣": false, "": false,
	} {
		if got := isGPUNode(name); got != want {
			t.Errorf("isGPUNode(%q) = %v, want %v", name, got, want)
		}
	}
}
