package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// notRunEntry accounts for documented command lines the docs test does not
// run: they need a container engine's daemon, a cluster, a GPU or the
// network.
type notRunEntry struct {
	// line matches the command line, without its comment and with white
	// space runs as one space (displayLine), from start to end.
	line string
	// tests run the line's equivalent against the real thing:
	// "DIR.TestName" or "DIR.TestName/subtest", DIR relative to the
	// repository root. Empty only when nothing in this repository can run
	// the line; why then says so.
	tests []string
	// why the line is not run here and, with tests, what they run.
	why string
}

func (e *notRunEntry) ref() string {
	if len(e.tests) == 0 {
		return "not run: " + e.why
	}
	return "run by " + strings.Join(e.tests, ", ")
}

// notRun lists every documented command line that go test ./docs does not
// run. Keep each entry as narrow as the lines it stands for: a new line
// that needs a daemon is added here only with the test that runs it.
var notRun = []notRunEntry{
	// The build and CI.
	{line: `make test`, why: "the test suite itself: CI's .ci/run runs this very line; run here, it would run this test inside itself"},
	{line: `sudo apt-get install -y golang gcc libc6-dev make`,
		why: "installs distribution packages (network, changes the host); on CI scripts/deps.sh installs the same build dependencies (make test-deps)"},
	{line: `sudo dnf install -y golang gcc glibc-devel make`,
		why: "installs RHEL packages (network, changes the host); CI is Debian"},

	// Docker.
	{line: `docker run --rm --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=[01] ubuntu nvidia-smi -L`,
		tests: []string{"test/engines.TestDocker/RuntimeNvidiaEnv"},
		why:   "needs a Docker daemon; the test registers the runtime with gantry runtime configure in a private dockerd and runs --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=1 on simulated GPUs"},
	{line: `docker run --rm --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=all -e NVIDIA_DRIVER_CAPABILITIES=compute,utility ubuntu nvidia-smi -L`,
		tests: []string{"test/engines.TestDocker/RuntimeNvidiaEnv"},
		why:   "needs a Docker daemon; the test runs the same runtime path with one GPU"},
	{line: `docker run --rm --gpus (all|'"device=1"') ubuntu nvidia-smi -L`,
		tests: []string{"test/engines.TestDocker/GPUsFlagHook"},
		why:   "needs a Docker daemon; the test runs docker run --gpus through plain runc and Gantry as nvidia-container-runtime-hook"},
	{line: `sudo systemctl restart docker`,
		tests: []string{"test/engines.TestDocker/RuntimesRegistered"},
		why:   "restarts the host's Docker; the test starts a private dockerd on the daemon.json gantry runtime configure wrote and checks that docker info lists the runtimes"},

	// containerd, Podman.
	{line: `ctr run --rm --runc-binary /usr/bin/gantry-runtime --env NVIDIA_VISIBLE_DEVICES=1 docker.io/library/ubuntu:latest gpu1 nvidia-smi -L`,
		tests: []string{"test/engines.TestContainerd/RuncBinaryEnv"},
		why:   "needs containerd; the test runs ctr run --runc-binary with Gantry's runtime and NVIDIA_VISIBLE_DEVICES=1 in a private containerd"},
	{line: `ctr images pull docker.io/library/ubuntu:latest`,
		tests: []string{"test/engines.TestContainerd"},
		why:   "pulls from Docker Hub (network); the test imports its image into a private containerd from a local archive instead"},
	{line: `podman run --rm --device nvidia.com/gpu=(0|all) ubuntu nvidia-smi -L`,
		tests: []string{"test/engines.TestPodman/CDI", "internal/cdispec.TestCDIRoundTrip"},
		why:   "pulls ubuntu (network) and needs a GPU for nvidia-smi; the first test runs gantry cdi generate --output /var/run/cdi/nvidia.yaml and podman run --device nvidia.com/gpu=1 and =all in a private rootful podman on simulated GPUs, the second checks the spec's names with the CNCF CDI library"},

	// Kubernetes.
	{line: `kubectl apply -f deployments/static/gantry-device-plugin.yaml`,
		tests: []string{"deployments.TestStaticManifests"},
		why:   "needs a cluster; the test decodes every object of the manifest strictly, as kubectl apply --validate=strict does"},
	{line: `kubectl apply -f deployments/static/gantry-dra-plugin.yaml`,
		tests: []string{"deployments.TestStaticManifests", "internal/draplugin.TestPrepareWritesClaimSpec"},
		why:   "needs a cluster with DRA; the first test decodes the manifest strictly and checks the DaemonSet's paths and RBAC, the second drives the plugin's gRPC service as the kubelet does"},
	{line: `kubectl (apply|delete) -f deployments/static/installer/gantry-node-installer.yaml|kubectl delete daemonset -n kube-system gantry-node-installer --cascade=foreground`,
		tests: []string{"deployments.TestStaticInstallerManifest", "test/cluster.TestNodeInstaller"},
		why:   "needs a cluster; the first test decodes the manifest strictly and checks the DaemonSet, the second applies it to the test cluster's node brought up without Gantry (up.sh --no-gantry), runs a GPU pod and deletes it"},
	{line: `sudo gantry node (install|uninstall) --host-root / --runtime crio`,
		tests: []string{"internal/nodeinstall.TestInstallUninstallContainerd", "internal/nodeinstall.TestInstallFailsClosed"},
		why:   "changes the host's engine configuration and restarts the engine; the tests do it to a private containerd with its CRI plugin"},
	{line: `helm install gantry deployments/helm/gantry --namespace kube-system( --set [a-zA-Z.]+=[a-z0-9-]+)*`,
		tests: []string{"deployments.TestHelmTemplate"},
		why:   "needs a cluster; the test renders the chart with helm template (defaults, time-slicing with 4 replicas, MIG mixed) and decodes it strictly"},
	{line: `kubectl -n kube-system exec \$\(kubectl -n kube-system get pods -l app.kubernetes.io/name=gantry --field-selector spec.nodeName=NODE -o name\) -- gantry doctor`,
		tests: []string{"internal/doctor.TestDoctorWithGantryPlugin", "internal/doctor.TestDoctorNodeAccess"},
		why:   "needs a cluster; the tests run doctor's Kubernetes checks against Gantry's plugin on simulated GPUs and the Node's capacity through an API server"},

	// The test cluster (test/cluster).
	{line: `sudo make (cluster-up|cluster-down|e2e-cluster)`,
		tests: []string{"test/cluster.TestNodeAdvertisesGPUs", "test/cluster.TestPodGetsTwoGPUs", "test/cluster.TestNoRequestNoGPU"},
		why:   "builds Kubernetes (10-15 min) and runs a cluster as root on fixed ports; make e2e-cluster (CI: make e2e-cluster-ci) brings it up, runs these tests against it and tears it down"},
	{line: `export KUBECONFIG=/etc/gantry-k8s/admin.conf PATH=\$PWD/bin/cluster:\$PATH`,
		tests: []string{"test/cluster.TestNodeAdvertisesGPUs"},
		why:   "points kubectl at the test cluster, which make e2e-cluster brings up for the tests"},
	{line: `kubectl get nodes|kubectl get node gantry-node -o jsonpath='\{\.status\.allocatable\.nvidia\\\.com/gpu\}'`,
		tests: []string{"test/cluster.TestNodeAdvertisesGPUs"},
		why:   "needs the test cluster; the test reads the Node's capacity, allocatable nvidia.com/gpu and labels from it"},
	// The image.
	{line: `docker build -t ghcr.io/gantry-gpu/gantry:0.1.0 --build-arg VERSION=\$\(git describe --tags --always --dirty\) \.`,
		tests: []string{"deployments.TestImageTagIsAppVersion"},
		why:   "pulls golang:1.26-bookworm and distroless (network); the test checks that the Dockerfile and scripts/build-image.sh define the same image, which test/engines.TestImageOffline builds and runs"},
	{line: `make image|scripts/build-image.sh -o /tmp/gantry.tar -t registry.example.com/gantry:dev`,
		tests: []string{"test/engines.TestImageOffline"},
		why:   "builds the image (four go builds, a few minutes on CI's 2 cores); the test runs scripts/build-image.sh, loads the archive into Docker and containerd and runs it as the DaemonSet does"},
	{line: `docker load -i bin/gantry-image.tar`,
		tests: []string{"test/engines.TestImageOffline/Docker", "test/engines.TestImageOffline/Containerd"},
		why:   "needs a Docker daemon (or containerd for ctr images import)"},

	// The create server.
	{line: `sudo systemctl daemon-reload`,
		tests: []string{"docs.TestSystemdUnits"},
		why:   "needs systemd as PID 1 and changes the host's units; the test installs the units with make install-systemd and checks them with systemd-analyze verify"},
	{line: `sudo systemctl enable --now gantry-runtime-server.socket`,
		tests: []string{"docs.TestSystemdUnits", "internal/shim.TestCreateServer"},
		why:   "needs systemd as PID 1; TestSystemdUnits checks the units make install installs (ExecStart, socket, systemd-analyze verify), TestCreateServer runs the server they start and GPU containers through it"},
	{line: `sudo gantry-runtime --create-server &`,
		tests: []string{"internal/shim.TestCreateServer", "internal/doctor.TestCreateServerNote"},
		why:   "a server on the host's /run/gantry/runtime.sock that would outlive the block; the tests start it the same way on a socket of their own (--socket) and run GPU containers and doctor against it"},

	// gantry doctor on a container or a pod.
	{line: `sudo gantry doctor --container my-app`,
		tests: []string{"test/engines.TestDoctorContainer"},
		why:   "needs a running GPU container; the test runs one in a private dockerd and drives doctor on it, its device rule present and removed"},
	{line: `sudo gantry doctor --container 3f2a9c --namespace k8s.io`,
		tests: []string{"test/engines.TestDoctorContainerd"},
		why:   "needs a running containerd task; the test runs one in a private containerd and drives doctor on it"},
	{line: `sudo gantry doctor --pod default/cuda-(test|job)`,
		tests: []string{"test/engines.TestDoctorPod"},
		why:   "needs a pod; the test creates one through the CRI of a private containerd and drives doctor --pod on it"},
	{line: `gantry doctor --json`,
		tests: []string{"internal/cli.TestDoctor"},
		why:   "on the host its exit code depends on the host's engines; the test runs gantry doctor --json on a fake driver root with a daemon.json with and without the runtime"},

	// The nvidia-docker generation.
	{line: `NV_GPU=0,1 nvidia-docker run --rm ubuntu nvidia-smi -L`,
		tests: []string{"internal/nvdocker.TestMainExecsDocker/run", "test/engines.TestDocker/RuntimeNvidiaEnv"},
		why:   "needs a Docker daemon; the first test checks the docker command line nvidia-docker execs for NV_GPU=0,1 (--runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=0,1), the second runs that command line against a real daemon"},
	{line: `nvidia-docker ps`,
		tests: []string{"internal/nvdocker.TestMainExecsDocker/passthrough"},
		why:   "needs a Docker daemon; the test checks that other commands reach docker unchanged"},
	{line: `docker run --rm \$\(curl -s localhost:3476/docker/cli\?dev=0\) ubuntu nvidia-smi -L`,
		tests: []string{"internal/cli.TestServe"},
		why:   "needs a Docker daemon and a GPU; the test checks the docker run arguments gantry serve answers on /docker/cli"},
	{line: `docker volume ls`,
		tests: []string{"test/engines.TestDockerVolumePlugin"},
		why:   "needs a Docker daemon; the test runs docker volume ls on a private dockerd that found the plugin's socket and sees nvidia_driver_<version>"},
	{line: `docker run --rm \$\(curl -s localhost:3476/docker/cli\?dev=0\) busybox ls /usr/local/nvidia/lib64`,
		tests: []string{"test/engines.TestDockerVolumePlugin", "internal/cli.TestNVIDIADockerPlugin"},
		why:   "needs a Docker daemon; the first test runs docker run with /docker/cli's arguments (the nvidia_driver volume and the devices) on a private dockerd and loads libcuda from /usr/local/nvidia/lib64, the second checks those arguments"},

	// Driver containers.
	{line: `sudo gantry --driver-root /run/nvidia/driver --dev-root / cdi generate --output /var/run/cdi/nvidia.yaml`,
		tests: []string{"internal/cdispec.TestCDIRoundTrip"},
		why:   "needs a driver container's files under /run/nvidia/driver and the GPUs' nodes in the host's /dev; the test generates a spec for a driver root /run/nvidia/driver with the device nodes elsewhere"},
	{line: `gantry-device-plugin --driver-root /run/nvidia/driver --dev-root /`,
		tests: []string{"internal/deviceplugin.TestParseNVIDIAConfig"},
		why:   "serves until stopped, on a driver container's files; the test reads the driver root /run/nvidia/driver and the dev root the plugin uses"},

	// GPU hosts.
	{line: `make gpu-check`,
		why: "needs NVIDIA GPUs: it compares gantry with nvidia-smi (README's Development section has its results)"},
	{line: `bench/device-plugin-footprint.sh( --allocations 1000 --gpus sim:a100x2-mig)?`,
		why: "a measurement with limits (binary size, RSS), not a test: memory targets live in bench/, never in timed tests; it builds the plugin and runs it against bench/fakekubelet by hand"},
	{line: `scripts/gpu-e2e.sh|bench/runtime-lifecycle.sh|bench/runtime-overhead.sh`,
		why: "needs NVIDIA GPUs and a real libcuda, run by hand as root on GPU hosts (README's Development section has the results); --sim runs them without one"},
}

