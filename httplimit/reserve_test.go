package httplimit_test

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/httplimit"
	"github.com/ringlimit/ringlimit/service"
)

// tokens is a limit of 100 hits a minute, reserved per request.
var tokens = client.Limit{Name: "tokens", Count: 100, Period: time.Minute}

// estimateHeader is the request header the tests' Estimate reads.
const estimateHeader = "X-Estimate"

// reserving returns a Limiter reserving each request's X-Estimate of
// tokens on svc, keyed by the X-User header.
func reserving(svc *service.Service) *httplimit.Limiter {
	return &httplimit.Limiter{
		Client:     client.Wrap(svc),
		Limit:      tokens,
		Key:        func(r *http.Request) string { return r.Header.Get("X-User") },
		ReserveTTL: time.Minute,
		Estimate: func(r *http.Request) int64 {
			n, _ := strconv.ParseInt(r.Header.Get(estimateHeader), 10, 64)
			return n
		},
		Timeout: 5 * time.Second,
		Now:     func() time.Time { return t0.Add(100 * time.Microsecond) },
	}
}

// remaining peeks at the hits of tokens left for user on svc.
func remaining(t *testing.T, svc *service.Service, user string) int64 {
	t.Helper()
	d, err := client.Wrap(svc).Take(t.Context(), tokens, user, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// send sends a POST (which the client never retries, as it may a GET
// whose connection closed) of url through c for user with an estimate, and
// returns the status code (0 if the request failed) and RateLimit header.
func send(ctx context.Context, c *http.Client, url, user string, estimate int64) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return 0, ""
	}
	req.Header.Set("X-User", user)
	req.Header.Set(estimateHeader, strconv.FormatInt(estimate, 10))
	resp, err := c.Do(req)
	if err != nil {
		return 0, ""
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("RateLimit")
}

// server serves h through an httptest server whose panics are not
// logged, and a channel that receives once per request after the
// middleware (and so the settle) is done with it.
func server(t *testing.T, h http.Handler) (*httptest.Server, chan struct{}) {
	done := make(chan struct{}, 64)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { done <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, done
}

// TestReserveSettles: a request reserves its estimate, answered with the
// headers of the counter after the reservation, and is settled with the
// cost its handler reports; one whose handler reports nothing, or
// panics, or whose client goes away, is settled with its estimate; a
// handler that reports 0 gives everything back.
func TestReserveSettles(t *testing.T) {
	svc := service.New(service.Config{Now: func() time.Time { return t0 }})
	started := make(chan struct{}, 1)
	h := reserving(svc).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("do") {
		case "report":
			n, _ := strconv.ParseInt(r.URL.Query().Get("cost"), 10, 64)
			if !httplimit.ReportCost(r.Context(), n) {
				t.Error("ReportCost found no reservation")
			}
		case "panic":
			httplimit.ReportCost(r.Context(), 7)
			panic("the handler fails after spending 7")
		case "hang":
			started <- struct{}{}
			<-r.Context().Done() // the client went away
			return
		}
		w.Write([]byte("ok"))
	}))
	srv, done := server(t, h)
	for _, tc := range []struct {
		name, query string
		estimate    int64
		code        int
		rate        string // the RateLimit header: after the reservation
		left        int64  // remaining after the settle
	}{
		{"reports less", "do=report&cost=10", 30, 200, `"tokens";r=70;t=18`, 90},
		{"reports more", "do=report&cost=50", 30, 200, `"tokens";r=70;t=18`, 50},
		{"reports 0: all given back", "do=report&cost=0", 30, 200, `"tokens";r=70;t=18`, 100},
		{"reports nothing: the estimate", "", 30, 200, `"tokens";r=70;t=18`, 70},
		{"panics after reporting", "do=panic", 30, 0, "", 93},
		{"estimate above the limit: refused", "", 101, 429, `"tokens";r=100;t=0`, 100},
		{"estimate 0: an invalid reservation", "", 0, 503, "", 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := tc.name
			code, rate := send(t.Context(), srv.Client(), srv.URL+"/?"+tc.query, user, tc.estimate)
			<-done
			if code != tc.code || rate != tc.rate {
				t.Errorf("%d, RateLimit %q; want %d, %q", code, rate, tc.code, tc.rate)
			}
			if got := remaining(t, svc, user); got != tc.left {
				t.Errorf("%d remaining after the settle, want %d", got, tc.left)
			}
		})
	}
	t.Run("client goes away: the estimate", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			<-started
			cancel()
		}()
		if code, _ := send(ctx, srv.Client(), srv.URL+"/?do=hang", "gone", 40); code != 0 {
			t.Errorf("a request the client cancelled answered %d", code)
		}
		<-done
		if got := remaining(t, svc, "gone"); got != 60 {
			t.Errorf("%d remaining, want 60: the estimate charged", got)
		}
	})
}

