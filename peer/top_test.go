package peer

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/top"
)

// topHandler is a fakeHandler that answers Top with a fixed report, which
// a test may make as large or as wrong as a forged answer.
type topHandler struct {
	fakeHandler
	report top.Report
	keys   int
}

func (h *topHandler) Top(keys int) top.Report {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.keys = keys
	return h.report
}

func (h *topHandler) ReplicationLag() time.Duration { return 1500 * time.Millisecond }

// TestPoolTop: a node's counts come back with their rates worked out by
// the asker, and its replication lag.
func TestPoolTop(t *testing.T) {
	h := &topHandler{report: top.Report{Seconds: 10, Checks: 50, Refusals: 20, Limits: []top.Limit{{Name: "api", Checks: 50,
		Hot: []top.Key{{Key: "user:1", Checks: 50, Refusals: 20}}, Refused: []top.Key{{Key: "user:1", Checks: 50, Refusals: 20}}}}}}
	p := NewPool(Config{})
	t.Cleanup(func() { p.Close() })
	r, lag, err := p.Top(t.Context(), serve(t, h), "b", 5)
	if err != nil {
		t.Fatal(err)
	}
	if h.keys != 5 || lag != 1500*time.Millisecond || r.ChecksPerSecond != 5 || r.RefusalsPerSecond != 2 {
		t.Errorf("asked for %d keys; lag %v, %v checks/s, %v refusals/s; want 5, 1.5s, 5, 2", h.keys, lag, r.ChecksPerSecond, r.RefusalsPerSecond)
	}
	if k := r.Limits[0].Hot[0]; k.Key != "user:1" || k.ChecksPerSecond != 5 || k.RefusalsPerSecond != 2 {
		t.Errorf("hot key %+v, want user:1 at 5 checks/s, 2 refusals/s", k)
	}
}

// TestPoolTopRefusesForgedAnswers: an answer beyond what a node's own
// reports can hold is refused, naming the field, and one larger than
// maxTopBytes is not even read.
func TestPoolTopRefusesForgedAnswers(t *testing.T) {
	manyKeys := make([]top.Key, top.MaxKeys+1)
	huge := make([]top.Limit, 10000)
	for i := range huge {
		huge[i] = top.Limit{Name: strings.Repeat("n", 200)}
	}
	for _, c := range []struct {
		name   string
		report top.Report
		want   string
	}{
		{"too many keys", top.Report{Seconds: 1, Limits: []top.Limit{{Name: "api", Hot: manyKeys}}}, "limits[0].hot: 65 keys"},
		{"no interval", top.Report{}, "seconds"},
		{"too large", top.Report{Seconds: 1, Limits: huge}, "ResourceExhausted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := NewPool(Config{})
			t.Cleanup(func() { p.Close() })
			_, _, err := p.Top(t.Context(), serve(t, &topHandler{report: c.report}), "b", 0)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Top = %v, want an error with %q", err, c.want)
			}
		})
	}
}

func TestServerTopBounds(t *testing.T) {
	c := dial(t, serve(t, &topHandler{report: top.Report{Seconds: 1}}))
	if _, err := c.Top(t.Context(), &peerpb.TopRequest{From: "b", Keys: top.MaxKeys + 1}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("too many keys asked: %v, want InvalidArgument", err)
	}
	if _, err := c.Top(t.Context(), &peerpb.TopRequest{From: ""}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no sender: %v, want InvalidArgument", err)
	}
	other := dial(t, serve(t, &fakeHandler{}))
	if _, err := other.Top(context.Background(), &peerpb.TopRequest{From: "b"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("a handler without a tracker: %v, want Unimplemented", err)
	}
}
