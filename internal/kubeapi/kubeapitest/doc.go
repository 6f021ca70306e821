// Package kubeapitest is an in-memory Kubernetes API server for tests of
// code that uses package kubeapi: it serves Nodes and Events over real TLS
// with a bearer token, and applies strategic merge patches with the API
// server's own code (k8s.io/apimachinery's strategicpatch on core/v1 types),
// so a patch that works here works on a cluster. Only tests import it, so
// the device plugin binary does not link the Kubernetes API types.
package kubeapitest
