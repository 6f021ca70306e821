// Package deployments holds the Kubernetes manifests and the Helm chart;
// this test checks that they decode into the API's typed objects.
package deployments

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	sigsyaml "sigs.k8s.io/yaml"
)

// strict decodes YAML into the typed objects of client-go's scheme and
// fails on unknown or duplicate fields, as `kubectl apply --validate=strict`
// does.
var strict = json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
	json.SerializerOptions{Yaml: true, Strict: true})

// decodeAll splits a multi-document YAML stream and decodes each document.
// Kinds the scheme does not know (ServiceMonitor) come back unstructured.
func decodeAll(data []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufioReader(data))
	var objs []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
			return nil, err
		}
		gvk := schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind)
		if !scheme.Scheme.Recognizes(gvk) {
			u := &unstructured.Unstructured{}
			if err := sigsyaml.Unmarshal(doc, &u.Object); err != nil {
				return nil, fmt.Errorf("%s: %w", gvk, err)
			}
			objs = append(objs, u)
			continue
		}
		obj, _, err := strict.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", gvk, err)
		}
		objs = append(objs, obj)
	}
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

// check applies the rules every rendering must meet and returns the objects
// by kind.
func check(t *testing.T, objs []runtime.Object) map[string][]runtime.Object {
	t.Helper()
	objs, dra := splitDRA(objs)
	objs, inst := splitInstaller(objs)
	byKind := map[string][]runtime.Object{}
	if len(dra) > 0 {
		byKind["dra"] = dra
	}
	if len(inst) > 0 {
		byKind["installer"] = inst
	}
	for _, o := range objs {
		kind := fmt.Sprintf("%T", o)
		if u, ok := o.(*unstructured.Unstructured); ok {
			kind = u.GetKind()
			if u.GetName() == "" {
				t.Errorf("%s without a name", kind)
			}
		}
		if ds, ok := o.(*appsv1.DaemonSet); ok && strings.HasSuffix(ds.Name, "-mps-control-daemon") {
			kind = mpsKind
		}
		byKind[kind] = append(byKind[kind], o)
	}
	for _, o := range byKind[mpsKind] {
		checkMPSDaemon(t, o.(*appsv1.DaemonSet), byKind)
	}
	for _, want := range []string{"*v1.DaemonSet", "*v1.ServiceAccount", "*v1.ClusterRole", "*v1.ClusterRoleBinding", "*v1.ConfigMap", "*v1.RuntimeClass"} {
		if len(byKind[want]) != 1 {
			t.Errorf("%d objects of kind %s, want 1", len(byKind[want]), want)
		}
	}
	if len(byKind["*v1.DaemonSet"]) != 1 || len(byKind["*v1.ConfigMap"]) != 1 {
		return byKind
	}
	ds := byKind["*v1.DaemonSet"][0].(*appsv1.DaemonSet)
	pod := ds.Spec.Template
	for k, v := range ds.Spec.Selector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("DaemonSet selector %s=%s does not match the pod template's labels %v", k, v, pod.Labels)
		}
	}
	if !slices.ContainsFunc(pod.Spec.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Key == "nvidia.com/gpu" && tl.Effect == corev1.TaintEffectNoSchedule && tl.Operator == corev1.TolerationOpExists
	}) {
		t.Errorf("no toleration of the nvidia.com/gpu NoSchedule taint: %v", pod.Spec.Tolerations)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if !strings.HasPrefix(c.Image, "ghcr.io/gantry-gpu/gantry:") || len(c.Command) == 0 || c.Command[0] != "gantry-device-plugin" {
		t.Errorf("container image %q command %v", c.Image, c.Command)
	}
	for _, p := range imageProblems(readImage(t), pod.Spec, true) {
		t.Error(p)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Error("NODE_NAME is not set from spec.nodeName")
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			t.Errorf("mount %s names no volume", m.Name)
			continue
		}
		mounts[m.MountPath] = m.Name
		if v.HostPath != nil {
			mounts["host:"+v.HostPath.Path] = m.Name
		}
	}
	for _, p := range []string{"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources", "host:/dev", "host:/run/nvidia", "/etc/gantry"} {
		if _, ok := mounts[p]; !ok {
			t.Errorf("nothing mounted for %s (mounts %v)", p, mounts)
		}
	}
	cm := byKind["*v1.ConfigMap"][0].(*corev1.ConfigMap)
	var cfg map[string]any
	if err := sigsyaml.UnmarshalStrict([]byte(cm.Data["config.yaml"]), &cfg); err != nil || cfg["version"] != "v1" {
		t.Errorf("config.yaml in the ConfigMap: %v, %v", cfg, err)
	}
	if rcs := byKind["*v1.RuntimeClass"]; len(rcs) == 1 {
		rc := rcs[0].(*nodev1.RuntimeClass)
		if rc.Name != "nvidia" || rc.Handler != "nvidia" {
			t.Errorf("RuntimeClass %s handler %s, want nvidia/nvidia", rc.Name, rc.Handler)
		}
	}
	if crs := byKind["*v1.ClusterRole"]; len(crs) == 1 {
		cr := crs[0].(*rbacv1.ClusterRole)
		if !slices.ContainsFunc(cr.Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.Resources, "nodes") && slices.Contains(r.Verbs, "patch") && slices.Contains(r.Verbs, "get")
		}) {
			t.Errorf("ClusterRole cannot get and patch nodes: %v", cr.Rules)
		}
	}
	return byKind
}

