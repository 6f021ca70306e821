package request

import (
	"errors"
	"strings"
	"testing"
)

// containerd's annotations on a pod's container.
func criAnn(pod, ctr string) map[string]string {
	return map[string]string{
		AnnotationContainerdType:      "container",
		AnnotationContainerdPodUID:    pod,
		AnnotationContainerdContainer: ctr,
	}
}

func TestKubernetesContainer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ann      map[string]string
		pod, ctr string
		ok       bool
	}{
		{"containerd container", criAnn("uid1", "main"), "uid1", "main", true},
		{"containerd sandbox", map[string]string{AnnotationContainerdType: "sandbox", AnnotationContainerdPodUID: "uid1"}, "", "", false},
		{"containerd without uid", map[string]string{AnnotationContainerdType: "container", AnnotationContainerdContainer: "main"}, "", "", false},
		{"cri-o container", map[string]string{AnnotationCRIOType: "container",
			AnnotationCRIOLabels: `{"io.kubernetes.pod.uid":"uid2","io.kubernetes.container.name":"c","io.kubernetes.pod.name":"p"}`}, "uid2", "c", true},
		{"cri-o bad labels", map[string]string{AnnotationCRIOType: "container", AnnotationCRIOLabels: `{`}, "", "", false},
		{"docker", map[string]string{"com.docker.x": "y"}, "", "", false},
		{"none", nil, "", "", false},
	} {
		pod, ctr, ok := KubernetesContainer(tc.ann)
		if pod != tc.pod || ctr != tc.ctr || ok != tc.ok {
			t.Errorf("%s: got %q %q %v, want %q %q %v", tc.name, pod, ctr, ok, tc.pod, tc.ctr, tc.ok)
		}
	}
}

// A Kubernetes container gets from NVIDIA_VISIBLE_DEVICES only what the
// kubelet allocated to it; everyone else keeps NVIDIA's behaviour.
// kubernetesCase is one row of TestKubernetesEnvAllocated's table.
type kubernetesCase struct {
	name       string
	env        string
	ann        map[string]string
	privileged bool
	want       string // the device IDs requested, "" for none, "all" for All
	warn       string
}

// kubernetesTable is TestKubernetesEnvAllocated's table and the options it
// runs under (also read by the fast path's agreement test).
func kubernetesTable() ([]kubernetesCase, Options) {
	alloc := map[string][]string{
		"uid1/main":  {"GPU-a,GPU-b"},
		"uid1/two":   {"GPU-a", "GPU-c"}, // two resources (e.g. gpu and a MIG kind)
		"uid1/index": {"0,1"},
	}
	lookup := func(pod, ctr string) ([]string, error) {
		if pod == "broken" {
			return nil, errors.New("checkpoint unreadable")
		}
		return alloc[pod+"/"+ctr], nil
	}
	opts := DefaultOptions()
	opts.Allocated = lookup
	return []kubernetesCase{
		{"allocated, as the plugin set it", "GPU-a,GPU-b", criAnn("uid1", "main"), false, "GPU-a,GPU-b", ""},
		{"a subset of the allocation", "GPU-b", criAnn("uid1", "main"), false, "GPU-b", ""},
		{"image's all without an allocation", "all", criAnn("uid1", "nogpu"), false, "", "allocated no GPU"},
		{"image's list without an allocation", "GPU-a", criAnn("uid9", "main"), false, "", "allocated no GPU"},
		{"all with an allocation: the allocation", "all", criAnn("uid1", "main"), false, "GPU-a,GPU-b", "using its allocation"},
		{"more than allocated: the allocation", "GPU-a,GPU-c", criAnn("uid1", "main"), false, "GPU-a,GPU-b", "using its allocation"},
		{"two resources", "GPU-c,GPU-a", criAnn("uid1", "two"), false, "GPU-c,GPU-a", ""},
		{"index strategy", "1", criAnn("uid1", "index"), false, "1", ""},
		{"unreadable checkpoint denies", "all", criAnn("broken", "main"), false, "", "cannot be read"},
		{"privileged pod is trusted", "all", criAnn("uid1", "nogpu"), true, "all", ""},
		{"not Kubernetes: NVIDIA's behaviour", "all", nil, false, "all", ""},
		{"void is no request", "void", criAnn("uid1", "nogpu"), false, "", ""},
	}, opts
}

func (tc kubernetesCase) input() Input {
	return Input{Env: []string{EnvVisibleDevices + "=" + tc.env}, Annotations: tc.ann, Privileged: tc.privileged}
}

func TestKubernetesEnvAllocated(t *testing.T) {
	cases, opts := kubernetesTable()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := Parse(tc.input(), opts)
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			switch req.Devices.Mode {
			case All:
				got = "all"
			case List:
				got = strings.Join(req.Devices.IDs, ",")
			}
			if got != tc.want {
				t.Errorf("devices %q, want %q (warnings %q)", got, tc.want, req.Warnings)
			}
			w := strings.Join(req.Warnings, "; ")
			if (tc.warn == "") != (w == "") || !strings.Contains(w, tc.warn) {
				t.Errorf("warnings %q, want one containing %q", w, tc.warn)
			}
		})
	}
	// Without the lookup (runtime.kubernetes-env = "any"): the variable as is.
	req, err := Parse(Input{Env: []string{EnvVisibleDevices + "=all"}, Annotations: criAnn("uid1", "nogpu")}, DefaultOptions())
	if err != nil || req.Devices.Mode != All {
		t.Errorf("kubernetes-env any: %+v, %v; want all", req, err)
	}
}
