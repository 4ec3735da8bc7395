package checks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
)

// TestCodes: every kind of error has one code, the same on every face:
// gRPC's, HTTP's and a per-item result's, and reading a result's code back
// gives gRPC's again where ErrorCode has one.
func TestCodes(t *testing.T) {
	cases := []struct {
		err  error
		code codes.Code
		http int
		item pb.ErrorCode
	}{
		{&FieldError{"limit", "must be between 1 and 1000000000, got 0"}, codes.InvalidArgument, http.StatusBadRequest, pb.ErrorCode_INVALID_ARGUMENT},
		{ErrTooManyItems, codes.InvalidArgument, http.StatusBadRequest, pb.ErrorCode_INVALID_ARGUMENT},
		{fmt.Errorf("%w: %w", ErrUnavailable, context.Canceled), codes.Unavailable, http.StatusServiceUnavailable, pb.ErrorCode_UNAVAILABLE},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), codes.DeadlineExceeded, http.StatusGatewayTimeout, pb.ErrorCode_INTERNAL},
		{context.Canceled, codes.Canceled, 499, pb.ErrorCode_INTERNAL},
		{limiter.ErrUnknownReservation, codes.NotFound, http.StatusNotFound, pb.ErrorCode_INTERNAL},
		{fmt.Errorf("%w: with cost 3", limiter.ErrSettled), codes.FailedPrecondition, http.StatusConflict, pb.ErrorCode_INTERNAL},
		{limiter.ErrOtherCounter, codes.InvalidArgument, http.StatusBadRequest, pb.ErrorCode_INVALID_ARGUMENT},
		{fmt.Errorf("algorithm: SPACING cannot give hits back: %w", limiter.ErrNotReservable), codes.InvalidArgument, http.StatusBadRequest, pb.ErrorCode_INVALID_ARGUMENT},
		{fmt.Errorf("%w: the node holds --max-reservations 10", limiter.ErrTooManyReservations), codes.Unavailable, http.StatusServiceUnavailable, pb.ErrorCode_UNAVAILABLE},
		{errors.New("a bug"), codes.Internal, http.StatusInternalServerError, pb.ErrorCode_INTERNAL},
		// ErrorCode has no code for it: an item reads back as UNAVAILABLE.
		{fmt.Errorf("decide: %w", limiter.ErrFull), codes.ResourceExhausted, http.StatusServiceUnavailable, pb.ErrorCode_UNAVAILABLE},
	}
	for _, c := range cases {
		if got := Code(c.err); got != c.code {
			t.Errorf("Code(%v) = %v, want %v", c.err, got, c.code)
		}
		if got := HTTPStatus(c.err); got != c.http {
			t.Errorf("HTTPStatus(%v) = %d, want %d", c.err, got, c.http)
		}
		if got := ItemCode(c.err); got != c.item {
			t.Errorf("ItemCode(%v) = %v, want %v", c.err, got, c.item)
		}
		if c.item != pb.ErrorCode_INTERNAL && c.code != codes.ResourceExhausted && ItemStatus(c.item) != c.code {
			t.Errorf("ItemStatus(%v) = %v, want %v", c.item, ItemStatus(c.item), c.code)
		}
	}
	for _, ec := range []pb.ErrorCode{pb.ErrorCode_OK, pb.ErrorCode_INTERNAL, 99} {
		if got := ItemStatus(ec); got != codes.Internal {
			t.Errorf("ItemStatus(%v) of an item with an error = %v, want Internal", ec, got)
		}
	}
}
