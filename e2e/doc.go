// Package e2e holds end-to-end tests that run the real rlnode binary as
// separate processes on loopback and talk to them only through the public
// gRPC and HTTP interfaces.
//
// TestMain builds ./cmd/rlnode once (without -race, for speed) into a
// temporary directory. Each test starts its own small cluster on free
// loopback ports and stops it in t.Cleanup: SIGTERM, a bounded wait, then
// SIGKILL. Every wait polls with a deadline; nothing sleeps for a fixed
// time except the short intervals between polls. With -short the tests
// are skipped and nothing is built.
//
// The chaos suite (chaos_*_test.go, build tag chaos, see docs/chaos.md)
// runs the same kind of checks against five-node clusters of the
// container image on private Docker networks, with mutual TLS and
// encrypted gossip, while it kills, freezes, partitions, restarts, scales
// and stops them. It is tagged rather than skipped because it takes
// minutes and needs Docker: `go test ./...` stays fast everywhere, and
// .ci/run (or `make chaos`) runs it explicitly. Its sleeps are the
// scenarios' own durations (load before, during and after an event), not
// waits for an effect: every effect is polled for with a deadline.
package e2e
