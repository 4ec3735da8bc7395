package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/httplimit"
	"github.com/ringlimit/ringlimit/service"
)

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })

// t0 is a fixed instant that is not on a millisecond, so the service rounds
// the instant the counter is full again up to the next millisecond.
var t0 = time.Unix(1_700_000_000, 123_456_789)

func TestLimiter(t *testing.T) {
	// A real (single-node) service stands in for a client of a node. It
	// decides at t0 and the headers are written within the same
	// millisecond: the boundary where t once read 61 for a 60 s counter.
	svc := service.New(service.Config{Now: func() time.Time { return t0 }})
	now := func() time.Time { return t0.Add(100 * time.Microsecond) }
	l := &httplimit.Limiter{Checker: svc, Name: "api", Limit: 2, Period: time.Minute, Now: now}
	h := l.Handler(ok)
	codes := []int{}
	var last *httptest.ResponseRecorder
	for range 3 {
		last = httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "192.0.2.7:5555"
		h.ServeHTTP(last, r)
		codes = append(codes, last.Code)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("status codes %v, want [200 200 429]", codes)
	}
	hd := last.Header()
	if got := hd.Get("RateLimit-Policy"); got != `"api";q=2;w=60` {
		t.Errorf("RateLimit-Policy = %q", got)
	}
	if got := hd.Get("RateLimit"); got != `"api";r=0;t=60` {
		t.Errorf("RateLimit = %q", got)
	}
	if got := hd.Get("Retry-After"); got != "30" {
		t.Errorf("Retry-After = %q, want 30 (one token of 2/min)", got)
	}
	// Another client IP has its own counter.
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "192.0.2.8:5555"
	h.ServeHTTP(w, r)
	if w.Code != 200 {
		t.Errorf("another client: %d, want 200", w.Code)
	}
}

// fixed answers every check with res.
type fixed struct{ res *pb.CheckResult }

func (f fixed) Check(context.Context, *pb.CheckRequest) (*pb.CheckResponse, error) {
	return &pb.CheckResponse{Responses: []*pb.CheckResult{f.res}}, nil
}

// TestResetRounding pins the rounding of t in the RateLimit header: both
// instants round up to the millisecond, then the difference rounds up to
// seconds, so t is never above the period and never short by a whole
// millisecond.
func TestResetRounding(t *testing.T) {
	base := time.UnixMilli(1_700_000_000_000)
	for _, tc := range []struct {
		name    string
		resetMs int64         // reset_time_ms, as the service rounds it
		now     time.Duration // the middleware's clock, after base
		want    string
	}{
		// Decided at base+0.5ms, full 60 s later: reset rounds up to +60001.
		{"same millisecond as the decision", 60_001, 600 * time.Microsecond, `"api";r=0;t=60`},
		{"on the millisecond", 60_000, 0, `"api";r=0;t=60`},
		{"just past the millisecond", 60_000, time.Nanosecond, `"api";r=0;t=60`},
		{"next millisecond", 60_001, time.Millisecond, `"api";r=0;t=60`},
		{"a millisecond over a second", 1_001, 0, `"api";r=0;t=2`},
		{"exactly a second", 1_000, 0, `"api";r=0;t=1`},
		{"full now", 5, 5 * time.Millisecond, `"api";r=0;t=0`},
		{"full in the past", 5, time.Second, `"api";r=0;t=0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := &pb.CheckResult{Status: pb.Status_UNDER_LIMIT, ResetTimeMs: base.UnixMilli() + tc.resetMs}
			l := &httplimit.Limiter{Checker: fixed{res}, Name: "api", Limit: 2, Period: time.Minute,
				Now: func() time.Time { return base.Add(tc.now) }}
			w := httptest.NewRecorder()
			l.Handler(ok).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			if got := w.Header().Get("RateLimit"); got != tc.want {
				t.Errorf("RateLimit = %s, want %s", got, tc.want)
			}
		})
	}
}

type failing struct{}

func (failing) Check(context.Context, *pb.CheckRequest) (*pb.CheckResponse, error) {
	return nil, errors.New("unreachable")
}

func TestLimiterWhenRingLimitIsDown(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		l := &httplimit.Limiter{Checker: failing{}, Name: "api", Limit: 1, Period: time.Second, FailOpen: failOpen}
		w := httptest.NewRecorder()
		l.Handler(ok).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		want := http.StatusServiceUnavailable
		if failOpen {
			want = http.StatusOK
		}
		if w.Code != want {
			t.Errorf("FailOpen=%v: %d, want %d", failOpen, w.Code, want)
		}
	}
}
