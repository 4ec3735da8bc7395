package client_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/service"
)

// TestReserveOverGRPC reserves, settles, retries and releases through a
// client of a real node on loopback, and reads each error's sentinel.
func TestReserveOverGRPC(t *testing.T) {
	c := dialAPI(t, fixedService())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l := client.Limit{Name: "tokens", Count: 20_000, Period: time.Minute}

	r, err := c.Reserve(ctx, l, "tenant", 15_000, time.Minute)
	if err != nil || !r.Allowed || r.Remaining != 5000 || len(r.ID) != 32 {
		t.Fatalf("Reserve 15,000: %+v, %v", r, err)
	}
	if next, err := c.Reserve(ctx, l, "tenant", 10_000, time.Minute); err != nil || next.Allowed || next.ID != "" {
		t.Fatalf("a second reservation of 10,000 while 15,000 are held: %+v, %v", next, err)
	} else if err := next.Release(ctx); err != nil {
		t.Errorf("Release of a refused reservation: %v, want nothing done", err)
	}
	s, err := r.Settle(ctx, 4000)
	if err != nil || s.GivenBack != 11_000 || s.Remaining != 16_000 || s.Replayed {
		t.Fatalf("Settle 4,000: %+v, %v", s, err)
	}
	if s, err := r.Settle(ctx, 4000); err != nil || !s.Replayed || s.Remaining != 16_000 {
		t.Errorf("retried Settle: %+v, %v; want the same answer, replayed", s, err)
	}
	if _, err := r.Settle(ctx, 5000); !errors.Is(err, client.ErrSettled) {
		t.Errorf("Settle with another cost: %v, want ErrSettled", err)
	}
	if err := r.Release(ctx); err != nil {
		t.Errorf("Release after Settle: %v, want nothing done", err)
	}

	r, err = c.Reserve(ctx, l, "tenant", 10_000, time.Minute)
	if err != nil || !r.Allowed {
		t.Fatalf("Reserve after settling for less: %+v, %v", r, err)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if d, _ := c.Take(ctx, l, "tenant", 0); d.Remaining != 16_000 {
		t.Errorf("remaining %d after Release, want 16,000", d.Remaining)
	}

	if _, err := c.Reserve(ctx, l, "tenant", 1, 0); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("Reserve with no time-to-live: %v, want ErrInvalid", err)
	}
	if _, err := c.Reserve(ctx, client.Limit{Name: "g", Count: 5, Period: time.Second, Behavior: client.Global}, "k", 1, time.Minute); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("Reserve of a Global limit: %v, want ErrInvalid", err)
	}
}

// TestReserveUnknown: a reservation past its time-to-live is unknown.
func TestReserveUnknown(t *testing.T) {
	var after atomic.Int64 // how far past t0 the service's clock is
	c := dialAPI(t, service.New(service.Config{Now: func() time.Time { return t0.Add(time.Duration(after.Load())) }}))
	ctx := context.Background()
	r, err := c.Reserve(ctx, client.Limit{Name: "n", Count: 10, Period: time.Minute}, "k", 4, time.Second)
	if err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	after.Store(int64(time.Second))
	if _, err := r.Settle(ctx, 1); !errors.Is(err, client.ErrUnknownReservation) {
		t.Errorf("Settle past the time-to-live: %v, want ErrUnknownReservation", err)
	}
}
