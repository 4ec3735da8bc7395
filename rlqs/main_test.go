package rlqs_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests if a goroutine outlives them: a stream's
// handler and its receiving goroutine end with the stream.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
