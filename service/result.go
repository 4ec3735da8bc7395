package service

import (
	"context"
	"fmt"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
)

// errorResult is the result of an item not decided because of err. The
// item is reported refused, with retry_after_ms -1, so that a client that
// ignores errors fails closed rather than admitting what was never checked.
func errorResult(err error) *pb.CheckResult {
	res := &pb.CheckResult{}
	res.Status = pb.Status_OVER_LIMIT
	res.RetryAfterMs = -1
	res.Error = err.Error()
	res.ErrorCode = checks.ItemCode(err)
	return res
}

// goneResult is the result of a check whose client has gone before it was
// decided: nothing is charged on its behalf.
func goneResult(ctx context.Context) *pb.CheckResult {
	return errorResult(fmt.Errorf("%w: %w", checks.ErrUnavailable, ctx.Err()))
}
