package draplugin

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// preparedPod is a pod a prepared claim is reserved for.
type preparedPod struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// addPods adds the pods claim c is reserved for (status.reservedFor) to
// pc's; it reports whether any was new. A claim shared by pods that start
// one after another is prepared once per pod; each prepare adds its pod.
func addPods(pc *preparedClaim, c *resourceapi.ResourceClaim) bool {
	changed := false
	for _, r := range c.Status.ReservedFor {
		if r.Resource != "pods" || r.APIGroup != "" || r.UID == "" {
			continue
		}
		p := preparedPod{Name: r.Name, UID: string(r.UID)}
		if !slices.Contains(pc.Pods, p) {
			pc.Pods = append(pc.Pods, p)
			changed = true
		}
	}
	return changed
}