func TestStaticManifests(t *testing.T) {
	files, err := filepath.Glob("static/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no static manifests: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decodeAll(data)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if filepath.Base(f) == "gantry-dra-plugin.yaml" {
				rest, dra := splitDRA(objs)
				checkDRA(t, dra, rest, true)
				return
			}
			if byKind := check(t, objs); len(byKind["dra"]) != 0 {
				t.Errorf("%s holds DRA plugin objects; they belong in gantry-dra-plugin.yaml", f)
			}
		})
	}
}

// mpsKind is the byKind key of the MPS control daemon's DaemonSet.
const mpsKind = "mps-daemonset"

// checkMPSDaemon: the MPS control daemon's DaemonSet runs the image's
// gantry-device-plugin mps-control-daemon with the plugin's config, on the
// host's PID namespace, with the MPS root at its host path, Bidirectional (each
// daemon's shm is a tmpfs under it), and its pods are not the plugin DaemonSet's.
func checkMPSDaemon(t *testing.T, ds *appsv1.DaemonSet, byKind map[string][]runtime.Object) {
	t.Helper()
	pod := ds.Spec.Template.Spec
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("MPS DaemonSet selector %s=%s does not match its pods' labels", k, v)
		}
	}
	for _, o := range byKind["*v1.DaemonSet"] {
		sel := o.(*appsv1.DaemonSet).Spec.Selector.MatchLabels
		if !slices.ContainsFunc(slices.Collect(maps.Keys(sel)), func(k string) bool { return ds.Spec.Template.Labels[k] != sel[k] }) {
			t.Errorf("the plugin DaemonSet's selector %v also matches the MPS daemon's pods", sel)
		}
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("MPS DaemonSet: %d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if !slices.Equal(c.Command, []string{"gantry-device-plugin", "mps-control-daemon"}) || !slices.Contains(c.Args, "--config=/etc/gantry/config.yaml") {
		t.Errorf("MPS daemon command %v args %v", c.Command, c.Args)
	}
	for _, p := range imageProblems(readImage(t), corev1.PodSpec{InitContainers: pod.Containers}, false) {
		t.Error(p)
	}
	if !pod.HostPID || c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("MPS daemon: want hostPID and privileged")
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tl corev1.Toleration) bool { return tl.Key == "nvidia.com/gpu" }) {
		t.Error("MPS daemon does not tolerate the nvidia.com/gpu taint")
	}
	host := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			host[v.Name] = v.HostPath.Path
		} else if v.ConfigMap != nil {
			host[v.Name] = "configmap:" + v.ConfigMap.Name
		}
	}
	mounts := map[string]string{}
	var root string
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = host[m.Name]
		if m.MountPath == host[m.Name] {
			root = m.MountPath
			// The daemons' shm (tmpfs mounts under the root) must reach
			// the host, which mounts them into the clients.
			if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
				t.Errorf("MPS daemon mounts the MPS root %s with propagation %v, want Bidirectional", root, m.MountPropagation)
			}
		}
	}
	if _, ok := mounts["/dev/shm"]; root == "" || ok {
		t.Errorf("MPS daemon mounts %v: want the MPS root at its host path, and no shared /dev/shm (each daemon gets its own)", mounts)
	}
	cfg := mounts["/etc/gantry"]
	if cms := byKind["*v1.ConfigMap"]; len(cms) == 1 {
		if want := "configmap:" + cms[0].(*corev1.ConfigMap).Name; cfg != want {
			t.Errorf("MPS daemon config from %q, want %q (the plugin's)", cfg, want)
		}
		var conf struct {
			Flags struct {
				MpsRoot string `json:"mpsRoot"`
			} `json:"flags"`
		}
		_ = sigsyaml.Unmarshal([]byte(cms[0].(*corev1.ConfigMap).Data["config.yaml"]), &conf)
		if r := conf.Flags.MpsRoot; r != "" && r != root {
			t.Errorf("flags.mpsRoot %s, but the MPS daemon mounts %s", r, root)
		}
	} else if cfg == "" {
		t.Error("MPS daemon has no config")
	}
}

