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
	switch {
	case len(args[1]) == 0:
		return throttle{}, fmt.Errorf("ERR key must not be empty")
	case len(args[1]) > limiter.MaxKeyLen:
		return throttle{}, fmt.Errorf("ERR key is longer than %d bytes", limiter.MaxKeyLen)
	}
	v := [4]int64{3: 1} // max_burst, count_per_period, period, quantity (1 when omitted)
	for i, f := range throttleFields[:len(args)-2] {
		n, err := strconv.ParseInt(string(args[i+2]), 10, 64)
		if err != nil {
			return throttle{}, fmt.Errorf("ERR %s is not an integer: %.64q", f.name, args[i+2])
		}
		if n < f.min || n > f.max {
			return throttle{}, fmt.Errorf("ERR %s must be between %d and %d, got %d", f.name, f.min, f.max, n)
		}
		v[i] = n
	}
	return throttle{key: string(args[1]), maxBurst: v[0], count: v[1], period: v[2], quantity: v[3]}, nil
}

// throttleFields are CL.THROTTLE's integer arguments, in order, and their
// bounds.
var throttleFields = [4]struct {
	name     string
	min, max int64
}{
	{"max_burst", 0, maxBurstBound},
	{"count_per_period", 1, checks.MaxLimit},
	{"period", 1, maxPeriodSecs},
	{"quantity", 0, checks.MaxLimit},
}

// item is t as a native check made at now, in milliseconds: the decision
// is made at that instant (created_at_ms), so the seconds of the answer
// are counted from it exactly.
func (t throttle) item(nowMs int64) *pb.CheckItem {
	a := &struct { // one allocation for the item and its hits
		item pb.CheckItem
		hits int64
	}{hits: t.quantity}
	a.item = pb.CheckItem{
		Name: Name, Key: t.key, Algorithm: pb.Algorithm_GCRA,
		Limit: t.count, DurationMs: t.period * 1000, Burst: t.maxBurst + 1,
		Hits: &a.hits, CreatedAtMs: nowMs,
	}
	return &a.item
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
