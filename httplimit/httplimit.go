// Package httplimit is net/http middleware that asks ringlimit whether each
// request may go ahead. Refused requests get 429 Too Many Requests with a
// Retry-After header; every answered request carries the IETF RateLimit
// header fields (draft-ietf-httpapi-ratelimit-headers):
//
//	RateLimit-Policy: "api";q=100;w=60
//	RateLimit: "api";r=42;t=17
//
// q is the limit, w the period in seconds, r the remaining hits and t the
// seconds until the counter is full again.
//
// Rounding. Every figure rounds up to whole seconds, so a client that waits
// that long is never early, with one care for t: ringlimit reports when
// the counter is full again as an instant, reset_time_ms, already rounded
// up to the millisecond. t is that instant minus now rounded up to the
// millisecond too, then rounded up to seconds. Rounding both instants the
// same way cancels the server's rounding, so t never exceeds the true time
// until full rounded up to the second, and never w; subtracting a truncated
// now instead would count the server's rounding twice and answer t=61 for
// a 60-second counter checked within one millisecond. The price is that t
// may be short by less than a millisecond of the true time, which no
// client can observe at the header's one-second resolution.
package httplimit

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// Checker is what the middleware needs of ringlimit: *client.Client.
type Checker interface {
	Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error)
}

// Limiter limits the requests to a handler. Set the fields, then call
// Handler; a Limiter is safe for concurrent use once it is serving.
type Limiter struct {
	// Checker asks ringlimit; required.
	Checker Checker
	// Name is the limit's name (and the policy name in the headers);
	// Limit requests are allowed per Period. Required.
	Name   string
	Limit  int64
	Period time.Duration
	// Algorithm and Behavior default to TOKEN_BUCKET and BATCHED.
	Algorithm pb.Algorithm
	Behavior  pb.Behavior
	// Key returns the limited entity of a request; nil means the client's
	// IP address (the host of RemoteAddr, so put the limiter behind any
	// proxy header handling you trust).
	Key func(*http.Request) string
	// Timeout bounds each check; zero means 100ms.
	Timeout time.Duration
	// FailOpen says what to do when ringlimit cannot answer: serve the
	// request (true) or answer 503 (false, the zero value).
	FailOpen bool
	// Now is the clock the headers are computed against; nil means
	// time.Now. Tests set it to pin the rounding.
	Now func() time.Time
}

// Handler returns next wrapped by the limiter.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, err := l.check(r)
		if err != nil {
			if l.FailOpen {
				next.ServeHTTP(w, r)
				return
			}
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		h := w.Header()
		h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d", l.Name, l.Limit, ceilSeconds(l.Period.Milliseconds())))
		reset := ceilSeconds(res.ResetTimeMs - ceilMillis(l.now()))
		h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", l.Name, res.Remaining, reset))
		if res.Status == pb.Status_OVER_LIMIT {
			retry := res.RetryAfterMs
			if retry < 0 {
				retry = math.MaxInt32 // never: more than the limit holds
			}
			h.Set("Retry-After", strconv.FormatInt(ceilSeconds(retry), 10))
			http.Error(w, "too many requests", http.StatusTooManyRequests)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (l *Limiter) check(r *http.Request) (*pb.CheckResult, error) {
	key := clientIP(r)
	if l.Key != nil {
		key = l.Key(r)
	}
	timeout := l.Timeout
	if timeout <= 0 {
		timeout = 100 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	resp, err := l.Checker.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{{
		Name: l.Name, Key: key, Limit: l.Limit, DurationMs: l.Period.Milliseconds(),
		Algorithm: l.Algorithm, Behavior: l.Behavior,
	}}})
	if err != nil {
		return nil, err
	}
	if len(resp.GetResponses()) != 1 {
		return nil, fmt.Errorf("check: %d results for 1 item", len(resp.GetResponses()))
	}
	res := resp.Responses[0]
	if res.Error != "" {
		return nil, fmt.Errorf("check: %s", res.Error)
	}
	return res, nil
}

func (l *Limiter) now() time.Time {
	if l.Now == nil {
		return time.Now()
	}
	return l.Now()
}

func clientIP(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// ceilMillis is t in Unix milliseconds, rounded up like reset_time_ms.
func ceilMillis(t time.Time) int64 {
	ms := t.UnixMilli()
	if t.Nanosecond()%int(time.Millisecond) != 0 {
		ms++
	}
	return ms
}

// ceilSeconds rounds ms up to whole seconds, never below 0.
func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return (ms + 999) / 1000
}
