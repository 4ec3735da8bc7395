package httplimit_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/httplimit"
	"github.com/ringlimit/ringlimit/service"
)

// node stands in for a ringlimit node in the examples; a real program
// uses client.New("localhost:8081"). Its clock is fixed so the output is.
func node(now time.Time) *client.Client {
	return client.Wrap(service.New(service.Config{Now: func() time.Time { return now }}))
}

func Example() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello") })
	l := &httplimit.Limiter{
		Client: node(now),
		Limit:  client.Limit{Name: "api", Count: 2, Period: time.Minute},
		Now:    func() time.Time { return now },
	}
	h := l.Handler(mux)
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit: "api";r=1;t=30 Retry-After: ""
	// 200 RateLimit: "api";r=0;t=60 Retry-After: ""
	// 429 RateLimit: "api";r=0;t=60 Retry-After: "30"
}

func ExampleLimiter_ClientIP() {
	l := &httplimit.Limiter{
		// The load balancers in front of the service.
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.0.0.3:41234"
	// The client wrote the first address; the proxies appended the others.
	r.Header.Set("X-Forwarded-For", "198.51.100.1, 203.0.113.9, 10.0.0.2")
	fmt.Println(l.ClientIP(r))

	// RFC 7239's Forwarded header, if that is what the proxies append to.
	l.ForwardedHeader = httplimit.Forwarded
	r.Header.Set("Forwarded", `for=198.51.100.1, for="[2001:db8::7]:4711";proto=https, for=10.0.0.2`)
	fmt.Println(l.ClientIP(r))

	// From anywhere else, the headers are not believed.
	r.RemoteAddr = "192.0.2.50:5555"
	fmt.Println(l.ClientIP(r))
	// Output:
	// 203.0.113.9
	// 2001:db8::7
	// 192.0.2.50
}

func ExampleLimiter_ErrorHandler() {
	unreachable, _ := client.New("127.0.0.1:1") // nothing listens there
	defer unreachable.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "served anyway") })
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "err" {
				return slog.Attr{} // the example's output must not vary
			}
			return a
		},
	}))
	l := &httplimit.Limiter{
		Client: unreachable,
		Limit:  client.Limit{Name: "api", Count: 100, Period: time.Minute},
		// Log why the check failed, then fail open.
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn("rate limit check failed; serving", "path", r.URL.Path, "err", err)
			mux.ServeHTTP(w, r)
		},
	}
	w := httptest.NewRecorder()
	l.Handler(mux).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/orders", nil))
	fmt.Println(w.Code, w.Body.String())
	// Output:
	// level=WARN msg="rate limit check failed; serving" path=/orders
	// 200 served anyway
}

func ExampleLimiter_legacyHeaders() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	l := &httplimit.Limiter{
		Client:        node(now),
		Limit:         client.Limit{Name: "api", Count: 10, Period: time.Minute},
		LegacyHeaders: true,
		Now:           func() time.Time { return now },
	}
	w := httptest.NewRecorder()
	l.Handler(http.NotFoundHandler()).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		fmt.Printf("%s: %s\n", name, w.Header().Get(name))
	}
	// Output:
	// X-RateLimit-Limit: 10
	// X-RateLimit-Remaining: 9
	// X-RateLimit-Reset: 6
}

// ExampleReportCost limits a language model's tokens a minute per user:
// each request reserves its estimate (the max_tokens it asks for) while
// it runs, so that concurrent requests cannot together spend more than
// the limit, and the handler reports the tokens really generated, which
// gives the rest back.
func ExampleReportCost() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c := node(now)
	limit := client.Limit{Name: "tokens", Count: 10_000, Period: time.Minute}
	l := &httplimit.Limiter{
		Client:     c,
		Limit:      limit,
		Key:        func(r *http.Request) string { return r.Header.Get("X-User") },
		ReserveTTL: 5 * time.Minute, // the longest a generation may take
		Estimate: func(r *http.Request) int64 {
			n, _ := strconv.ParseInt(r.URL.Query().Get("max_tokens"), 10, 64)
			return n
		},
		Now: func() time.Time { return now },
	}
	generate := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		generated := int64(1_200) // what the model really produced
		httplimit.ReportCost(r.Context(), generated)
		fmt.Fprintf(w, "%d tokens", generated)
	})
	r := httptest.NewRequest(http.MethodPost, "/v1/completions?max_tokens=4000", nil)
	r.Header.Set("X-User", "alice")
	w := httptest.NewRecorder()
	l.Handler(generate).ServeHTTP(w, r)
	fmt.Println(w.Code, w.Body.String(), "RateLimit:", w.Header().Get("RateLimit"))

	left, _ := c.Take(context.Background(), limit, "alice", 0) // 0 hits: a peek
	fmt.Println("remaining after the settle:", left.Remaining)
	// Output:
	// 200 1200 tokens RateLimit: "tokens";r=6000;t=24
	// remaining after the settle: 8800
}
