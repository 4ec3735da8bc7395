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

func TestLimiter(t *testing.T) {
	// A real (single-node) service stands in for a client of a node.
	l := &httplimit.Limiter{Checker: service.New(service.Config{}), Name: "api", Limit: 2, Period: time.Minute}
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
