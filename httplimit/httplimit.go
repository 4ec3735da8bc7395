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
		reset := ceilSeconds(res.ResetTimeMs - time.Now().UnixMilli())
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

func clientIP(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// ceilSeconds rounds ms up to whole seconds, never below 0.
func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return (ms + 999) / 1000
}
