package request

import "encoding/json"

// Annotations the CRI runtimes put on the containers a kubelet creates,
// naming the pod (by UID) and the container (by its name in the pod spec).
const (
	// containerd's CRI plugin.
	AnnotationContainerdType      = "io.kubernetes.cri.container-type"
	AnnotationContainerdPodUID    = "io.kubernetes.cri.sandbox-uid"
	AnnotationContainerdContainer = "io.kubernetes.cri.container-name"
	// CRI-O: the container type, and the kubelet's container labels as JSON.
	AnnotationCRIOType   = "io.kubernetes.cri-o.ContainerType"
	AnnotationCRIOLabels = "io.kubernetes.cri-o.Labels"
	// The kubelet's labels (CRI-O copies them into AnnotationCRIOLabels).
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelContainerName = "io.kubernetes.container.name"
)

// KubernetesContainer reports the pod UID and container name of a
// container a kubelet created through containerd or CRI-O (not a pod
// sandbox). The annotations are set by the CRI runtime, which overrides any
// of the same name a pod spec carries.
func KubernetesContainer(ann map[string]string) (podUID, container string, ok bool) {
	switch {
	case ann[AnnotationContainerdType] == "container":
		podUID, container = ann[AnnotationContainerdPodUID], ann[AnnotationContainerdContainer]
	case ann[AnnotationCRIOType] == "container":
		var labels map[string]string
		if json.Unmarshal([]byte(ann[AnnotationCRIOLabels]), &labels) == nil {
			podUID, container = labels[LabelPodUID], labels[LabelContainerName]
		}
	}
	if podUID == "" || container == "" {
		return "", "", false
	}
	return podUID, container, true
}
