package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/service"
)

// reservingNode serves a one-node service over real gRPC on loopback, at
// a clock the test moves (t0 plus *at), with a store of at most max
// reservations.
func reservingNode(t *testing.T, max int) (pb.RateLimiterClient, *atomic.Int64, *prometheus.Registry) {
	t.Helper()
	var at atomic.Int64
	reg := prometheus.NewRegistry()
	svc := service.New(service.Config{
		Store:      limiter.New(limiter.Config{MaxReservations: max, Registerer: reg}),
		Now:        func() time.Time { return t0.Add(time.Duration(at.Load())) },
		Registerer: reg,
	})
	conn := serveGRPC(t, New(Config{Checker: svc, Settler: svc}))
	return pb.NewRateLimiterClient(conn), &at, reg
}

func int64p(n int64) *int64 { return &n }

// tokens is a reservation of hits of 20,000 tokens a minute for key.
func tokens(key string, hits int64) *pb.CheckItem {
	return &pb.CheckItem{Name: "tokens", Key: key, Limit: 20_000, DurationMs: 60_000, Algorithm: pb.Algorithm_SLIDING_WINDOW,
		Hits: int64p(hits), ReserveTtlMs: int64p(30_000)}
}

func reserve(t *testing.T, rl pb.RateLimiterClient, item *pb.CheckItem) *pb.CheckResult {
	t.Helper()
	resp, err := rl.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Responses[0]
}

func settle(rl pb.RateLimiterClient, id, key string, cost *int64) (*pb.SettleResponse, error) {
	return rl.Settle(context.Background(), &pb.SettleRequest{ReservationId: id, Name: "tokens", Key: key, Cost: cost})
}

