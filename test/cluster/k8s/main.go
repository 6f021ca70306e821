// Command gantry-k8s is one static binary holding every component of the
// single-node Kubernetes cluster that test/cluster runs Gantry in: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl,
// containerd and ctr, each the upstream release's own main (Kubernetes
// v1.37.2, etcd v3.7.0, containerd v2.4.2), plus two helpers the cluster
// scripts need (pki, oci-image). It picks the component from the name it is
// run as (a symlink, as hyperkube did) or from its first argument:
//
//	gantry-k8s kubelet --config ...     kubelet --config ...
//
// One binary rather than eight: one build of the shared packages, one file
// to carry to a GPU host with no compiler or network (about 30 MB as .xz).
// Each component still runs as its own process, so feature gates and metric
// registries stay per process. It lives in a module of its own so that the
// main module's dependencies stay lean.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	ctrapp "github.com/containerd/containerd/v2/cmd/ctr/app"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	containerd "github.com/containerd/containerd/v2/cmd/containerd/command"

	// What the upstream mains import for their side effects.
	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
)

var components = map[string]func(args []string) int{
	"etcd":           func(args []string) int { etcdmain.Main(args); return 0 },
	"kube-apiserver": func([]string) int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func([]string) int {
		return cli.Run(kcm.NewControllerManagerCommand())
	},
	"kube-scheduler": func([]string) int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubelet": func([]string) int {
		return cli.Run(kubelet.NewKubeletCommand(context.Background()))
	},
	"kubectl": func([]string) int { return cli.Run(kubectl.NewDefaultKubectlCommand()) },
	"containerd": func(args []string) int {
		if err := containerd.App().Run(context.Background(), args); err != nil {
			fmt.Fprintln(os.Stderr, "containerd:", err)
			return 1
		}
		return 0
	},
	"ctr": func(args []string) int {
		if err := ctrapp.New().Run(context.Background(), args); err != nil {
			fmt.Fprintln(os.Stderr, "ctr:", err)
			return 1
		}
		return 0
	},
	"pki": pkiMain,
	"net": netMain,
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok && len(os.Args) > 1 {
		// gantry-k8s NAME ARGS...: run NAME as if it were argv[0], so the
		// cobra commands see their own flags only.
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	run, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "gantry-k8s: run as one of %v (a symlink with that name, or gantry-k8s NAME ARGS...)\n", names)
		os.Exit(2)
	}
	os.Exit(run(os.Args))
}
