package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/httplimit"
	"github.com/ringlimit/ringlimit/service"
)

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })

// t0 is a fixed instant that is not on a millisecond, so the service rounds
// the instant the counter is full again up to the next millisecond.
var t0 = time.Unix(1_700_000_000, 123_456_789)

var twoPerMinute = client.Limit{Name: "api", Count: 2, Period: time.Minute}

// serve sends one GET from remoteAddr through h and returns the response.
func serve(h http.Handler, remoteAddr string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remoteAddr
	h.ServeHTTP(w, r)
	return w
}

func TestLimiter(t *testing.T) {
	// A real (single-node) service stands in for a node. It decides at
	// t0 and the headers are written within the same millisecond: the
	// boundary where t once read 61 for a 60 s counter.
	svc := service.New(service.Config{Now: func() time.Time { return t0 }})
	now := func() time.Time { return t0.Add(100 * time.Microsecond) }
	l := &httplimit.Limiter{Client: client.Wrap(svc), Limit: twoPerMinute, Now: now}
	h := l.Handler(ok)
	codes := []int{}
	var last *httptest.ResponseRecorder
	for range 3 {
		last = serve(h, "192.0.2.7:5555")
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
	if got := hd.Get("X-RateLimit-Reset"); got != "" {
		t.Errorf("X-RateLimit-Reset = %q without LegacyHeaders", got)
	}
	// Another client IP has its own counter.
	if w := serve(h, "192.0.2.8:5555"); w.Code != 200 {
		t.Errorf("another client: %d, want 200", w.Code)
	}
}

// TestLimiterMinInterval: a limit with a MinInterval answers 429 to a
// request that comes too soon, with Retry-After the wait left, and
// headers of the limit; a spacing alone is one request per MinInterval.
func TestLimiterMinInterval(t *testing.T) {
	svc := service.New(service.Config{Now: func() time.Time { return t0 }})
	now := func() time.Time { return t0.Add(100 * time.Microsecond) }
	for _, tc := range []struct {
		limit                client.Limit
		policy, rate, legacy string
	}{
		{client.Limit{Name: "api", Count: 100, Period: time.Minute, MinInterval: 5 * time.Second}, `"api";q=100;w=60`, `"api";r=99;t=5`, "100"},
		{client.Limit{Name: "login", MinInterval: 5 * time.Second}, `"login";q=1;w=5`, `"login";r=0;t=5`, "1"},
	} {
		l := &httplimit.Limiter{Client: client.Wrap(svc), Limit: tc.limit, Now: now, LegacyHeaders: true}
		h := l.Handler(ok)
		if w := serve(h, "192.0.2.9:5555"); w.Code != 200 {
			t.Fatalf("%s: first request %d, want 200", tc.limit.Name, w.Code)
		}
		w := serve(h, "192.0.2.9:5555")
		hd := w.Header()
		if w.Code != 429 || hd.Get("Retry-After") != "5" || hd.Get("RateLimit-Policy") != tc.policy || hd.Get("RateLimit") != tc.rate {
			t.Errorf("%s: second request %d, Retry-After %q, RateLimit-Policy %q, RateLimit %q; want 429, 5, %s, %s",
				tc.limit.Name, w.Code, hd.Get("Retry-After"), hd.Get("RateLimit-Policy"), hd.Get("RateLimit"), tc.policy, tc.rate)
		}
		if got := hd.Get("X-RateLimit-Limit"); got != tc.legacy {
			t.Errorf("%s: X-RateLimit-Limit %q, want %s", tc.limit.Name, got, tc.legacy)
		}
	}
}

// TestLimiterBorrowed: a request admitted by borrowing beyond the limit
// carries X-RateLimit-Borrowed: true; one within it, or refused, none.
func TestLimiterBorrowed(t *testing.T) {
	svc := service.New(service.Config{Now: func() time.Time { return t0 }})
	limit := client.Limit{Name: "api", Count: 1, Period: time.Minute, Ceiling: 2, Parent: client.Parent{Key: "all", Count: 10}}
	h := (&httplimit.Limiter{Client: client.Wrap(svc), Limit: limit}).Handler(ok)
	for i, want := range []struct {
		code     int
		borrowed string
	}{{200, ""}, {200, "true"}, {429, ""}} {
		w := serve(h, "192.0.2.9:5555")
		if w.Code != want.code || w.Header().Get(httplimit.BorrowedHeader) != want.borrowed {
			t.Errorf("request %d: %d, %s %q; want %d, %q", i, w.Code, httplimit.BorrowedHeader, w.Header().Get(httplimit.BorrowedHeader), want.code, want.borrowed)
		}
	}
}

// fixed answers every check with d, or err.
type fixed struct {
	d   client.Decision
	err error
}

func (f fixed) Take(context.Context, client.Limit, string, int64) (client.Decision, error) {
	return f.d, f.err
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
			d := client.Decision{Allowed: true, Limit: 2, ResetAt: base.Add(time.Duration(tc.resetMs) * time.Millisecond)}
			l := &httplimit.Limiter{Client: fixed{d: d}, Limit: twoPerMinute,
				Now: func() time.Time { return base.Add(tc.now) }}
			if got := serve(l.Handler(ok), "192.0.2.7:1").Header().Get("RateLimit"); got != tc.want {
				t.Errorf("RateLimit = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestLegacyHeaders(t *testing.T) {
	d := client.Decision{Allowed: false, Limit: 2, Remaining: 0, ResetAt: t0.Add(45 * time.Second), RetryAfter: 15 * time.Second}
	l := &httplimit.Limiter{Client: fixed{d: d}, Limit: twoPerMinute, LegacyHeaders: true, Now: func() time.Time { return t0 }}
	w := serve(l.Handler(ok), "192.0.2.7:1")
	for name, want := range map[string]string{
		"X-RateLimit-Limit":     "2",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "45", // seconds until full, not a Unix time
		"Retry-After":           "15",
	} {
		if got := w.Header().Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

func TestRetryAfterNever(t *testing.T) {
	d := client.Decision{Allowed: false, Limit: 2, RetryAfter: client.Never}
	l := &httplimit.Limiter{Client: fixed{d: d}, Limit: twoPerMinute}
	w := serve(l.Handler(ok), "192.0.2.7:1")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "2147483647" {
		t.Errorf("%d, Retry-After %q; want 429 and the largest delay", w.Code, w.Header().Get("Retry-After"))
	}
}

func TestLimiterWhenRingLimitIsDown(t *testing.T) {
	down := errors.New("unreachable")
	for _, failOpen := range []bool{false, true} {
		l := &httplimit.Limiter{Client: fixed{err: down}, Limit: twoPerMinute, FailOpen: failOpen}
		w := serve(l.Handler(ok), "192.0.2.7:1")
		want := http.StatusServiceUnavailable
		if failOpen {
			want = http.StatusOK
		}
		if w.Code != want {
			t.Errorf("FailOpen=%v: %d, want %d", failOpen, w.Code, want)
		}
	}
}

// TestErrorHandler: the hook gets the checker's error (an unreachable node
// or an invalid check) and answers the request; FailOpen is not consulted.
func TestErrorHandler(t *testing.T) {
	down := errors.New("unreachable")
	for _, tc := range []struct {
		name  string
		l     httplimit.Limiter
		isErr error
	}{
		{"unreachable", httplimit.Limiter{Client: fixed{err: down}, Limit: twoPerMinute, FailOpen: true}, down},
		{"invalid check", httplimit.Limiter{Client: client.Wrap(service.New(service.Config{})), Limit: client.Limit{Name: "api"}}, client.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got error
			tc.l.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
				got = err
				http.Error(w, "limiter says: "+err.Error(), http.StatusTeapot)
			}
			w := serve(tc.l.Handler(ok), "192.0.2.7:1")
			if w.Code != http.StatusTeapot || !errors.Is(got, tc.isErr) {
				t.Errorf("%d, hook got %v; want 418 from the hook, and %v", w.Code, got, tc.isErr)
			}
		})
	}
}

func TestKeyFunc(t *testing.T) {
	svc := service.New(service.Config{Now: func() time.Time { return t0 }})
	l := &httplimit.Limiter{Client: client.Wrap(svc), Limit: client.Limit{Name: "api", Count: 1, Period: time.Minute},
		Key: func(r *http.Request) string { return r.Header.Get("X-User") }} // "" exempts
	h := l.Handler(ok)
	send := func(user, remote string) int {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-User", user)
		r.RemoteAddr = remote
		h.ServeHTTP(w, r)
		return w.Code
	}
	got := []int{send("ann", "192.0.2.1:1"), send("ann", "192.0.2.2:1"), send("bob", "192.0.2.1:1"), send("", "192.0.2.1:1"), send("", "192.0.2.1:1")}
	if !slices.Equal(got, []int{200, 429, 200, 200, 200}) {
		t.Errorf("codes %v, want [200 429 200 200 200]: the key is the user, not the address; no user is exempt", got)
	}
}
