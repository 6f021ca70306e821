package deployments

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// draDriver is the DRA driver name gantry-dra-plugin serves (NVIDIA's).
const draDriver = "gpu.nvidia.com"

// splitDRA takes the DRA plugin's objects (named *-dra, and the
// DeviceClasses) out of objs.
func splitDRA(objs []runtime.Object) (rest, dra []runtime.Object) {
	for _, o := range objs {
		_, isClass := o.(*resourcev1.DeviceClass)
		if a, err := meta.Accessor(o); isClass || (err == nil && strings.HasSuffix(a.GetName(), "-dra")) {
			dra = append(dra, o)
			continue
		}
		rest = append(rest, o)
	}
	return rest, dra
}

func draDaemonSet(t *testing.T, dra []runtime.Object) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range dra {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			return ds
		}
	}
	t.Fatal("no DRA plugin DaemonSet")
	return nil
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// checkDRA applies the rules for the DRA plugin's objects: a DaemonSet
// running gantry-dra-plugin from the image with its directories at the
// same paths as on the host, RBAC for what the kubeletplugin helper does,
// and (wantClasses) NVIDIA's four DeviceClasses selecting the driver's
// devices by type. others are the rest of the rendering (the
// ServiceAccount, the device plugin's DaemonSet).
func checkDRA(t *testing.T, dra, others []runtime.Object, wantClasses bool) {
	t.Helper()
	byKind := map[string][]runtime.Object{}
	for _, o := range dra {
		byKind[fmt.Sprintf("%T", o)] = append(byKind[fmt.Sprintf("%T", o)], o)
	}
	for _, want := range []string{"*v1.DaemonSet", "*v1.ClusterRole", "*v1.ClusterRoleBinding"} {
		if len(byKind[want]) != 1 {
			t.Fatalf("%d DRA objects of kind %s, want 1", len(byKind[want]), want)
		}
	}
	ds := draDaemonSet(t, dra)
	pod := ds.Spec.Template
	sel := labels.SelectorFromSet(ds.Spec.Selector.MatchLabels)
	if !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("DRA DaemonSet selector %v does not match its pods' labels %v", ds.Spec.Selector.MatchLabels, pod.Labels)
	}
	var sa string
	for _, o := range others {
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			// Two DaemonSets whose selectors match each other's pods fight over them.
			if labels.SelectorFromSet(o.Spec.Selector.MatchLabels).Matches(labels.Set(pod.Labels)) || sel.Matches(labels.Set(o.Spec.Template.Labels)) {
				t.Errorf("the DaemonSets %s and %s select each other's pods", o.Name, ds.Name)
			}
		case *corev1.ServiceAccount:
			sa = o.Name
		}
	}
	if sa == "" || pod.Spec.ServiceAccountName != sa {
		t.Errorf("DRA pods run as service account %q; the rendering has %q", pod.Spec.ServiceAccountName, sa)
	}
	if !slices.ContainsFunc(pod.Spec.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Key == "nvidia.com/gpu" && tl.Operator == corev1.TolerationOpExists
	}) {
		t.Errorf("no toleration of the nvidia.com/gpu taint: %v", pod.Spec.Tolerations)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	// MPS servers of MPS claims, started in the pod, find their clients
	// by host PID; sharing sets compute modes and enters namespaces.
	c := pod.Spec.Containers[0]
	if !pod.Spec.HostPID || c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Errorf("the DRA plugin's pod has hostPID %v, security context %+v; MPS claims need hostPID and privileged", pod.Spec.HostPID, c.SecurityContext)
	}
	if !strings.HasPrefix(c.Image, "ghcr.io/gantry-gpu/gantry:") || len(c.Command) != 1 || c.Command[0] != "gantry-dra-plugin" {
		t.Errorf("container image %q command %v", c.Image, c.Command)
	}
	for _, p := range imageProblems(readImage(t), pod.Spec, false) {
		t.Error(p)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Error("NODE_NAME is not set from spec.nodeName")
	}
	hostPaths := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	// mountedAs is the host path the container sees at p, "" if none.
	mountedAs := func(p string) (string, bool) {
		for _, m := range c.VolumeMounts {
			hp, ok := hostPaths[m.Name]
			if !ok {
				continue
			}
			if rest, found := strings.CutPrefix(p, m.MountPath); found && (rest == "" || rest[0] == '/') {
				return path.Join(hp, rest), m.ReadOnly
			}
		}
		return "", false
	}
	// The kubelet and the runtime use these paths on the host: the plugin
	// must see them at the same place, writable.
	for _, name := range []string{"PLUGIN_DIR", "REGISTRY_DIR", "CDI_ROOT"} {
		p := envValue(c, name)
		if hp, ro := mountedAs(p); p == "" || hp != p || ro {
			t.Errorf("%s=%q is host path %q (read-only %v) in the container, want the same path, writable", name, p, hp, ro)
		}
	}
	// Each MPS daemon's shm is a tmpfs the plugin mounts under PLUGIN_DIR,
	// which the runtime mounts into the claim's containers from the host.
	if p := envValue(c, "PLUGIN_DIR"); !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		rest, found := strings.CutPrefix(p, m.MountPath)
		return found && (rest == "" || rest[0] == '/') && m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional
	}) {
		t.Errorf("PLUGIN_DIR=%s is not under a Bidirectional volume mount: the MPS daemons' shm would not reach the host", p)
	}
	if p := envValue(c, "PLUGIN_DIR"); path.Base(p) != draDriver {
		t.Errorf("PLUGIN_DIR=%s, want a directory named after the driver %s", p, draDriver)
	}
	if hr := envValue(c, "HOST_ROOT"); hr == "" {
		t.Error("HOST_ROOT is not set")
	} else if hp, ro := mountedAs(hr); hp != "/" || !ro {
		t.Errorf("HOST_ROOT=%s shows host path %q (read-only %v), want / read-only", hr, hp, ro)
	}
	if hook := envValue(c, "GANTRY_CDI_HOOK_PATH"); !path.IsAbs(hook) {
		t.Errorf("GANTRY_CDI_HOOK_PATH=%q, want an absolute host path", hook)
	}

	cr := byKind["*v1.ClusterRole"][0].(*rbacv1.ClusterRole)
	can := func(group, resource string, verbs ...string) bool {
		for _, v := range verbs {
			if !slices.ContainsFunc(cr.Rules, func(r rbacv1.PolicyRule) bool {
				return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, v)
			}) {
				return false
			}
		}
		return true
	}
	if !can("resource.k8s.io", "resourceclaims", "get") ||
		!can("resource.k8s.io", "resourceslices", "list", "watch", "create", "update", "delete") ||
		!can("", "nodes", "get") {
		t.Errorf("DRA ClusterRole lacks what the kubeletplugin helper does: %+v", cr.Rules)
	}
	crb := byKind["*v1.ClusterRoleBinding"][0].(*rbacv1.ClusterRoleBinding)
	if crb.RoleRef.Name != cr.Name || !slices.ContainsFunc(crb.Subjects, func(s rbacv1.Subject) bool {
		return s.Kind == "ServiceAccount" && s.Name == pod.Spec.ServiceAccountName
	}) {
		t.Errorf("DRA ClusterRoleBinding %+v does not bind %s to %s", crb, cr.Name, pod.Spec.ServiceAccountName)
	}

	classes := map[string]string{}
	for _, o := range byKind["*v1.DeviceClass"] {
		dc := o.(*resourcev1.DeviceClass)
		if len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil {
			t.Errorf("DeviceClass %s: selectors %+v", dc.Name, dc.Spec.Selectors)
			continue
		}
		classes[dc.Name] = dc.Spec.Selectors[0].CEL.Expression
	}
	if !wantClasses {
		if len(classes) != 0 {
			t.Errorf("DeviceClasses rendered though turned off: %v", classes)
		}
		return
	}
	for name, typ := range map[string]string{"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig", "imex.nvidia.com": "imex-channel", "vfio.gpu.nvidia.com": "vfio"} {
		want := fmt.Sprintf("device.driver == '%s' && device.attributes['%s'].type == '%s'", draDriver, draDriver, typ)
		if classes[name] != want {
			t.Errorf("DeviceClass %s selects %q, want %q", name, classes[name], want)
		}
	}
}
