package policy

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestUnknownDomains: a domain no policy file has is logged once,
// counted at every request, and listed; a flood of domains keeps at most
// MaxUnknownDomains listed and labelled, each cut to MaxUnknownDomainLen
// bytes, the rest counted as _other.
func TestUnknownDomains(t *testing.T) {
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	u := NewUnknownDomains(slog.New(slog.NewTextHandler(&logs, nil)), reg)
	for range 3 {
		u.Saw("edgee")
	}
	if n := strings.Count(logs.String(), "edgee"); n != 1 {
		t.Errorf("the domain logged %d times, want once:\n%s", n, logs.String())
	}
	if got := testutil.ToFloat64(u.count.WithLabelValues("edgee")); got != 3 {
		t.Errorf("ringlimit_unknown_domain_total{domain=\"edgee\"} = %v, want 3", got)
	}
	long := strings.Repeat("d", 10_000)
	u.Saw(long)
	for i := range 1000 {
		u.Saw(fmt.Sprint("flood-", i))
	}
	got := u.Domains()
	if len(got) != MaxUnknownDomains || got[0] != strings.Repeat("d", MaxUnknownDomainLen) || got[1] != "edgee" {
		t.Errorf("%d domains listed (first %.20q), want %d, the long one cut to %d bytes", len(got), got[0], MaxUnknownDomains, MaxUnknownDomainLen)
	}
	if n := testutil.CollectAndCount(u.count); n != MaxUnknownDomains+1 {
		t.Errorf("%d series of ringlimit_unknown_domain_total, want %d and _other", n, MaxUnknownDomains)
	}
	if got := testutil.ToFloat64(u.count.WithLabelValues("_other")); got != 1000-MaxUnknownDomains+2 {
		t.Errorf("_other counted %v, want %d", got, 1000-MaxUnknownDomains+2)
	}
}