// TestStaticMPSManifest: the MPS control daemon for the static install,
// with the static plugin manifest's ConfigMap.
func TestStaticMPSManifest(t *testing.T) {
	var objs []runtime.Object
	for _, f := range []string{"static/gantry-device-plugin.yaml", "static/mps/gantry-mps-control-daemon.yaml"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		o, err := decodeAll(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		objs = append(objs, o...)
	}
	if byKind := check(t, objs); len(byKind[mpsKind]) != 1 {
		t.Errorf("%d MPS DaemonSets", len(byKind[mpsKind]))
	}
}

// TestStrictDecoderRejects makes sure the decoder is strict, so that the
// other tests mean something.
func TestStrictDecoderRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":   "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndataa: {a: b}\n",
		"duplicate field": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {a: c}\n",
		"wrong type":      "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec: {selector: [1]}\n",
	} {
		if _, err := decodeAll([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// TestHelmTemplate renders the chart with helm when it is installed.
func TestHelmTemplate(t *testing.T) {
	helm, err := exec.LookPath("helm")
	if err != nil {
		t.Skip("helm is not on PATH (Debian 12 has no helm package; `go install helm.sh/helm/v3/cmd/helm@v3.18.4` puts one in $GOPATH/bin); the static manifests are still checked")
	}
	render := func(t *testing.T, sets ...string) ([]byte, error) {
		args := []string{"template", "gantry", "helm/gantry", "--namespace", "kube-system"}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		var stderr bytes.Buffer
		cmd := exec.Command(helm, args...)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return out, nil
	}
	for name, sets := range map[string][]string{
		"defaults":        nil,
		"service-monitor": {"metrics.serviceMonitor.enabled=true"},
		"feature-file":    {"labels.output=file"},
		"time-slicing":    {"config.sharing.strategy=time-slicing", "config.sharing.replicas=4", "config.migStrategy=mixed"},
		"dra":             {"dra.enabled=true"},
		"dra-sim":         {"dra.enabled=true", "dra.gpus=sim:h100x8", "dra.deviceClasses=false", "dra.devices=4\\,5"},
		"mps":             {"config.sharing.strategy=mps", "config.sharing.replicas=4"},
		"mps-own-root":    {"config.sharing.strategy=mps", "config.sharing.replicas=2", "mps.root=/var/lib/mps"},
		"per-node":        {"config.map.default=version: v1", "config.map.sliced=version: v1", "config.default=default"},
		"installer":       {"installer.enabled=true", "dra.enabled=true", "installer.restartCommand=kill -TERM $(cat /run/x.pid)"},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := render(t, sets...)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decodeAll(out)
			if err != nil {
				t.Fatal(err)
			}
			byKind := check(t, objs)
			if name == "service-monitor" && len(byKind["ServiceMonitor"]) != 1 {
				t.Errorf("no ServiceMonitor rendered")
			}
			if name == "defaults" && len(byKind["ServiceMonitor"]) != 0 {
				t.Errorf("ServiceMonitor rendered by default")
			}
			if dra := byKind["dra"]; strings.HasPrefix(name, "dra") || name == "installer" {
				others, _ := splitDRA(objs)
				others, _ = splitInstaller(others)
				checkDRA(t, dra, others, name == "dra" || name == "installer")
				if name == "dra-sim" {
					ds := draDaemonSet(t, dra)
					if ds.Spec.Template.Spec.RuntimeClassName != nil {
						t.Errorf("simulated GPUs need no nvidia runtime, got runtimeClassName %s", *ds.Spec.Template.Spec.RuntimeClassName)
					}
					if v := envValue(ds.Spec.Template.Spec.Containers[0], "GANTRY_GPUS"); v != "sim:h100x8" {
						t.Errorf("GANTRY_GPUS=%q, want sim:h100x8", v)
					}
					if v := envValue(ds.Spec.Template.Spec.Containers[0], "GANTRY_DRA_DEVICES"); v != "4,5" {
						t.Errorf("GANTRY_DRA_DEVICES=%q, want 4,5", v)
					}
				}
			} else if len(dra) != 0 {
				t.Errorf("DRA plugin objects rendered with dra.enabled=false: %d", len(dra))
			}
			if inst := byKind["installer"]; name == "installer" {
				ds := checkInstaller(t, inst)
				if !slices.ContainsFunc(inst, func(o runtime.Object) bool { _, ok := o.(*batchv1.Job); return ok }) {
					t.Error("no pre-delete hook Job with the installer")
				}
				if !slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--restart-command=kill -TERM $(cat /run/x.pid)") {
					t.Errorf("installer args %v lack the restart command", ds.Spec.Template.Spec.Containers[0].Args)
				}
				// The plugins start once the installer has set the node up.
				for _, o := range append(slices.Clone(byKind["*v1.DaemonSet"]), draDaemonSet(t, byKind["dra"])) {
					if d := o.(*appsv1.DaemonSet); d.Spec.Template.Spec.NodeSelector["gantry.dev/runtime-ready"] != "true" {
						t.Errorf("%s does not select on gantry.dev/runtime-ready: %v", d.Name, d.Spec.Template.Spec.NodeSelector)
					}
				}
			} else if len(inst) != 0 {
				t.Errorf("node installer objects rendered with installer.enabled=false: %d", len(inst))
			} else if sel := byKind["*v1.DaemonSet"][0].(*appsv1.DaemonSet).Spec.Template.Spec.NodeSelector; len(sel) != 0 {
				t.Errorf("the device plugin selects on %v without the installer", sel)
			}
			if mps := byKind[mpsKind]; (len(mps) == 1) != strings.HasPrefix(name, "mps") {
				t.Errorf("%d MPS control daemon DaemonSets", len(mps))
			}
			if name == "mps-own-root" {
				ds := byKind["*v1.DaemonSet"][0].(*appsv1.DaemonSet)
				if !slices.ContainsFunc(ds.Spec.Template.Spec.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool {
					return m.MountPath == "/var/lib/mps" && m.ReadOnly
				}) {
					t.Error("the plugin does not see an MPS root outside the driver root")
				}
			}
			if name == "per-node" {
				ds := byKind["*v1.DaemonSet"][0].(*appsv1.DaemonSet)
				c := ds.Spec.Template.Spec.Containers[0]
				if envValue(c, "CONFIG_FILE_SRCDIR") != "/available-configs" || envValue(c, "DEFAULT_CONFIG") != "default" ||
					slices.Contains(c.Args, "--config=/etc/gantry/config.yaml") {
					t.Errorf("per-node configs: env %v, args %v: want CONFIG_FILE_SRCDIR, DEFAULT_CONFIG and no --config", c.Env, c.Args)
				}
				found := false
				for _, o := range byKind["*v1.ConfigMap"] {
					cm := o.(*corev1.ConfigMap)
					found = found || (cm.Data["default"] != "" && cm.Data["sliced"] != "")
				}
				if !found {
					t.Error("no ConfigMap holds the named configs default and sliced")
				}
			}
			if name == "time-slicing" {
				cm := byKind["*v1.ConfigMap"][0].(*corev1.ConfigMap)
				if !strings.Contains(cm.Data["config.yaml"], "replicas: 4") || !strings.Contains(cm.Data["config.yaml"], "timeSlicing:") {
					t.Errorf("config.yaml:\n%s", cm.Data["config.yaml"])
				}
			}
		})
	}
	for set, want := range map[string]string{
		"config.migStrategy=split":                                               `config.migStrategy "split": use none, single or mixed`,
		"config.sharing.strategy=share":                                          `config.sharing.strategy "share"`,
		"config.sharing.strategy=time-slicing,config.sharing.replicas=1":         "config.sharing.replicas 1",
		"config.sharing.strategy=mps":                                            "config.sharing.replicas 1: mps needs at least 2",
		"config.sharing.strategy=mps,config.sharing.replicas=49":                 "at most 48 clients",
		"config.sharing.strategy=mps,config.sharing.replicas=2,mps.root=run/mps": `mps.root "run/mps"`,
		"labels.output=configmap":                                                `labels.output "configmap"`,
		"dra.enabled=true,dra.hookPath=gantry-cdi-hook":                          `dra.hookPath "gantry-cdi-hook"`,
		"dra.enabled=true,dra.gpus=h100x8":                                       `dra.gpus "h100x8"`,
		"config.map.a=version: v1,config.default=b":                              `config.default "b": name one of config.map's configs (a)`,
		"installer.enabled=true,installer.runtime=docker":                        `installer.runtime "docker"`,
	} {
		if _, err := render(t, set); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: error %v, want one containing %q", set, err, want)
		}
	}
	if out, err := exec.Command(helm, "lint", "helm/gantry").CombinedOutput(); err != nil {
		t.Errorf("helm lint: %v\n%s", err, out)
	}
}

