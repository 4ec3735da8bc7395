package checks

import (
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
)

// Result makes res, zero or a decision's result, the result of decision d
// for r, as every face answers it. Durations round up to whole
// milliseconds, so that a caller who waits retry_after_ms (or until
// reset_time_ms) is never early.
func Result(res *pb.CheckResult, r *limiter.Request, d algorithms.Decision) {
	res.Status = pb.Status_UNDER_LIMIT
	if !d.Allowed {
		res.Status = pb.Status_OVER_LIMIT
	}
	res.Limit = r.Limit.Count
	res.Remaining = d.Remaining
	res.ResetTimeMs = ceilMillis(time.Duration(r.Now.UnixNano()) + d.ResetAfter)
	res.RetryAfterMs = -1
	if d.RetryAfter != algorithms.Never {
		res.RetryAfterMs = ceilMillis(d.RetryAfter)
	}
	res.DelayMs = ceilMillis(d.Delay)
}

func ceilMillis(d time.Duration) int64 {
	ms := d / time.Millisecond
	if d%time.Millisecond > 0 {
		ms++
	}
	return int64(ms)
}
