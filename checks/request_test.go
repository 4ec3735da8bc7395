package checks

import (
	"errors"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestCreatedAtNeverAheadOfNow: created_at_ms within the skew bound is
// honoured when it lies behind the node's clock and taken as now when it
// lies ahead, so that a fast client clock gains nothing; beyond the bound
// either way it is an error naming the field.
func TestCreatedAtNeverAheadOfNow(t *testing.T) {
	const skew = 10 * time.Minute
	for _, tc := range []struct {
		name    string
		created time.Time
		want    time.Time // zero: an error
	}{
		{"none", time.Time{}, t0},
		{"5 minutes behind", t0.Add(-5 * time.Minute), t0.Add(-5 * time.Minute)},
		{"1ms ahead", t0.Add(time.Millisecond), t0},
		{"9m59s ahead", t0.Add(9*time.Minute + 59*time.Second), t0},
		{"at the bound ahead", t0.Add(skew), t0},
		{"past the bound ahead", t0.Add(skew + time.Millisecond), time.Time{}},
		{"past the bound behind", t0.Add(-skew - time.Millisecond), time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			item := &pb.CheckItem{Name: "api", Key: "k", Limit: 10, DurationMs: 60_000}
			if !tc.created.IsZero() {
				item.CreatedAtMs = tc.created.UnixMilli()
			}
			r, err := Request(item, t0, skew)
			var fe *FieldError
			switch {
			case tc.want.IsZero():
				if !errors.As(err, &fe) || fe.Field != "created_at_ms" {
					t.Errorf("got %v, want an error naming created_at_ms", err)
				}
			case err != nil:
				t.Errorf("got %v", err)
			case !r.Now.Equal(tc.want):
				t.Errorf("evaluated at %v, want %v", r.Now, tc.want)
			}
		})
	}
}
