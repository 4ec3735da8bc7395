package api

import (
	"context"
	"errors"
	"net/http"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/lease"
	"github.com/ringlimit/ringlimit/service"
)

// toStatus maps a service error to a gRPC status. It is the only place
// that knows gRPC codes.
func toStatus(err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, service.ErrInvalid), errors.Is(err, lease.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, service.ErrUnavailable):
		code = codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return status.Error(code, err.Error())
}

// httpStatus maps a service error to an HTTP status, as toStatus does for
// gRPC.
func httpStatus(err error) int {
	switch status.Code(toStatus(err)) {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499 // client closed the request, as nginx and Envoy say
	}
	return http.StatusInternalServerError
}
