package heal

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer"
)

// TestOnlyUnreachableMakesSuspect: a refusal, or a caller that left, says
// nothing about the owner's health; a timeout or an unreachable peer does.
func TestOnlyUnreachableMakesSuspect(t *testing.T) {
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"answered", context.Background(), nil, false},
		{"refused", context.Background(), status.Error(codes.InvalidArgument, "too many items"), false},
		{"unreachable", context.Background(), fmt.Errorf("forward: %w", peer.ErrUnreachable), true},
		{"deadline", context.Background(), fmt.Errorf("forward: %w", context.DeadlineExceeded), true},
		{"caller left", gone, fmt.Errorf("forward: %w: %w", peer.ErrUnreachable, context.Canceled), false},
		{"other", context.Background(), errors.New("owner answered the wrong number of results"), false},
	} {
		if got := Failed(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: Failed = %v, want %v", tc.name, got, tc.want)
		}
	}
}
