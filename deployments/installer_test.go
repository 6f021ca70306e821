package deployments

import (
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	sigsyaml "sigs.k8s.io/yaml"
)

// splitInstaller takes the node installer's objects (named *-node-installer).
func splitInstaller(objs []runtime.Object) (rest, inst []runtime.Object) {
	for _, o := range objs {
		if a, err := meta.Accessor(o); err == nil && strings.Contains(a.GetName(), "-node-installer") {
			inst = append(inst, o)
			continue
		}
		rest = append(rest, o)
	}
	return rest, inst
}

// checkInstaller: the node installer runs the image's gantry node install
// --wait, privileged, with the host's PID namespace and the host's / at
// /host, without the nvidia runtime (which it installs), with the downward
// API's node and pod names, time to uninstall on SIGTERM, and a ClusterRole
// that lets it label the Node, post Events and find its DaemonSet.
func checkInstaller(t *testing.T, objs []runtime.Object) *appsv1.DaemonSet {
	t.Helper()
	var ds *appsv1.DaemonSet
	var role *rbacv1.ClusterRole
	var sa *corev1.ServiceAccount
	var binding *rbacv1.ClusterRoleBinding
	var hook *batchv1.Job
	for _, o := range objs {
		a, _ := meta.Accessor(o)
		if strings.HasSuffix(a.GetName(), "-pre-delete") {
			if j, ok := o.(*batchv1.Job); ok {
				hook = j
			}
			continue
		}
		switch v := o.(type) {
		case *appsv1.DaemonSet:
			ds = v
		case *rbacv1.ClusterRole:
			role = v
		case *corev1.ServiceAccount:
			sa = v
		case *rbacv1.ClusterRoleBinding:
			binding = v
		}
	}
	if hook != nil {
		// The chart's pre-delete hook removes this DaemonSet, foreground.
		c := hook.Spec.Template.Spec.Containers[0]
		if ds != nil && (!slices.Equal(c.Command, []string{"gantry", "node", "remove-installer"}) || len(c.Args) == 0 || c.Args[len(c.Args)-1] != ds.Namespace+"/"+ds.Name) {
			t.Errorf("pre-delete hook runs %v %v, want gantry node remove-installer ... %s/%s", c.Command, c.Args, ds.Namespace, ds.Name)
		}
		for _, p := range imageProblems(readImage(t), corev1.PodSpec{Containers: hook.Spec.Template.Spec.Containers}, false) {
			t.Error(p)
		}
	}
	if ds == nil || role == nil || sa == nil || binding == nil {
		t.Fatalf("node installer objects: DaemonSet %v, ClusterRole %v, ServiceAccount %v, binding %v", ds != nil, role != nil, sa != nil, binding != nil)
	}
	pod := ds.Spec.Template.Spec
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("installer selector %s=%s does not match its pods' labels", k, v)
		}
	}
	if pod.ServiceAccountName != sa.Name || binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != sa.Name {
		t.Errorf("installer service account %s, binding %+v, role %s", pod.ServiceAccountName, binding, role.Name)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("installer: %d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if !slices.Equal(c.Command, []string{"gantry", "node", "install"}) || !slices.Contains(c.Args, "--wait") || !slices.Contains(c.Args, "--host-root=/host") {
		t.Errorf("installer command %v args %v", c.Command, c.Args)
	}
	for _, p := range imageProblems(readImage(t), corev1.PodSpec{Containers: pod.Containers}, false) {
		t.Error(p)
	}
	if !pod.HostPID || c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("installer: want hostPID (systemctl from PID 1's root) and privileged")
	}
	if pod.RuntimeClassName != nil {
		t.Errorf("installer runs under RuntimeClass %s, which it is what installs", *pod.RuntimeClassName)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g < 120 {
		t.Errorf("installer terminationGracePeriodSeconds %v: uninstall restarts the engine, give it at least 120 s", g)
	}
	host := ""
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.HostPath != nil && v.HostPath.Path == "/" && m.MountPath == "/host" && !m.ReadOnly {
				host = m.MountPath
			}
		}
	}
	if host == "" {
		t.Errorf("installer does not mount the host's / at /host read-write: %v", c.VolumeMounts)
	}
	for _, name := range []string{"NODE_NAME", "POD_NAME", "POD_NAMESPACE"} {
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil }) {
			t.Errorf("installer env %s not from the downward API", name)
		}
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tl corev1.Toleration) bool { return tl.Key == "nvidia.com/gpu" }) {
		t.Error("installer does not tolerate the nvidia.com/gpu taint")
	}
	can := func(group, res, verb string) bool {
		return slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, res) && slices.Contains(r.Verbs, verb)
		})
	}
	for _, need := range [][3]string{{"", "nodes", "patch"}, {"", "events", "create"}, {"", "pods", "get"}, {"apps", "daemonsets", "get"}} {
		if !can(need[0], need[1], need[2]) {
			t.Errorf("installer ClusterRole cannot %s %s", need[2], need[1])
		}
	}
	return ds
}

// TestStaticInstallerManifest: the node installer for the static install,
// pulling the tag the chart defaults to.
func TestStaticInstallerManifest(t *testing.T) {
	data, err := os.ReadFile("static/installer/gantry-node-installer.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeAll(data)
	if err != nil {
		t.Fatal(err)
	}
	rest, inst := splitInstaller(objs)
	if len(rest) != 0 {
		t.Errorf("%d objects not named *-node-installer", len(rest))
	}
	ds := checkInstaller(t, inst)
	chart, _ := os.ReadFile("helm/gantry/Chart.yaml")
	var m struct {
		AppVersion string `json:"appVersion"`
	}
	_ = sigsyaml.Unmarshal(chart, &m)
	if want := "ghcr.io/gantry-gpu/gantry:" + m.AppVersion; ds.Spec.Template.Spec.Containers[0].Image != want {
		t.Errorf("image %s, want %s", ds.Spec.Template.Spec.Containers[0].Image, want)
	}
}