// image is what the image the manifests run holds, read from the two
// definitions of it: the Dockerfile and scripts/build-image.sh (make image).
type image struct {
	dir        string          // where the programs are, in the image's PATH
	programs   map[string]bool // their names
	entrypoint string
}

var (
	forCmdRe     = regexp.MustCompile(`(?m)for cmd in ([a-z -]+); do`)
	outDirRe     = regexp.MustCompile(`-o "?\S*?(/usr/bin)/\$cmd`)
	dockerfileEP = regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]`)
	scriptEP     = regexp.MustCompile(`"Entrypoint":\["([^"]+)"\]`)
	pathRe       = regexp.MustCompile(`PATH=([^"\s]+)`)
)

// readImage reads what the image holds from its definitions, failing when
// the two disagree: the manifests must run in the image either way builds.
func readImage(t *testing.T) image {
	t.Helper()
	var imgs []image
	for _, def := range []struct {
		file string
		ep   *regexp.Regexp
	}{{"../Dockerfile", dockerfileEP}, {"../scripts/build-image.sh", scriptEP}} {
		b, err := os.ReadFile(def.file)
		if err != nil {
			t.Fatal(err)
		}
		img := image{programs: map[string]bool{}}
		m := forCmdRe.FindSubmatch(b)
		o := outDirRe.FindSubmatch(b)
		e := def.ep.FindSubmatch(b)
		if m == nil || o == nil || e == nil {
			t.Fatalf("%s: cannot find the programs it builds (for cmd in ...; do ... -o .../usr/bin/$cmd) and its entrypoint", def.file)
		}
		for _, p := range strings.Fields(string(m[1])) {
			img.programs[p] = true
		}
		img.dir, img.entrypoint = string(o[1]), string(e[1])
		imgs = append(imgs, img)
	}
	if fmt.Sprint(imgs[0]) != fmt.Sprint(imgs[1]) {
		t.Fatalf("the Dockerfile and scripts/build-image.sh build different images: %+v and %+v", imgs[0], imgs[1])
	}
	// The offline image sets its PATH itself (the Dockerfile's base does);
	// it must hold the programs' directory, or a command by name is not found.
	b, _ := os.ReadFile("../scripts/build-image.sh")
	if p := pathRe.FindSubmatch(b); p == nil || !slices.Contains(filepath.SplitList(string(p[1])), imgs[0].dir) {
		t.Fatalf("scripts/build-image.sh: the image's PATH does not hold %s", imgs[0].dir)
	}
	return imgs[0]
}

