package draplugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gantry-gpu/gantry/internal/gpuholders"
)

// The checkpoint records the pods a claim is reserved for, each prepare
// (over the real gRPC API) adding its pod, and the runtime's reader
// (package gpuholders) finds them in <kubelet>/plugins/<driver>/: the
// claim's GPU is held by both pods.
func TestCheckpointPodsForRuntime(t *testing.T) {
	e := newEnvSetup(t, "h100x8", func(e *testEnv, base string) {
		e.pluginDir = filepath.Join(base, "plugins", DefaultDriverName)
		if err := os.MkdirAll(e.pluginDir, 0o755); err != nil {
			t.Fatal(err)
		}
	})
	c := e.claim("shared", "gpu-2")
	reserve := func(name, uid string) {
		t.Helper()
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: name, UID: types.UID(uid)})
		var err error
		if c, err = e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if r := e.prepare(c); r.Claims[string(c.UID)].Error != "" {
			t.Fatalf("prepare: %s", r.Claims[string(c.UID)].Error)
		}
	}
	reserve("a", "pod-uid-a")
	reserve("b", "pod-uid-b")
	hs, err := gpuholders.Holders(gpuholders.Options{KubeletDir: filepath.Dir(filepath.Dir(e.pluginDir))}, e.sys)
	if err != nil {
		t.Fatal(err)
	}
	var pods []string
	for _, h := range hs {
		if h.Unit.UUID != e.sys.Devices[2].UUID || h.Kind != "dra" || !strings.Contains(h.Via, "DRA claim default/shared (uid uid-shared) prepared by "+DefaultDriverName) {
			t.Errorf("holder %+v", h)
		}
		pods = append(pods, h.Pod+" "+h.PodUID)
	}
	slices.Sort(pods)
	if strings.Join(pods, ",") != "default/a pod-uid-a,default/b pod-uid-b" {
		t.Errorf("holders' pods %v, want default/a and default/b", pods)
	}
}
