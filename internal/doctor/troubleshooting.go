package doctor

import (
	"fmt"
	"strings"
)

//go:generate go run ./gendoc ../../docs/troubleshooting.md

// needDocs says what each need means, for --help and the documentation.
var needDocs = map[Need]string{
	NeedDriver:     "the kernel driver check passed",
	NeedDocker:     "Docker is installed (`dockerd` on `PATH`, or its `daemon.json`)",
	NeedContainerd: "containerd's CRI socket answers or its `config.toml` exists",
	NeedCRIO:       "CRI-O's `crio.conf` or a drop-in exists",
	NeedKubernetes: "this is a Kubernetes node (`--kubelet-dir` exists)",
	NeedContainer:  "`--container` names a container",
	NeedPod:        "`--pod` names a pod",
}

// needDoc is needDocs[n], or for an engine's need (engineNeed) what it
// means.
func needDoc(n Need) string {
	if d, ok := needEngine(n); ok {
		return fmt.Sprintf("%s is installed (`%s` on `PATH`, or its configuration)", d.Title, d.Program)
	}
	return needDocs[n]
}

// needOtherwise says what Run does when a need does not hold.
func needOtherwise(needs []Need) string {
	for _, n := range needs {
		if n == NeedContainer || n == NeedPod {
			return "it is not reported"
		}
	}
	return "it is SKIP with the reason"
}

// Help lists the checks for gantry doctor --help: name, summary, and what
// each needs, in the order Run runs them.
func Help() string {
	var b strings.Builder
	b.WriteString("Checks, in order (a check whose need does not hold is SKIP, or absent without --container/--pod):\n")
	for _, c := range AllChecks() {
		line := c.Summary
		if len(c.Needs) > 0 {
			var needs []string
			for _, n := range c.Needs {
				needs = append(needs, string(n))
			}
			line += " [needs " + strings.Join(needs, ", ") + "]"
		}
		fmt.Fprintf(&b, "  %-27s %s\n", c.Name, line)
	}
	return strings.TrimRight(b.String(), "\n")
}

// Troubleshooting renders docs/troubleshooting.md from Checks. Regenerate
// the file with go generate ./internal/doctor; a test fails while it
// differs.
func Troubleshooting() string {
	var b strings.Builder
	b.WriteString(`# Troubleshooting: what ` + "`gantry doctor`" + ` checks

<!-- Generated from internal/doctor's Checks (catalog.go) by ` + "`go generate ./internal/doctor`" + `; edit the Checks, not this file. -->

"Why can't my container see the GPU?" ` + "`gantry doctor`" + ` walks the chain a GPU container
depends on, from the kernel module to the engine's configuration and, with ` + "`--container`" + `,
one running container (Docker's, containerd's, or with ` + "`--pod`" + ` a Kubernetes pod's, through
the CRI socket) and, on a Kubernetes node, the device plugin, its devices' health and the node's
GPU capacity. It prints one line per check, ` + "`PASS`" + `, ` + "`FAIL`" + `, ` + "`WARN`" + `, ` + "`INFO`" + ` or ` + "`SKIP`" + `,
with its evidence, and a ` + "`fix:`" + ` line under each failure and warning; a check whose prerequisite failed
is skipped and names it, so the first ` + "`FAIL`" + ` is the one to fix.
` + ExitCodes + `

` + "```sh" + `
sudo gantry doctor                        # the host: driver, device nodes, NVML, files, engines
sudo gantry doctor --container my-app     # and what one container got (Docker, then containerd)
sudo gantry doctor --pod default/cuda-job # and a pod's containers, through the CRI socket
gantry doctor --json                      # the same checks as JSON (name, status, ok, evidence, fix)
` + "```" + `

It reads Docker's, containerd's and CRI-O's configuration at their standard paths;
` + "`--docker-config`, `--containerd-config`, `--crio-config` and `--crio-dropins`" + ` point it elsewhere. On
simulated GPUs and a fake driver root, with the engines' files registered in a scratch
directory and the CDI spec generated into the spec directory (Podman, where installed, takes
GPUs only through it: without a spec, doctor fails the ` + "`cdi specs`" + ` check):

<!-- doctest: root -->
` + "```sh" + `
gantry sim driver-root $TMPDIR/driver
rt=$(command -v gantry-runtime)
gantry runtime configure --runtime docker --config-file $TMPDIR/daemon.json --runtime-path $rt
gantry runtime configure --runtime containerd --config-file $TMPDIR/containerd.toml --runtime-path $rt
gantry runtime configure --runtime crio --config-file $TMPDIR/crio.d/99-nvidia.toml --runtime-path $rt
gantry --gpus sim:h100x8 --driver-root $TMPDIR/driver cdi generate --output /var/run/cdi/nvidia.yaml
gantry --gpus sim:h100x8 --driver-root $TMPDIR/driver doctor \
    --docker-config $TMPDIR/daemon.json --containerd-config $TMPDIR/containerd.toml --crio-dropins $TMPDIR/crio.d
` + "```" + `

The checks, in the order doctor runs them:

`)
	for _, c := range AllChecks() {
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", c.Name, c.Verifies)
		if len(c.Needs) > 0 {
			var needs []string
			for _, n := range c.Needs {
				needs = append(needs, needDoc(n))
			}
			fmt.Fprintf(&b, "Runs when %s; otherwise %s.\n\n", strings.Join(needs, " and "), needOtherwise(c.Needs))
		}
		if len(c.Failures) == 0 {
			b.WriteString("Never fails.\n\n")
			continue
		}
		b.WriteString("| doctor reports | fix |\n| --- | --- |\n")
		for _, f := range c.Failures {
			fmt.Fprintf(&b, "| %s | %s |\n", cell(f.Reports), cell(f.Fix))
		}
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
