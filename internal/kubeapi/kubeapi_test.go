package kubeapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gantry-gpu/gantry/internal/kubeapi"
	"github.com/gantry-gpu/gantry/internal/kubeapi/kubeapitest"
)

// inClusterClient configures a client the in-cluster way: the service
// host and port from the environment, the CA and token from files.
func inClusterClient(t *testing.T, s *kubeapitest.Server) *kubeapi.Client {
	t.Helper()
	dir := t.TempDir()
	s.WriteServiceAccount(dir)
	hostport := strings.TrimPrefix(s.URL(), "https://")
	host, port, _ := strings.Cut(hostport, ":")
	env := map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
	c, err := kubeapi.InClusterFrom(func(k string) string { return env[k] }, dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNodeGetAndPatch(t *testing.T) {
	s := kubeapitest.New(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: "n1", Labels: map[string]string{"a": "1", "b": "2"}, Annotations: map[string]string{"x": "y"},
	}})
	c := inClusterClient(t, s)
	ctx := context.Background()
	n, err := c.GetNode(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if n.Metadata.Name != "n1" || n.Metadata.Labels["b"] != "2" || n.Metadata.Annotations["x"] != "y" {
		t.Errorf("GetNode = %+v", n.Metadata)
	}
	if err := c.PatchNode(ctx, "n1", []byte(`{"metadata":{"labels":{"a":null,"c":"3"},"annotations":{"z":"w"}}}`)); err != nil {
		t.Fatal(err)
	}
	got := s.Node("n1")
	if _, ok := got.Labels["a"]; ok || got.Labels["b"] != "2" || got.Labels["c"] != "3" || got.Annotations["z"] != "w" || got.Annotations["x"] != "y" {
		t.Errorf("after patch: labels %v annotations %v", got.Labels, got.Annotations)
	}

	_, err = c.GetNode(ctx, "absent")
	if !kubeapi.IsNotFound(err) || !strings.Contains(err.Error(), `nodes "absent" not found`) {
		t.Errorf("GetNode(absent) = %v, want a 404 with the server's message", err)
	}
	if err := c.PatchNode(ctx, "absent", []byte(`{}`)); !kubeapi.IsNotFound(err) {
		t.Errorf("PatchNode(absent) = %v", err)
	}
}

func TestCreateEvent(t *testing.T) {
	s := kubeapitest.New(t)
	c := inClusterClient(t, s)
	now := time.Date(2026, 11, 23, 20, 0, 0, 123, time.UTC)
	ev := &kubeapi.Event{
		Metadata:       kubeapi.ObjectMeta{Name: "n1.1", Namespace: "default"},
		InvolvedObject: kubeapi.ObjectReference{Kind: "Node", Name: "n1", APIVersion: "v1"},
		Reason:         "GPUUnhealthy", Message: "GPU GPU-1: XID 79", Type: "Warning",
		Source:         kubeapi.EventSource{Component: "gantry-device-plugin", Host: "n1"},
		FirstTimestamp: kubeapi.Time{Time: now}, LastTimestamp: kubeapi.Time{Time: now}, Count: 1,
	}
	if err := c.CreateEvent(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	evs := s.Events()
	if len(evs) != 1 {
		t.Fatalf("%d events", len(evs))
	}
	e := evs[0]
	if e.Name != "n1.1" || e.InvolvedObject.Kind != "Node" || e.Reason != "GPUUnhealthy" || e.Type != "Warning" ||
		e.Source.Component != "gantry-device-plugin" || e.Count != 1 || !e.FirstTimestamp.Time.Equal(now.Truncate(time.Second)) {
		t.Errorf("event as stored: %+v", e)
	}
}

func TestErrors(t *testing.T) {
	s := kubeapitest.New(t)
	// A wrong token: the server's 401, with its message.
	bad := kubeapi.New(s.URL(), s.HTTPClient(), func() (string, error) { return "wrong", nil })
	if _, err := bad.GetNode(context.Background(), "n"); err == nil || !strings.Contains(err.Error(), "401 Unauthorized") {
		t.Errorf("wrong token: %v", err)
	}
	// A server whose certificate the cluster CA did not sign: refused.
	other := kubeapitest.New(t)
	c := inClusterClient(t, other)
	wrongCA := kubeapi.New(s.URL(), nil, func() (string, error) { return kubeapitest.Token, nil })
	if _, err := wrongCA.GetNode(context.Background(), "n"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("untrusted server certificate: %v", err)
	}
	if err := c.PatchNode(context.Background(), "n", []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("patch of a missing node: %v", err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "KUBERNETES_SERVICE_HOST"},
		{map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, "cluster CA"},
	} {
		_, err := kubeapi.InClusterFrom(func(k string) string { return tc.env[k] }, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("env %v: error %v, want one naming %q", tc.env, err, tc.want)
		}
	}
}
