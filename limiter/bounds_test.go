package limiter_test

import (
	"testing"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/service"
)

// TestBoundsMatchService keeps a counter record's bounds on name and key
// those of the public API, so that no counter a check can make is refused
// on hand-off, and none it could not make is accepted.
func TestBoundsMatchService(t *testing.T) {
	if limiter.MaxNameLen != service.MaxNameLen || limiter.MaxKeyLen != service.MaxKeyLen {
		t.Errorf("limiter bounds name %d, key %d; service's %d, %d",
			limiter.MaxNameLen, limiter.MaxKeyLen, service.MaxNameLen, service.MaxKeyLen)
	}
}
