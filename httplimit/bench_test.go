package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/httplimit"
	"github.com/ringlimit/ringlimit/service"
)

// BenchmarkMiddleware is the middleware's cost per request against an
// in-process node, spending one hit, and reserving an estimate then
// settling with the cost the handler reports: what ReserveTTL adds is a
// settle and the context the handler reports through.
func BenchmarkMiddleware(b *testing.B) {
	limit := client.Limit{Name: "api", Count: 1_000_000_000, Period: time.Hour}
	report := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { httplimit.ReportCost(r.Context(), 3) })
	for _, bc := range []struct {
		name string
		l    *httplimit.Limiter
	}{
		{"spend", &httplimit.Limiter{Limit: limit}},
		// The shortest time-to-live, so that settled reservations, which
		// are remembered until it ends, stay far below the node's and the
		// key's bounds.
		{"reserve+settle", &httplimit.Limiter{Limit: limit, ReserveTTL: time.Millisecond,
			Estimate: func(*http.Request) int64 { return 10 }}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			bc.l.Client = client.Wrap(service.New(service.Config{}))
			bc.l.ErrorHandler = func(_ http.ResponseWriter, _ *http.Request, err error) { b.Fatal(err) }
			h := bc.l.Handler(report)
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = "192.0.2.7:5555"
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				h.ServeHTTP(w, r)
			}
		})
	}
}
