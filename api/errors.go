package api

import (
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/checks"
)

// toStatus is err, an error of a request of checks, as a gRPC status, with
// the code checks.Code gives it (the HTTP face answers with
// checks.HTTPStatus, the same code in HTTP's terms).
func toStatus(err error) error { return status.Error(checks.Code(err), err.Error()) }