// TestReserveHolds: reservations count against the limit while their
// handlers run, so five concurrent requests estimated at 30 against 100
// admit three and refuse two; settling the three for 10 each leaves 70.
func TestReserveHolds(t *testing.T) {
	svc := service.New(service.Config{Now: func() time.Time { return t0 }})
	inside, release := make(chan struct{}, 5), make(chan struct{})
	h := reserving(svc).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside <- struct{}{}
		<-release
		httplimit.ReportCost(r.Context(), 10)
	}))
	srv, done := server(t, h)
	codes := make(chan int, 5)
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			code, _ := send(t.Context(), srv.Client(), srv.URL, "acme", 30)
			codes <- code
		})
	}
	admitted, refused := 0, 0
	for admitted+refused < 5 { // until every request is refused or held
		select {
		case <-inside:
			admitted++
		case code := <-codes:
			if code != http.StatusTooManyRequests {
				t.Fatalf("a request answered %d while the others were held", code)
			}
			refused++
		}
	}
	close(release)
	wg.Wait()
	for range 5 {
		<-done
	}
	close(codes)
	for code := range codes {
		if code != http.StatusOK {
			t.Errorf("a held request answered %d, want 200", code)
		}
	}
	if admitted != 3 || refused != 2 {
		t.Errorf("%d held and %d refused, want 3 and 2", admitted, refused)
	}
	if got := remaining(t, svc, "acme"); got != 70 {
		t.Errorf("%d remaining after three settles of 10, want 70", got)
	}
}

// failingSettles is a node whose settles fail, as one out of reach.
type failingSettles struct{ *service.Service }

func (failingSettles) Settle(context.Context, *pb.SettleRequest) (*pb.SettleResponse, error) {
	return nil, errors.New("node out of reach")
}

// TestReserveErrors: a Client that cannot reserve is the check's error
// (ErrorHandler's); a settle that fails is SettleError's, and the
// reservation stays held.
func TestReserveErrors(t *testing.T) {
	svc := service.New(service.Config{Now: func() time.Time { return t0 }})
	l := reserving(svc)
	l.Client = fixed{d: client.Decision{Allowed: true}}
	if served, got := checkError(l); served || !errors.Is(got, httplimit.ErrNotReserver) {
		t.Errorf("served %v, ErrorHandler heard %v; want ErrNotReserver", served, got)
	}

	l = reserving(svc)
	l.Client = client.Wrap(failingSettles{svc})
	var settleErr error
	l.SettleError = func(_ *http.Request, err error) { settleErr = err }
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-User", "u")
	r.Header.Set(estimateHeader, "25")
	w := httptest.NewRecorder()
	l.Handler(ok).ServeHTTP(w, r)
	if w.Code != http.StatusOK || settleErr == nil {
		t.Errorf("%d, SettleError heard %v; want 200 and the settle's error", w.Code, settleErr)
	}
	if left := remaining(t, svc, "u"); left != 75 {
		t.Errorf("%d remaining, want 75: the unsettled reservation still held", left)
	}
}

// TestReportCostOutsideAReservation: ReportCost says when there is
// nothing to settle.
func TestReportCostOutsideAReservation(t *testing.T) {
	if httplimit.ReportCost(t.Context(), 5) {
		t.Error("ReportCost found a reservation in a bare context")
	}
	var reported bool
	l := &httplimit.Limiter{Client: client.Wrap(service.New(service.Config{})), Limit: twoPerMinute}
	l.Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		reported = httplimit.ReportCost(r.Context(), 5)
	})).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	if reported {
		t.Error("ReportCost found a reservation under a Limiter without ReserveTTL")
	}
}

// TestReserveRefusesGlobalAndBorrowing: a GLOBAL limit is decided from
// grants without the key's owner, and a borrowing one charges a parent,
// so neither can reserve: the check's error, naming the field, goes to
// ErrorHandler and the handler does not run.
func TestReserveRefusesGlobalAndBorrowing(t *testing.T) {
	svc := service.New(service.Config{Now: func() time.Time { return t0 }})
	for _, tc := range []struct {
		limit client.Limit
		field string
	}{
		{client.Limit{Name: "g", Count: 100, Period: time.Minute, Behavior: client.Global}, "behavior"},
		{client.Limit{Name: "b", Count: 100, Period: time.Minute, Ceiling: 200, Parent: client.Parent{Key: "all", Count: 1000}}, "ceiling"},
	} {
		l := reserving(svc)
		l.Limit = tc.limit
		if served, got := checkError(l); served || !errors.Is(got, client.ErrInvalid) || !strings.Contains(got.Error(), tc.field) {
			t.Errorf("%s: served %v, error %v; want ErrInvalid naming %s", tc.limit.Name, served, got, tc.field)
		}
	}
}

// checkError serves one request of user u, estimated at 5, through l,
// and returns whether its handler ran and the error l's ErrorHandler
// heard.
func checkError(l *httplimit.Limiter) (served bool, got error) {
	l.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
		got = err
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-User", "u")
	r.Header.Set(estimateHeader, "5")
	l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true })).ServeHTTP(httptest.NewRecorder(), r)
	return served, got
}
