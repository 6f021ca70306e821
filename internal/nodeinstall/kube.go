package nodeinstall

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/gantry-gpu/gantry/internal/kubeapi"
)

// Node is the Kubernetes side of an install: the Node's ready label and
// its Events. A nil *Node (no API server, no node name) does nothing.
type Node struct {
	Client *kubeapi.Client
	Name   string
	// Label is the label set to "true" once the node is set up.
	Label string
}

// SetReady puts the label on (ready) or takes it off.
func (n *Node) SetReady(ctx context.Context, ready bool) error {
	if n == nil {
		return nil
	}
	var v any
	if ready {
		v = "true"
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{n.Label: v}}})
	if err := n.Client.PatchNode(ctx, n.Name, patch); err != nil {
		return fmt.Errorf("labelling node %s %s: %w (the ClusterRole needs patch on nodes)", n.Name, n.Label, err)
	}
	return nil
}

// Event posts an Event about the Node (reason, type Normal or Warning).
func (n *Node) Event(ctx context.Context, typ, reason, msg string) error {
	if n == nil {
		return nil
	}
	host, _ := os.Hostname()
	now := kubeapi.Time{Time: time.Now()}
	ev := &kubeapi.Event{
		Metadata:       kubeapi.ObjectMeta{Name: fmt.Sprintf("%s.gantry-node.%x", n.Name, time.Now().UnixNano()), Namespace: "default"},
		InvolvedObject: kubeapi.ObjectReference{APIVersion: "v1", Kind: "Node", Name: n.Name},
		Reason:         reason, Message: msg, Type: typ, Count: 1,
		Source:         kubeapi.EventSource{Component: "gantry-node-installer", Host: host},
		FirstTimestamp: now, LastTimestamp: now,
	}
	return n.Client.CreateEvent(ctx, ev)
}

// OwnerGone reports whether the DaemonSet that owns pod ns/name is
// deleted or being deleted (uninstall on stop), rather than the pod
// replaced by a rolling update (keep the node set up: the next pod's
// install replaces the binaries in place). An answer of 401 or 403 counts
// as deleted: `kubectl delete -f` and helm uninstall remove the
// installer's ServiceAccount and ClusterRole with its DaemonSet, before
// or while its pods stop.
func OwnerGone(ctx context.Context, c *kubeapi.Client, ns, name string) (bool, error) {
	type meta struct {
		UID               string  `json:"uid"`
		DeletionTimestamp *string `json:"deletionTimestamp"`
		OwnerReferences   []struct {
			Kind, Name, UID string
			APIVersion      string `json:"apiVersion"`
		} `json:"ownerReferences"`
	}
	var pod struct {
		Metadata meta `json:"metadata"`
	}
	if err := c.Get(ctx, "/api/v1/namespaces/"+url.PathEscape(ns)+"/pods/"+url.PathEscape(name), &pod); err != nil {
		return revoked(err), err
	}
	for _, o := range pod.Metadata.OwnerReferences {
		if o.Kind != "DaemonSet" {
			continue
		}
		var ds struct {
			Metadata meta `json:"metadata"`
		}
		err := c.Get(ctx, "/apis/apps/v1/namespaces/"+url.PathEscape(ns)+"/daemonsets/"+url.PathEscape(o.Name), &ds)
		if kubeapi.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return revoked(err), err
		}
		return ds.Metadata.UID != o.UID || ds.Metadata.DeletionTimestamp != nil, nil
	}
	// A pod of no DaemonSet (run by hand): its deletion is the end.
	return true, nil
}

// revoked: the API server no longer lets the installer's account in.
func revoked(err error) bool {
	var e *kubeapi.Error
	return errors.As(err, &e) && (e.Code == http.StatusUnauthorized || e.Code == http.StatusForbidden)
}

// RemoveDaemonSet deletes the installer DaemonSet ns/name with foreground
// propagation and waits until it is gone: its pods each uninstall on
// SIGTERM (the DaemonSet being deleted), with the installer's account
// still there to take the label off, before the rest of a release goes.
// The chart's pre-delete hook runs it. A DaemonSet already gone is done.
func RemoveDaemonSet(ctx context.Context, c *kubeapi.Client, ns, name string, timeout time.Duration, log func(string)) error {
	path := "/apis/apps/v1/namespaces/" + url.PathEscape(ns) + "/daemonsets/" + url.PathEscape(name)
	if err := c.Delete(ctx, path, "Foreground"); err != nil {
		if kubeapi.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("deleting DaemonSet %s/%s: %w", ns, name, err)
	}
	log(fmt.Sprintf("deleting DaemonSet %s/%s (foreground): waiting for its pods to uninstall", ns, name))
	end := time.Now().Add(timeout)
	for {
		var ds struct{}
		err := c.Get(ctx, path, &ds)
		if kubeapi.IsNotFound(err) {
			log(fmt.Sprintf("DaemonSet %s/%s and its pods are gone", ns, name))
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("DaemonSet %s/%s still there after %s (its pods still uninstalling? kubectl -n %s logs -l app.kubernetes.io/name=... shows them): %v", ns, name, timeout, ns, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
