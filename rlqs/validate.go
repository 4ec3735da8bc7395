package rlqs

import (
	"fmt"
	"slices"
	"strings"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/ringlimit/ringlimit/policy"
)

// The bounds of a usage report. Envoy's filter sends far less; they keep
// a stream's memory and arithmetic bounded whatever a client sends.
const (
	// MaxUsagesPerMessage is the most bucket usages one message carries:
	// the node's codec stops decoding past it, and a stream holds at most
	// Config.MaxBucketsPerStream buckets (<= MaxUsagesPerMessage) anyway.
	MaxUsagesPerMessage = 1000
	// MaxEntries bounds a bucket_id's entries, MaxEntryLen each key and
	// value, in bytes.
	MaxEntries  = 32
	MaxEntryLen = 256
	// MaxRequestsPerReport bounds num_requests_allowed and
	// num_requests_denied of one report: a million a second for over a
	// week, so that no running total nears global.MaxLeaseTotal.
	MaxRequestsPerReport = 1 << 40
	// MaxTimeElapsed bounds time_elapsed.
	MaxTimeElapsed = time.Hour
)

// usage is one bucket's report, checked: its entries sorted by key (the
// order a bucket_id is matched in, see bucketKey), and its counts.
type usage struct {
	id              *rlqspb.BucketId
	key             string // the bucket's identity on the stream
	entries         []policy.Entry
	allowed, denied int64
}

// validate checks a message of a stream whose domain is domain (empty
// before the first message), and returns the stream's domain and the
// valid usages in the message's order. A usage that breaks a rule (its
// bucket_id, time_elapsed or counts) is left out, and its error is in bad:
// Envoy re-reports a bucket every interval, so ending the stream for one
// would switch the quota service off for every other bucket of the Envoy
// (the stream is opened again only at the next report, and ended again).
// An error of the message itself (its domain, its size) ends the stream
// with INVALID_ARGUMENT, naming the field. time_elapsed missing or zero
// is accepted: Envoy's filter sends whole seconds only (0 under a second,
// and in every first report), and the server measures demand on its own
// clock.
func validate(domain string, m *rlqspb.RateLimitQuotaUsageReports) (string, []usage, []error, error) {
	switch d := m.GetDomain(); {
	case domain == "" && d == "":
		return "", nil, nil, fmt.Errorf("domain: must not be empty in a stream's first report")
	case domain == "":
		domain = d
	case d != "" && d != domain:
		return "", nil, nil, fmt.Errorf("domain: %q, but the stream's is %q: a domain is fixed for a stream's life, open a new stream", d, domain)
	}
	us := m.GetBucketQuotaUsages()
	if len(us) > MaxUsagesPerMessage {
		return "", nil, nil, fmt.Errorf("bucket_quota_usages: %d, at most %d allowed", len(us), MaxUsagesPerMessage)
	}
	out := make([]usage, 0, len(us))
	var bad []error
	seen := make(map[string]bool, len(us))
	for i, u := range us {
		v, err := checkUsage(u, seen)
		if err != nil {
			bad = append(bad, fmt.Errorf("bucket_quota_usages[%d]%w", i, err))
			continue
		}
		out = append(out, v)
	}
	return domain, out, bad, nil
}

// checkUsage checks one usage of a message, whose buckets so far are
// seen, or returns an error naming the field below the usage (it begins
// with '.').
func checkUsage(u *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage, seen map[string]bool) (usage, error) {
	entries, err := checkBucketID(u.GetBucketId())
	if err != nil {
		return usage{}, fmt.Errorf(".bucket_id%w", err)
	}
	key := bucketKey(entries)
	if seen[key] {
		return usage{}, fmt.Errorf(".bucket_id: the same bucket as an earlier usage of the message")
	}
	seen[key] = true
	if te := u.GetTimeElapsed(); te != nil {
		if err := te.CheckValid(); err != nil {
			return usage{}, fmt.Errorf(".time_elapsed: %v", err)
		}
		if d := te.AsDuration(); d < 0 || d > MaxTimeElapsed {
			return usage{}, fmt.Errorf(".time_elapsed: %v, must be between 0 and %v", d, MaxTimeElapsed)
		}
	}
	allowed, denied := u.GetNumRequestsAllowed(), u.GetNumRequestsDenied()
	switch {
	case allowed > MaxRequestsPerReport:
		return usage{}, fmt.Errorf(".num_requests_allowed: %d, at most %d allowed", allowed, uint64(MaxRequestsPerReport))
	case denied > MaxRequestsPerReport:
		return usage{}, fmt.Errorf(".num_requests_denied: %d, at most %d allowed", denied, uint64(MaxRequestsPerReport))
	}
	return usage{id: u.GetBucketId(), key: key, entries: entries, allowed: int64(allowed), denied: int64(denied)}, nil
}

// checkBucketID returns id's entries sorted by key, or an error naming
// the field below bucket_id (it begins with '.' or ':').
func checkBucketID(id *rlqspb.BucketId) ([]policy.Entry, error) {
	b := id.GetBucket()
	switch {
	case id == nil:
		return nil, fmt.Errorf(": missing")
	case len(b) == 0:
		return nil, fmt.Errorf(".bucket: must not be empty")
	case len(b) > MaxEntries:
		return nil, fmt.Errorf(".bucket: %d entries, at most %d allowed", len(b), MaxEntries)
	}
	entries := make([]policy.Entry, 0, len(b))
	for k, v := range b {
		switch {
		case k == "":
			return nil, fmt.Errorf(".bucket: a key must not be empty")
		case v == "":
			return nil, fmt.Errorf(".bucket[%q]: the value must not be empty", k)
		case len(k) > MaxEntryLen:
			return nil, fmt.Errorf(".bucket: a key of %d bytes, at most %d allowed", len(k), MaxEntryLen)
		case len(v) > MaxEntryLen:
			return nil, fmt.Errorf(".bucket[%q]: a value of %d bytes, at most %d allowed", k, len(v), MaxEntryLen)
		}
		entries = append(entries, policy.Entry{Key: k, Value: v})
	}
	slices.SortFunc(entries, func(a, b policy.Entry) int { return strings.Compare(a.Key, b.Key) })
	return entries, nil
}

// bucketKey is a bucket's identity on a stream: its sorted entries, each
// key and value length-prefixed, so that no two buckets share one.
func bucketKey(entries []policy.Entry) string {
	var b strings.Builder
	for _, e := range entries {
		fmt.Fprintf(&b, "%d:%s%d:%s", len(e.Key), e.Key, len(e.Value), e.Value)
	}
	return b.String()
}

// entriesOf is a checked bucket_id's entries, sorted by key.
func entriesOf(id *rlqspb.BucketId) []policy.Entry {
	entries, _ := checkBucketID(id) // checked when it subscribed
	return entries
}
