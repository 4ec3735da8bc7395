package checks

import (
	"errors"
	"strings"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
)

func int64p(n int64) *int64 { return &n }

// TestReserveValidation: every item a reservation cannot be made of is
// refused with an error naming the field.
func TestReserveValidation(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	base := func() *pb.CheckItem {
		return &pb.CheckItem{Name: "llm", Key: "k", Limit: 20_000, DurationMs: 60_000, Hits: int64p(1000), ReserveTtlMs: int64p(30_000)}
	}
	if _, err := Request(base(), now, time.Minute); err != nil {
		t.Fatalf("a valid reservation refused: %v", err)
	}
	if got := ReserveTTL(base()); got != 30*time.Second {
		t.Errorf("ReserveTTL = %v, want 30s", got)
	}
	if got := ReserveTTL(&pb.CheckItem{}); got != 0 {
		t.Errorf("ReserveTTL of a check = %v, want 0", got)
	}
	for _, c := range []struct {
		name  string
		edit  func(*pb.CheckItem)
		field string
	}{
		{"ttl zero", func(it *pb.CheckItem) { it.ReserveTtlMs = int64p(0) }, "reserve_ttl_ms"},
		{"ttl negative", func(it *pb.CheckItem) { it.ReserveTtlMs = int64p(-1) }, "reserve_ttl_ms"},
		{"ttl years", func(it *pb.CheckItem) { it.ReserveTtlMs = int64p(3 * 365 * 24 * 3600 * 1000) }, "reserve_ttl_ms"},
		{"no hits", func(it *pb.CheckItem) { it.Hits = int64p(0) }, "hits"},
		{"global", func(it *pb.CheckItem) { it.Behavior = pb.Behavior_GLOBAL }, "behavior"},
		{"local", func(it *pb.CheckItem) { it.Behavior = pb.Behavior_LOCAL }, "behavior"},
		{"ceiling", func(it *pb.CheckItem) { it.Ceiling = 30_000; it.Parent = &pb.ParentLimit{Key: "all", Limit: 100_000} }, "ceiling"},
		{"min interval", func(it *pb.CheckItem) { it.MinIntervalMs = 100 }, "min_interval_ms"},
		{"spacing alone", func(it *pb.CheckItem) { it.Limit, it.DurationMs, it.MinIntervalMs = 0, 0, 100 }, "min_interval_ms"},
		{"charge refused", func(it *pb.CheckItem) { it.Algorithm = pb.Algorithm_FIXED_WINDOW; it.ChargeRefused = true }, "charge_refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			it := base()
			c.edit(it)
			_, err := Request(it, now, time.Minute)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != c.field {
				t.Errorf("Request: %v, want an error naming %s", err, c.field)
			}
		})
	}
}

func TestSettlementValidation(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	id := limiter.ReservationID{1, 2, 3}.String()
	st, err := Settlement(&pb.SettleRequest{ReservationId: id, Name: "llm", Key: "k", Cost: int64p(5)}, now)
	if err != nil || st.Cost != 5 || st.Release || st.Name != "llm" || st.Key != "k" || !st.Now.Equal(now) || st.ID.String() != id {
		t.Errorf("Settlement = %+v, %v", st, err)
	}
	if st, err := Settlement(&pb.SettleRequest{ReservationId: id, Name: "llm", Key: "k"}, now); err != nil || !st.Release {
		t.Errorf("Settlement without a cost = %+v, %v; want a release", st, err)
	}
	for _, c := range []struct {
		req   *pb.SettleRequest
		field string
	}{
		{&pb.SettleRequest{ReservationId: "", Name: "llm", Key: "k"}, "reservation_id"},
		{&pb.SettleRequest{ReservationId: strings.Repeat("g", 32), Name: "llm", Key: "k"}, "reservation_id"},
		{&pb.SettleRequest{ReservationId: id + "00", Name: "llm", Key: "k"}, "reservation_id"},
		{&pb.SettleRequest{ReservationId: id, Key: "k"}, "name"},
		{&pb.SettleRequest{ReservationId: id, Name: "llm"}, "key"},
		{&pb.SettleRequest{ReservationId: id, Name: "llm", Key: "k", Cost: int64p(-1)}, "cost"},
		{&pb.SettleRequest{ReservationId: id, Name: "llm", Key: "k", Cost: int64p(MaxLimit + 1)}, "cost"},
	} {
		_, err := Settlement(c.req, now)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !errors.Is(err, ErrInvalid) {
			t.Errorf("Settlement(%v): %v, want an error naming %s", c.req, err, c.field)
		}
	}
}