// TestReservationsOverGRPC: 50 concurrent reservations of 1,000 against
// 20,000 a minute: exactly 20 are held, the other 30 refused; settling
// two for 500 lets the next one in at once; and under churn no more than
// 20 are ever held at once.
func TestReservationsOverGRPC(t *testing.T) {
	rl, _, _ := reservingNode(t, 0)
	results := make([]*pb.CheckResult, 50)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() { results[i] = reserve(t, rl, tokens("tenant", 1000)) })
	}
	wg.Wait()
	var held []string
	for _, r := range results {
		switch {
		case r.Error != "":
			t.Fatalf("reserve: %s", r.Error)
		case r.Status == pb.Status_UNDER_LIMIT && len(r.ReservationId) == 32:
			held = append(held, r.ReservationId)
		case r.Status == pb.Status_OVER_LIMIT && r.ReservationId == "":
		default:
			t.Fatalf("reserve answered %v", r)
		}
	}
	if len(held) != 20 {
		t.Fatalf("%d of 50 reservations of 1,000 held against 20,000, want 20", len(held))
	}
	if r := reserve(t, rl, tokens("tenant", 1000)); r.Status != pb.Status_OVER_LIMIT {
		t.Fatalf("a 21st reservation admitted: %v", r)
	}
	for i, id := range held[:2] {
		resp, err := settle(rl, id, "tenant", int64p(500))
		if err != nil || resp.GivenBack != 500 || resp.Forced != 0 || resp.Replayed || resp.State.Remaining != int64(500*(i+1)) {
			t.Fatalf("settle for 500: %v, %v", resp, err)
		}
	}
	r := reserve(t, rl, tokens("tenant", 1000))
	if r.Status != pb.Status_UNDER_LIMIT || r.ReservationId == "" {
		t.Fatalf("after two settled for 500, the next reservation was refused: %v", r)
	}
	held = append(held[2:], r.ReservationId)

	// Churn on another key: each settles for nothing and tries again.
	var mu sync.Mutex
	holding, most := 0, 0
	for range 50 {
		wg.Go(func() {
			for range 10 {
				r := reserve(t, rl, tokens("churn", 1000))
				if r.ReservationId == "" {
					continue
				}
				mu.Lock()
				holding++
				most = max(most, holding)
				holding-- // counted out before the settle, so never above what the node holds
				mu.Unlock()
				if _, err := settle(rl, r.ReservationId, "churn", int64p(0)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if most > 20 {
		t.Errorf("%d reservations held at once, want at most 20", most)
	}
}

// TestSettleRetriedChargesOnce: a retried settle answers as the first and
// charges nothing more; one with another cost is refused.
func TestSettleRetriedChargesOnce(t *testing.T) {
	rl, _, reg := reservingNode(t, 0)
	id := reserve(t, rl, tokens("k", 1000)).ReservationId
	first, err := settle(rl, id, "k", int64p(1500))
	if err != nil || first.Forced != 500 || first.State.Remaining != 18_500 {
		t.Fatalf("settle for 1,500: %v, %v", first, err)
	}
	for range 3 {
		again, err := settle(rl, id, "k", int64p(1500))
		if err != nil || !again.Replayed || again.Forced != 500 || again.State.Remaining != 18_500 {
			t.Fatalf("retried settle: %v, %v", again, err)
		}
	}
	if _, err := settle(rl, id, "k", int64p(10)); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("settle with another cost: %v, want FailedPrecondition", err)
	}
	if _, err := settle(rl, id, "k", nil); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("release after a settle: %v, want FailedPrecondition", err)
	}
	if r := reserve(t, rl, &pb.CheckItem{Name: "tokens", Key: "k", Limit: 20_000, DurationMs: 60_000, Algorithm: pb.Algorithm_SLIDING_WINDOW, Hits: int64p(0)}); r.Remaining != 18_500 {
		t.Errorf("remaining %d after retries, want 18,500: charged once", r.Remaining)
	}
	if got := testutil.ToFloat64(mustCounter(t, reg, "ringlimit_reservations_settled_total")); got != 1 {
		t.Errorf("%v settles counted, want 1", got)
	}
}

// mustCounter returns the sum of the metric name's series in reg.
func mustCounter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sum"})
	c.Add(sum)
	return c
}

// TestReservationBadInput: every bad input is a clear error naming the
// field or a stated bound, over real gRPC.
func TestReservationBadInput(t *testing.T) {
	rl, at, reg := reservingNode(t, 30)
	id := reserve(t, rl, tokens("k", 1000)).ReservationId
	other := reserve(t, rl, tokens("k2", 1000)).ReservationId

	for _, c := range []struct {
		name string
		item *pb.CheckItem
		want string
	}{
		{"ttl zero", func() *pb.CheckItem { it := tokens("k", 1); it.ReserveTtlMs = int64p(0); return it }(), "reserve_ttl_ms"},
		{"ttl years", func() *pb.CheckItem { it := tokens("k", 1); it.ReserveTtlMs = int64p(5 * 365 * 86_400_000); return it }(), "reserve_ttl_ms"},
		{"global", func() *pb.CheckItem { it := tokens("k", 1); it.Behavior = pb.Behavior_GLOBAL; return it }(), "behavior"},
		{"no hits", tokens("k", 0), "hits"},
	} {
		if r := reserve(t, rl, c.item); r.ErrorCode != pb.ErrorCode_INVALID_ARGUMENT || !strings.HasPrefix(r.Error, c.want) || r.ReservationId != "" {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming %s", c.name, r, c.want)
		}
	}
	resp, err := rl.Check(context.Background(), &pb.CheckRequest{All: true, Requests: []*pb.CheckItem{tokens("k", 1)}})
	if err != nil || !strings.HasPrefix(resp.Responses[0].Error, "reserve_ttl_ms") {
		t.Errorf(`reserve in "all": %v, %v; want an error naming reserve_ttl_ms`, resp, err)
	}

	for _, c := range []struct {
		name      string
		id, key   string
		cost      *int64
		code      codes.Code
		inMessage string
	}{
		{"another key's id", other, "k", int64p(1), codes.OK, "reservation_id"}, // see below
		{"another name", id, "k", nil, codes.InvalidArgument, "reservation_id"},
		{"forged id", strings.Repeat("ab", 16), "k", int64p(1), codes.NotFound, "reservation_id"},
		{"malformed id", "not-an-id", "k", int64p(1), codes.InvalidArgument, "reservation_id"},
		{"negative cost", id, "k", int64p(-5), codes.InvalidArgument, "cost"},
		{"huge cost", id, "k", int64p(1 << 62), codes.InvalidArgument, "cost"},
	} {
		req := &pb.SettleRequest{ReservationId: c.id, Name: "tokens", Key: c.key, Cost: c.cost}
		if c.name == "another name" {
			req.Name = "other"
		}
		_, err := rl.Settle(context.Background(), req)
		if c.code == codes.OK && (status.Code(err) == codes.InvalidArgument || status.Code(err) == codes.NotFound) {
			// Another key's id is refused as another key's (its key may
			// share a shard with this one) or as unknown for this key.
			c.code = status.Code(err)
		}
		if status.Code(err) != c.code || !strings.Contains(err.Error(), c.inMessage) {
			t.Errorf("%s: %v, want %v naming %s", c.name, err, c.code, c.inMessage)
		}
	}
	peek := func(key string) int64 {
		t.Helper()
		resp, err := rl.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{
			{Name: "tokens", Key: key, Limit: 20_000, DurationMs: 60_000, Algorithm: pb.Algorithm_SLIDING_WINDOW, Hits: int64p(0)}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Responses[0].Remaining
	}
	if a, b := peek("k"), peek("k2"); a != 19_000 || b != 19_000 {
		t.Errorf("remaining %d and %d after bad settles, want 19,000 each: nothing given back", a, b)
	}

	// The bound: 30 reservations, then UNAVAILABLE naming the flag.
	for i := 0; ; i++ {
		r := reserve(t, rl, tokens("many", 1))
		if r.Error != "" {
			if r.ErrorCode != pb.ErrorCode_UNAVAILABLE || !strings.Contains(r.Error, "--max-reservations") || i != 28 {
				t.Errorf("reservation %d: %v, want UNAVAILABLE naming --max-reservations at the 29th", i, r)
			}
			break
		}
		if i > 30 {
			t.Fatal("more than --max-reservations held")
		}
	}
	if got := testutil.ToFloat64(mustCounter(t, reg, "ringlimit_reservations")); got != 30 {
		t.Errorf("ringlimit_reservations %v, want 30", got)
	}

	// Past the time-to-live: NOT_FOUND, charged in full, counted.
	at.Store(int64(30 * time.Second))
	if _, err := settle(rl, id, "k", nil); status.Code(err) != codes.NotFound {
		t.Errorf("release after the time-to-live: %v, want NotFound", err)
	}
	if got := peek("k"); got != 19_000 {
		t.Errorf("remaining %d after expiry, want 19,000: charged in full", got)
	}
	if got := testutil.ToFloat64(mustCounter(t, reg, "ringlimit_reservations_expired_total")); got < 1 {
		t.Errorf("ringlimit_reservations_expired_total %v, want at least 1", got)
	}
}

// TestSettleJSON: POST /v1/check reserves, POST /v1/settle settles, and
// errors have their statuses and name the field.
func TestSettleJSON(t *testing.T) {
	svc := service.New(service.Config{Now: func() time.Time { return t0 }})
	srv := httptest.NewServer(New(Config{Checker: svc, Settler: svc}).Handler())
	t.Cleanup(srv.Close)
	code, body := post(t, srv, `{"requests":[{"name":"llm","key":"u1","limit":100,"duration_ms":60000,"hits":40,"reserve_ttl_ms":60000}]}`)
	var checked struct {
		Responses []struct {
			Status        string `json:"status"`
			Remaining     int64  `json:"remaining"`
			ReservationID string `json:"reservation_id"`
		} `json:"responses"`
	}
	if err := json.Unmarshal([]byte(body), &checked); code != http.StatusOK || err != nil || len(checked.Responses) != 1 ||
		checked.Responses[0].Remaining != 60 || len(checked.Responses[0].ReservationID) != 32 {
		t.Fatalf("reserve: %d %s", code, body)
	}
	id := checked.Responses[0].ReservationID
	postSettle := func(body string) (int, string) {
		resp, err := http.Post(srv.URL+"/v1/settle", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body = postSettle(`{"reservation_id":"` + id + `","name":"llm","key":"u1","cost":10}`)
	var settled struct {
		State struct {
			Status    string `json:"status"`
			Limit     int64  `json:"limit"`
			Remaining int64  `json:"remaining"`
		} `json:"state"`
		GivenBack int64 `json:"given_back"`
		Forced    int64 `json:"forced"`
		Replayed  bool  `json:"replayed"`
	}
	if err := json.Unmarshal([]byte(body), &settled); code != http.StatusOK || err != nil || settled.State.Status != "UNDER_LIMIT" ||
		settled.State.Limit != 100 || settled.State.Remaining != 90 || settled.GivenBack != 30 || settled.Forced != 0 || settled.Replayed {
		t.Errorf("settle: %d %s", code, body)
	}
	if code, body = postSettle(`{"reservation_id":"` + id + `","name":"llm","key":"u1","cost":10}`); code != http.StatusOK || !strings.Contains(body, `"replayed":true`) {
		t.Errorf("retried settle: %d %s", code, body)
	}
	for _, c := range []struct {
		body string
		code int
		in   string
	}{
		{`{"reservation_id":"` + id + `","name":"llm","key":"u1","cost":11}`, http.StatusConflict, "settled already"},
		{`{"reservation_id":"` + strings.Repeat("0", 32) + `","name":"llm","key":"u1"}`, http.StatusNotFound, "reservation_id"},
		{`{"reservation_id":"xyz","name":"llm","key":"u1"}`, http.StatusBadRequest, "reservation_id"},
		{`{"reservation_id":"` + id + `","name":"llm","key":"u1","cost":-1}`, http.StatusBadRequest, "cost"},
		{`{"reservation_id":"` + id + `","name":"llm","key":"u1","cost":"ten"}`, http.StatusBadRequest, "cost"},
		{`{"reservation_id":"` + id + `","name":"llm","key":"u1","costs":1}`, http.StatusBadRequest, "costs"},
	} {
		if code, body := postSettle(c.body); code != c.code || !strings.Contains(body, c.in) || !strings.HasPrefix(body, `{"error":`) {
			t.Errorf("%s: %d %s, want %d naming %s", c.body, code, body, c.code, c.in)
		}
	}
}