var notRunRes = sync.OnceValue(func() []*regexp.Regexp {
	var res []*regexp.Regexp
	for _, e := range notRun {
		res = append(res, regexp.MustCompile("^(?:"+e.line+")$"))
	}
	return res
})

// notRunIndex returns the index of the entry for a display line, or -1.
func notRunIndex(line string) int {
	for i, re := range notRunRes() {
		if re.MatchString(line) {
			return i
		}
	}
	return -1
}

// notRunFor returns the entry for a display line, or nil.
func notRunFor(line string) *notRunEntry {
	if i := notRunIndex(line); i >= 0 {
		return &notRun[i]
	}
	return nil
}

// TestEveryCommandRunOrMapped: every documented command line is run by
// TestDoctests, or is the same line as one it runs, or is listed in notRun;
// every notRun entry matches a line and names tests that exist.
func TestEveryCommandRunOrMapped(t *testing.T) {
	type occurrence struct {
		where, text string
		doctest     bool
	}
	var all []occurrence
	ran := map[string]bool{}
	for _, file := range docFiles(t) {
		for _, b := range readBlocks(t, file) {
			if !isShell(b.lang) && !isTranscript(b) {
				continue
			}
			for _, l := range commandLines(b) {
				d := displayLine(l.text)
				if d == "" {
					continue // a comment
				}
				all = append(all, occurrence{fmt.Sprintf("%s:%d", file, l.at), d, b.doctest})
				if b.doctest && notRunFor(d) == nil {
					ran[d] = true
				}
			}
		}
	}

	used := make([]int, len(notRun))
	var nRun, nSame, nMapped, nReasoned int
	byTest := map[string]int{}
	for _, o := range all {
		if i := notRunIndex(o.text); i >= 0 {
			e := &notRun[i]
			used[i]++
			if len(e.tests) == 0 {
				nReasoned++
			} else {
				nMapped++
				for _, tst := range e.tests {
					byTest[tst]++
				}
			}
			continue
		}
		switch {
		case o.doctest:
			nRun++
		case ran[o.text]:
			nSame++
		default:
			t.Errorf("%s: %q is neither run nor accounted for: put its block under %s (or %s when it writes system paths) "+
				"so that go test ./docs runs it, or, when it needs a daemon, a cluster or a GPU, add an entry to notRun in docs/notrun_test.go "+
				"naming the test that runs its equivalent against the real engine", o.where, o.text, doctestMarker, rootDoctestMarker)
		}
	}
	for i, e := range notRun {
		if used[i] == 0 {
			t.Errorf("notRun entry %q matches no documented command line: remove it or fix its pattern", e.line)
		}
		if strings.TrimSpace(e.why) == "" {
			t.Errorf("notRun entry %q says not why the line is not run", e.line)
		}
		for _, ref := range e.tests {
			if err := testExists(ref); err != nil {
				t.Errorf("notRun entry %q: %v", e.line, err)
			}
		}
	}
	var tests []string
	for k, v := range byTest {
		tests = append(tests, fmt.Sprintf("%s (%d)", k, v))
	}
	sort.Strings(tests)
	t.Logf("%d documented command lines: %d run by the doctests, %d the same as a line run there, %d mapped to tests that run their equivalent, %d not run for the reason notRun gives",
		len(all), nRun, nSame, nMapped, nReasoned)
	t.Logf("mapped to: %s", strings.Join(tests, ", "))
}

