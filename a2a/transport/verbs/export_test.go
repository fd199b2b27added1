package verbs

// RDMAResources gives the external tests (comm_test.go) the leak count of
// this package's tests.
var RDMAResources = rdmaResources
