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
package e2e
