package kubeapi

// InClusterFrom is InCluster with the environment and the service account
// directory given, for tests.
var InClusterFrom = inCluster

// FromEnvironmentWith is FromEnvironment with the environment and the
// service account directory given, for tests.
var FromEnvironmentWith = fromEnvironment