// imageProblems: every program a container of the pod runs (command,
// or the image's entrypoint when there is none; exec probes; lifecycle
// hooks) is one the image has, by name through its PATH or by its path, and
// (with entrypoint) the main container's command is the image's entrypoint,
// so that `docker run IMAGE` starts what the device plugin DaemonSet starts.
func imageProblems(img image, pod corev1.PodSpec, entrypoint bool) []string {
	var problems []string
	has := func(prog string) bool {
		if dir, name := filepath.Split(prog); dir != "" {
			return filepath.Clean(dir) == img.dir && img.programs[name]
		}
		return img.programs[prog]
	}
	check := func(where string, argv []string) {
		if len(argv) > 0 && !has(argv[0]) {
			problems = append(problems, fmt.Sprintf("%s runs %q, which the image does not have (it has %v in %s)", where, argv[0], img.programs, img.dir))
		}
	}
	containers := append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...)
	for _, c := range containers {
		if !strings.HasPrefix(c.Image, "ghcr.io/gantry-gpu/gantry:") {
			continue
		}
		if len(c.Command) == 0 && len(c.Args) > 0 {
			problems = append(problems, fmt.Sprintf("container %s: args %v without a command would go to the entrypoint %s", c.Name, c.Args, img.entrypoint))
		}
		check("container "+c.Name, c.Command)
		for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			if p != nil && p.Exec != nil {
				check("container "+c.Name+" "+name+" probe", p.Exec.Command)
			}
		}
		if l := c.Lifecycle; l != nil {
			for name, h := range map[string]*corev1.LifecycleHandler{"postStart": l.PostStart, "preStop": l.PreStop} {
				if h != nil && h.Exec != nil {
					check("container "+c.Name+" "+name, h.Exec.Command)
				}
			}
		}
	}
	if entrypoint && len(pod.Containers) > 0 && len(pod.Containers[0].Command) > 0 &&
		filepath.Base(pod.Containers[0].Command[0]) != filepath.Base(img.entrypoint) {
		problems = append(problems, fmt.Sprintf("the DaemonSet runs %s, the image's entrypoint is %s: `docker run IMAGE` would start something else", pod.Containers[0].Command[0], img.entrypoint))
	}
	return problems
}