// goFuncs caches the parsed test functions of a package directory.
var goFuncs = struct {
	sync.Mutex
	dirs map[string]map[string]*ast.FuncDecl
}{dirs: map[string]map[string]*ast.FuncDecl{}}

// testExists checks a reference DIR.TestName[/sub[/sub]]: DIR's _test.go
// files declare func TestName(*testing.T), and each subtest name is a
// string literal in its body (a t.Run name or a table entry's name).
func testExists(ref string) error {
	dot := strings.Index(ref, ".Test")
	if dot <= 0 {
		return fmt.Errorf("test reference %q: want DIR.TestName[/subtest]", ref)
	}
	dir, name := ref[:dot], ref[dot+1:]
	parts := strings.Split(name, "/")
	funcs, err := testFuncs(dir)
	if err != nil {
		return err
	}
	fn := funcs[parts[0]]
	if fn == nil {
		return fmt.Errorf("%s: no func %s(t *testing.T) in %s/*_test.go", ref, parts[0], dir)
	}
	lits := map[string]bool{}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if bl, ok := n.(*ast.BasicLit); ok && bl.Kind == token.STRING {
			if s, err := strconv.Unquote(bl.Value); err == nil {
				lits[s] = true
			}
		}
		return true
	})
	for _, sub := range parts[1:] {
		if !lits[sub] {
			return fmt.Errorf("%s: %s has no subtest %q (no such string literal in its body)", ref, parts[0], sub)
		}
	}
	return nil
}

