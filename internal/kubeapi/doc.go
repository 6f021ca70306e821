// Package kubeapi is the little of the Kubernetes API that
// gantry-device-plugin uses, over plain HTTPS as the pod's service account:
// read one Node, strategic-merge-patch its labels and annotations, and post
// an Event. It replaces client-go's typed clientset, which links every API
// group (hundreds of packages, tens of megabytes of binary and of resident
// memory in a DaemonSet that runs on every GPU node) for these three calls.
//
// InCluster is configured the way client-go's rest.InClusterConfig is:
// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, the CA bundle and
// token in /var/run/secrets/kubernetes.io/serviceaccount. The token is read
// again for every request (the kubelet rotates bound tokens in place). An
// answer other than 2xx is an error that carries the API server's message
// (its Status object) and the HTTP code; IsNotFound tells a missing object.
//
// FromEnvironment takes the kubeconfig files that KUBECONFIG names instead,
// when it is set (FromKubeconfig: the current context, merged first-wins as
// kubectl does; a bearer token or tokenFile, a client certificate whose
// files are read again at each TLS handshake so that the kubelet's rotated
// certificate works, or basic authentication; exec and auth-provider
// plugins are refused), through the same small client.
//
// Package kubeapitest serves the same calls from memory for tests, applying
// patches with the API server's own strategic merge code.
package kubeapi
