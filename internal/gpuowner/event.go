package gpuowner

import (
	"context"
	"fmt"
	"time"

	"github.com/gantry-gpu/gantry/internal/kubeapi"
)

// EventReason is the reason of the Warning Event a refusal posts on the Node.
const EventReason = "GPUOwnerConflict"

// PostRefusal posts err (a refusal to start) as a Warning Event on node,
// from component, where `kubectl describe node` and
// `kubectl get events --field-selector reason=GPUOwnerConflict` show it.
// Without a client or a node name it does nothing.
func PostRefusal(ctx context.Context, c *kubeapi.Client, node, component string, err error) error {
	if c == nil || node == "" || err == nil {
		return nil
	}
	now := time.Now()
	msg := err.Error()
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	e := &kubeapi.Event{
		Metadata:       kubeapi.ObjectMeta{Name: fmt.Sprintf("%s.gantry-owner.%x", node, now.UnixNano()), Namespace: "default"},
		InvolvedObject: kubeapi.ObjectReference{Kind: "Node", Name: node, APIVersion: "v1"},
		Reason:         EventReason,
		Message:        msg,
		Type:           "Warning",
		Source:         kubeapi.EventSource{Component: component, Host: node},
		FirstTimestamp: kubeapi.Time{Time: now}, LastTimestamp: kubeapi.Time{Time: now}, Count: 1,
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.CreateEvent(ctx, e)
}