func testFuncs(dir string) (map[string]*ast.FuncDecl, error) {
	goFuncs.Lock()
	defer goFuncs.Unlock()
	if m, ok := goFuncs.dirs[dir]; ok {
		return m, nil
	}
	files, err := filepath.Glob(filepath.Join(repoRoot, dir, "*_test.go"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no _test.go files in %s (%v)", dir, err)
	}
	m := map[string]*ast.FuncDecl{}
	fset := token.NewFileSet()
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			return nil, err
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || !takesTestingT(fn) {
				continue
			}
			m[fn.Name.Name] = fn
		}
	}
	goFuncs.dirs[dir] = m
	return m, nil
}

// takesTestingT: the function's one parameter is *testing.T.
func takesTestingT(fn *ast.FuncDecl) bool {
	p := fn.Type.Params.List
	if len(p) != 1 || len(p[0].Names) > 1 {
		return false
	}
	star, ok := p[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "testing" && sel.Sel.Name == "T"
}

// TestHelmLinesRender: with no cluster here, every documented helm install
// line is rendered with helm template and the same arguments, so a value
// the chart refuses (sharing.strategy=mps, one replica) or a typo in its
// path fails.
func TestHelmLinesRender(t *testing.T) {
	helm, err := exec.LookPath("helm")
	if err != nil {
		t.Skip("helm is not on PATH (Debian has no package; go install helm.sh/helm/v3/cmd/helm@v3.18.4); deployments.TestHelmTemplate skips the same way")
	}
	n := 0
	for _, file := range docFiles(t) {
		for _, b := range readBlocks(t, file) {
			if !isShell(b.lang) {
				continue
			}
			for _, l := range commandLines(b) {
				for _, words := range splitCommands(l.text) {
					prog, args := program(words)
					if prog != "helm" || len(args) == 0 || args[0] != "install" {
						continue
					}
					n++
					cmd := exec.Command(helm, append([]string{"template"}, args[1:]...)...)
					cmd.Dir = repoRoot
					if out, err := cmd.CombinedOutput(); err != nil {
						t.Errorf("%s:%d: helm template with the line's arguments: %v\n\t%s\n%s", file, l.at, err, l.text, out)
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no helm install line in the docs: the extraction is broken")
	}
	t.Logf("%d helm install lines rendered", n)
}
