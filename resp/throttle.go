package resp

import (
	"fmt"
	"strconv"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
)

// Name is the limit name of every check made by CL.THROTTLE. With the
// key, algorithm GCRA, limit count_per_period, duration_ms period·1000
// and burst max_burst+1 it names the same counter as a native check of
// those fields (docs/resp.md), so a key can be checked either way.
const Name = "cl.throttle"

// throttle is one CL.THROTTLE command, its arguments checked.
type throttle struct {
	key                               string
	maxBurst, count, period, quantity int64
}

// The bounds of CL.THROTTLE's arguments are those of the native check
// they become (package checks), named as redis-cell names them.
const (
	maxBurstBound = checks.MaxLimit - 1 // burst = max_burst + 1
	maxPeriodSecs = int64(checks.MaxDuration / time.Second)
)

// parseThrottle checks the arguments of CL.THROTTLE key max_burst
// count_per_period period [quantity] (args[0] is the command's name).
func parseThrottle(args [][]byte) (throttle, error) {
	if len(args) != 5 && len(args) != 6 {
		return throttle{}, arityError(args[0])
	}
	t := throttle{quantity: 1}
	switch {
	case len(args[1]) == 0:
		return throttle{}, fmt.Errorf("ERR key must not be empty")
	case len(args[1]) > limiter.MaxKeyLen:
		return throttle{}, fmt.Errorf("ERR key is longer than %d bytes", limiter.MaxKeyLen)
	}
	fields := []struct {
		name     string
		dst      *int64
		min, max int64
	}{
		{"max_burst", &t.maxBurst, 0, maxBurstBound},
		{"count_per_period", &t.count, 1, checks.MaxLimit},
		{"period", &t.period, 1, maxPeriodSecs},
		{"quantity", &t.quantity, 0, checks.MaxLimit},
	}
	for i, f := range fields[:len(args)-2] {
		v, err := strconv.ParseInt(string(args[i+2]), 10, 64)
		if err != nil {
			return throttle{}, fmt.Errorf("ERR %s is not an integer: %.64q", f.name, args[i+2])
		}
		if v < f.min || v > f.max {
			return throttle{}, fmt.Errorf("ERR %s must be between %d and %d, got %d", f.name, f.min, f.max, v)
		}
		*f.dst = v
	}
	t.key = string(args[1])
	return t, nil
}

// item is t as a native check made at now, in milliseconds: the decision
// is made at that instant (created_at_ms), so the seconds of the answer
// are counted from it exactly.
func (t throttle) item(nowMs int64) *pb.CheckItem {
	return &pb.CheckItem{
		Name: Name, Key: t.key, Algorithm: pb.Algorithm_GCRA,
		Limit: t.count, DurationMs: t.period * 1000, Burst: t.maxBurst + 1,
		Hits: &t.quantity, CreatedAtMs: nowMs,
	}
}

// answer is redis-cell's reply to t from the result of its check made at
// nowMs: limited (0 or 1), the limit (max_burst+1), remaining, seconds to
// retry (-1 when admitted or never), seconds until the counter is full.
// Seconds round as redis-cell rounds them: up, unless less than a whole
// millisecond is left over.
func (t throttle) answer(res *pb.CheckResult, nowMs int64) [5]int64 {
	limited, retry := int64(0), int64(-1)
	if res.GetStatus() != pb.Status_UNDER_LIMIT {
		limited = 1
		if ms := res.GetRetryAfterMs(); ms >= 0 {
			retry = ceilSeconds(ms)
		}
	}
	return [5]int64{limited, t.maxBurst + 1, res.GetRemaining(), retry, ceilSeconds(max(res.GetResetTimeMs()-nowMs, 0))}
}

func ceilSeconds(ms int64) int64 { return (ms + 999) / 1000 }

func arityError(name []byte) error {
	return fmt.Errorf("ERR wrong number of arguments for '%.64s' command", name)
}
