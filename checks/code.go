package checks

import (
	"context"
	"errors"
	"net/http"

	"google.golang.org/grpc/codes"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
)

// Code is the gRPC code of err, an error of a check or of a request of
// checks. It is the one switch on error kinds: the gRPC face answers with
// it, the HTTP face with its HTTPStatus, a per-item result with its
// ItemCode, and Envoy's rate limit service with it too.
func Code(err error) codes.Code {
	switch {
	case errors.Is(err, ErrInvalid), errors.Is(err, limiter.ErrOtherCounter), errors.Is(err, limiter.ErrNotReservable):
		return codes.InvalidArgument
	case errors.Is(err, limiter.ErrUnknownReservation):
		return codes.NotFound
	case errors.Is(err, limiter.ErrSettled):
		return codes.FailedPrecondition
	case errors.Is(err, limiter.ErrTooManyReservations):
		return codes.Unavailable
	case errors.Is(err, ErrUnavailable):
		return codes.Unavailable
	case errors.Is(err, limiter.ErrFull):
		return codes.ResourceExhausted
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Internal
}

// HTTPStatus is the HTTP status of err: Code's, in HTTP's terms.
func HTTPStatus(err error) int {
	switch Code(err) {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.FailedPrecondition:
		return http.StatusConflict
	case codes.Unavailable, codes.ResourceExhausted: // as an overloaded node answers (package admit)
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499 // client closed the request, as nginx and Envoy say
	}
	return http.StatusInternalServerError
}

// ItemCode is the error_code of a per-item result that failed with err:
// Code's, in the terms of ringlimit.v1's ErrorCode, which has no code for
// a deadline or a cancellation of the whole request (INTERNAL), nor for
// resources exhausted: an item the node had no room for is UNAVAILABLE,
// which tells a client the same (retry later, perhaps elsewhere), and its
// error says why.
func ItemCode(err error) pb.ErrorCode {
	switch Code(err) {
	case codes.InvalidArgument:
		return pb.ErrorCode_INVALID_ARGUMENT
	case codes.Unavailable, codes.ResourceExhausted:
		return pb.ErrorCode_UNAVAILABLE
	}
	return pb.ErrorCode_INTERNAL
}

// ItemStatus is the gRPC code of a per-item result's error_code, ItemCode
// read back, for a face that answers an item's error with a status of the
// whole request (Envoy's rate limit service). A result with an error has
// a code other than OK; were it OK, the error is still one: Internal.
func ItemStatus(c pb.ErrorCode) codes.Code {
	switch c {
	case pb.ErrorCode_INVALID_ARGUMENT:
		return codes.InvalidArgument
	case pb.ErrorCode_UNAVAILABLE:
		return codes.Unavailable
	}
	return codes.Internal
}
