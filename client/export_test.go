package client

import "testing"

// ServeForTest is serve, for the package's external tests and benchmarks.
var ServeForTest = serve

// ServeRESPForTest is ServeForTest with a RESP port, which the node's
// streams name: a plaintext client's checks go there as RL.CHECK.
func ServeRESPForTest(tb testing.TB) string { return serveRESP(tb).grpcAddr }
