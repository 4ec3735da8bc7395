// Package e2e holds end-to-end tests that run the real rlnode binary as
// separate processes on loopback and talk to them only through the public
// gRPC and HTTP interfaces.
//
// TestMain builds ./cmd/rlnode once (without -race, for speed). Each test
// starts its own small cluster on free loopback ports and stops it in
// t.Cleanup (SIGTERM, a bounded wait, then SIGKILL); every wait polls with
// a deadline. With -short the tests are skipped and nothing is built.
//
// The chaos suite (chaos_*_test.go, build tag chaos, docs/chaos.md) runs
// five-node clusters of the container image on private Docker networks
// under faults. It is tagged rather than skipped because it takes minutes
// and needs Docker; .ci/run and make chaos run it. Its sleeps are the
// scenarios' own durations, never waits for an effect.
package e2e
