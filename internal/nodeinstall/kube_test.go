package nodeinstall_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/kubeapi"
	"github.com/gantry-gpu/gantry/internal/nodeinstall"
)

// TestRemoveDaemonSetWaitsForeground: the DaemonSet is deleted with
// foreground propagation (its pods go, uninstalling, before it does) and
// RemoveDaemonSet returns only once a GET says it is gone.
func TestRemoveDaemonSetWaitsForeground(t *testing.T) {
	const path = "/apis/apps/v1/namespaces/kube-system/daemonsets/gantry-node-installer"
	var deleted atomic.Bool
	var gets atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		switch r.Method {
		case http.MethodDelete:
			b, _ := io.ReadAll(r.Body)
			if !strings.Contains(string(b), `"propagationPolicy":"Foreground"`) {
				t.Errorf("DELETE body %s: want foreground propagation", b)
			}
			deleted.Store(true)
			w.Write([]byte(`{}`))
		case http.MethodGet:
			// Still there (pods uninstalling) for two answers, then gone.
			if !deleted.Load() || gets.Add(1) <= 2 {
				w.Write([]byte(`{"metadata":{"deletionTimestamp":"2026-11-28T00:00:00Z"}}`))
				return
			}
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"kind":"Status","reason":"NotFound"}`))
		}
	}))
	defer srv.Close()
	c := kubeapi.New(srv.URL, nil, func() (string, error) { return "t", nil })
	if err := nodeinstall.RemoveDaemonSet(context.Background(), c, "kube-system", "gantry-node-installer", time.Minute, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if !deleted.Load() || gets.Load() < 3 {
		t.Errorf("deleted %v, %d GETs: returned before the DaemonSet was gone", deleted.Load(), gets.Load())
	}
	// Already gone: done at once.
	if err := nodeinstall.RemoveDaemonSet(context.Background(), c, "kube-system", "other", time.Minute, func(string) {}); err != nil {
		t.Errorf("a DaemonSet already gone: %v", err)
	}
}
