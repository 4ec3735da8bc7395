// Package httplimit is net/http middleware that asks ringlimit whether each
// request may go ahead: 429 Too Many Requests with Retry-After when not,
// and the IETF RateLimit header fields on every answer:
//
//	RateLimit-Policy: "api";q=100;w=60
//	RateLimit: "api";r=42;t=17
//
// q is the limit, w the period in seconds, r the remaining hits and t the
// seconds until the counter is full again, each rounded up to whole
// seconds so that a client that waits that long is never early (why t
// rounds as it does: docs/design-ports.md). LegacyHeaders adds the
// X-RateLimit-* headers, a request beyond its guarantee carries
// X-RateLimit-Borrowed: true, TrustedProxies names the proxies to look
// behind, and ReserveTTL reserves an estimate that the handler settles
// (ReportCost). See docs/go.md, "httplimit".
package httplimit

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/ringlimit/ringlimit/client"
)

// BorrowedHeader is the response header that says a request was admitted
// by borrowing beyond the Limit's Count (see the package comment).
const BorrowedHeader = "X-RateLimit-Borrowed"

// Taker is what the middleware needs of ringlimit: *client.Client.
type Taker interface {
	Take(ctx context.Context, l client.Limit, key string, hits int64) (client.Decision, error)
}

// Limiter limits the requests to a handler. Set the fields, then call
// Handler; a Limiter must not be changed once it is serving, and is then
// safe for concurrent use.
type Limiter struct {
	// Client asks ringlimit; required.
	Client Taker
	// Limit is checked for every request, one hit each; its Name is also
	// the policy name in the headers. Required.
	Limit client.Limit
	// Key returns the limited entity of a request; nil means ClientIP.
	// Key may return "" to exempt a request from the limit.
	Key func(*http.Request) string
	// TrustedProxies are the networks of the proxies in front of the
	// handler whose ForwardedHeader is believed; nil trusts none and
	// keys on RemoteAddr alone.
	TrustedProxies []netip.Prefix
	// ForwardedHeader is the header the trusted proxies append the
	// client's address to: XForwardedFor (the zero value) or Forwarded.
	ForwardedHeader Header
	// LegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until full) to every answered request.
	LegacyHeaders bool
	// Timeout bounds each check; zero means 100ms.
	Timeout time.Duration
	// FailOpen says what to do when ringlimit cannot answer (unreachable,
	// too slow, or the check is invalid): serve the request (true) or
	// answer 503 (false, the zero value). ErrorHandler, when set, decides
	// instead.
	FailOpen bool
	// ErrorHandler, when set, answers the requests whose check failed, with
	// the error, as httputil.ReverseProxy's does: it may log err and write
	// an error response, or serve the request by calling the handler it
	// wraps (failing open). Nil means FailOpen's choice, with err dropped.
	ErrorHandler func(http.ResponseWriter, *http.Request, error)
	// Now is the clock the headers are computed against; nil means
	// time.Now. Tests set it to pin the rounding.
	Now func() time.Time

	// ReserveTTL, when positive, makes each request reserve its
	// Estimate rather than spend one hit, and settle with the cost its
	// handler reports (see ReportCost); 1 ms to a day, the time the
	// longest request may take: a reservation not settled by then is
	// charged in full. Client must then be a Reserver; Limit may be
	// neither Global nor leased, nor have a MinInterval or Ceiling.
	ReserveTTL time.Duration
	// Estimate returns the hits to reserve for a request, at least 1;
	// nil reserves 1. Only with ReserveTTL.
	Estimate func(*http.Request) int64
	// SettleError, when set, hears of a settle that failed after the
	// handler ran (the reservation is then charged in full at its
	// time-to-live); nil drops the error. Only with ReserveTTL.
	SettleError func(*http.Request, error)
}

// Handler returns next wrapped by the limiter.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := ""
		if l.Key == nil {
			key = l.ClientIP(r)
		} else if key = l.Key(r); key == "" {
			next.ServeHTTP(w, r) // exempt
			return
		}
		var (
			d        client.Decision
			err      error
			res      *client.Reservation
			estimate int64
		)
		if l.ReserveTTL > 0 {
			estimate = l.hits(r)
			if res, err = l.reserve(r.Context(), key, estimate); err == nil {
				d = res.Decision
			}
		} else {
			d, err = l.take(r.Context(), key)
		}
		if err != nil {
			switch {
			case l.ErrorHandler != nil:
				l.ErrorHandler(w, r, err)
			case l.FailOpen:
				next.ServeHTTP(w, r)
			default:
				http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			}
			return
		}
		l.setHeaders(w.Header(), d)
		if d.Allowed && d.Borrowed {
			w.Header().Set(BorrowedHeader, "true")
		}
		if !d.Allowed {
			retry := ceilSeconds(d.RetryAfter.Milliseconds())
			if d.RetryAfter == client.Never {
				retry = math.MaxInt32 // more than the limit holds
			}
			w.Header().Set("Retry-After", strconv.FormatInt(retry, 10))
			http.Error(w, "too many requests", http.StatusTooManyRequests)
			return
		}
		if res != nil {
			l.serveReserved(w, r, next, res, estimate)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// setHeaders writes the RateLimit fields of d, and the legacy ones if
// asked for.
func (l *Limiter) setHeaders(h http.Header, d client.Decision) {
	reset := ceilSeconds(d.ResetAt.UnixMilli() - ceilMillis(l.now()))
	q, w := l.Limit.Count, l.Limit.Period
	if q == 0 && w == 0 { // a spacing alone: one request per MinInterval
		q, w = 1, l.Limit.MinInterval
	}
	h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d", l.Limit.Name, q, ceilSeconds(w.Milliseconds())))
	h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", l.Limit.Name, d.Remaining, reset))
	if l.LegacyHeaders {
		h.Set("X-RateLimit-Limit", strconv.FormatInt(q, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	}
}

// take spends one hit of the limit for key, within Timeout.
func (l *Limiter) take(ctx context.Context, key string) (client.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout())
	defer cancel()
	return l.Client.Take(ctx, l.Limit, key, 1)
}

// timeout bounds each call to ringlimit: Timeout, or 100ms.
func (l *Limiter) timeout() time.Duration {
	if l.Timeout <= 0 {
		return 100 * time.Millisecond
	}
	return l.Timeout
}

func (l *Limiter) now() time.Time {
	if l.Now == nil {
		return time.Now()
	}
	return l.Now()
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