// TestImageTagIsAppVersion: the static manifest pulls the tag that the chart
// defaults to (its appVersion), which make image also builds.
func TestImageTagIsAppVersion(t *testing.T) {
	chart, err := os.ReadFile("helm/gantry/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		AppVersion string `json:"appVersion"`
	}
	if err := sigsyaml.Unmarshal(chart, &meta); err != nil || meta.AppVersion == "" {
		t.Fatalf("Chart.yaml appVersion: %q %v", meta.AppVersion, err)
	}
	var objs []runtime.Object
	for _, f := range []string{"static/gantry-device-plugin.yaml", "static/gantry-dra-plugin.yaml"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		o, err := decodeAll(data)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o...)
	}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			for _, c := range ds.Spec.Template.Spec.Containers {
				if want := "ghcr.io/gantry-gpu/gantry:" + meta.AppVersion; c.Image != want {
					t.Errorf("static manifest container %s: image %s, want %s (the chart's appVersion, what make image tags)", c.Name, c.Image, want)
				}
			}
		}
	}
}

// TestImageProgramsCheckCanFail: the check catches a command the image
// lacks and a command that differs from the entrypoint.
func TestImageProgramsCheckCanFail(t *testing.T) {
	img := readImage(t)
	pod := func(c corev1.Container) corev1.PodSpec {
		c.Name, c.Image = "x", "ghcr.io/gantry-gpu/gantry:0.1.0"
		return corev1.PodSpec{Containers: []corev1.Container{c}}
	}
	if p := imageProblems(img, pod(corev1.Container{Command: []string{"gantry-device-plugin"}}), true); len(p) != 0 {
		t.Fatalf("the DaemonSet's own command fails the check: %v", p)
	}
	for name, c := range map[string]corev1.Container{
		"not in the image": {Command: []string{"nvidia-device-plugin"}},
		"another dir":      {Command: []string{"/usr/local/bin/gantry-device-plugin"}},
		"not entrypoint":   {Command: []string{"gantry"}},
		"args only":        {Args: []string{"--config=/etc/gantry/config.yaml"}},
		"probe":            {Command: []string{"gantry-device-plugin"}, LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "true"}}}}},
	} {
		if p := imageProblems(img, pod(c), true); len(p) == 0 {
			t.Errorf("%s: %+v passed the check", name, c)
		}
	}
}

func bufioReader(data []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(data)) }
