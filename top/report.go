package top

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Report is what one node, or several merged, counted over a recent
// interval: every check and refusal, and per limit name the keys checked
// most (Hot) and refused most (Refused). Counts are space-saving
// estimates (see the package comment); rates are per second over the
// interval each node reported.
type Report struct {
	// Seconds is the interval the counts cover: for several nodes, the
	// longest of theirs (their intervals are not aligned; their rates
	// are summed, not their counts divided).
	Seconds           float64 `json:"seconds"`
	Checks            uint64  `json:"checks"`
	Refusals          uint64  `json:"refusals"`
	ChecksPerSecond   float64 `json:"checks_per_second"`
	RefusalsPerSecond float64 `json:"refusals_per_second"`
	Limits            []Limit `json:"limits"`
}

// Limit is one limit name's keys in a Report.
type Limit struct {
	Name            string  `json:"name"`
	Truncated       bool    `json:"truncated,omitempty"`
	Checks          uint64  `json:"checks"`
	ChecksPerSecond float64 `json:"checks_per_second"`
	// Hot holds the keys checked most, by Checks; Refused the keys
	// refused most, by Refusals, largest first.
	Hot     []Key `json:"hot"`
	Refused []Key `json:"refused"`
}

// Key is one key's counts. Error bounds the overestimate of the count its
// list is ordered by (Checks in Hot, Refusals in Refused); the other
// count is that of the key in the other list, or zero where the key is
// not among those counted there.
type Key struct {
	Key               string  `json:"key"`
	Truncated         bool    `json:"truncated,omitempty"`
	Checks            uint64  `json:"checks"`
	Refusals          uint64  `json:"refusals"`
	ChecksPerSecond   float64 `json:"checks_per_second"`
	RefusalsPerSecond float64 `json:"refusals_per_second"`
	Error             uint64  `json:"error"`
}

// Report returns what t counted in the interval under way and the one
// before it, as of now, with at most keys keys in each list (its Keys
// when keys <= 0).
func (t *Tracker) Report(now time.Time, keys int) Report {
	t.mu.Lock()
	parts := []Report{t.prev.read(), t.cur.read()}
	start := t.prev.start
	t.mu.Unlock()
	secs := now.Sub(start).Seconds()
	if secs <= 0 {
		secs = t.window.Seconds() // a clock that went back: the counts are still recent
	}
	if keys <= 0 {
		keys = cap(t.cur.hot[0].ents)
	}
	r := Merge(parts, keys)
	r.Seconds = secs
	r.SetRates()
	return r
}

// read returns in's counts, without rates. The caller holds the lock.
func (in *interval) read() Report {
	r := Report{Checks: in.names.Total(), Refusals: in.refusals}
	for i := range in.names.ents {
		name, long := in.names.slotKey(i)
		l := Limit{Name: name, Truncated: long, Checks: in.names.ents[i].count}
		for _, c := range in.hot[i].Counts() {
			l.Hot = append(l.Hot, Key{Key: c.Key, Truncated: c.Truncated, Checks: c.Count, Error: c.Error})
		}
		for _, c := range in.refused[i].Counts() {
			l.Refused = append(l.Refused, Key{Key: c.Key, Truncated: c.Truncated, Refusals: c.Count, Error: c.Error})
		}
		r.Limits = append(r.Limits, l)
	}
	return r
}

// SetRates fills the rates of r's counts over r.Seconds, the rates of a
// single node's report (a merged one's are the sum of its nodes').
func (r *Report) SetRates() {
	secs := r.Seconds
	r.ChecksPerSecond = float64(r.Checks) / secs
	r.RefusalsPerSecond = float64(r.Refusals) / secs
	for i := range r.Limits {
		l := &r.Limits[i]
		l.ChecksPerSecond = float64(l.Checks) / secs
		for _, ks := range [][]Key{l.Hot, l.Refused} {
			for j := range ks {
				ks[j].ChecksPerSecond = float64(ks[j].Checks) / secs
				ks[j].RefusalsPerSecond = float64(ks[j].Refusals) / secs
			}
		}
	}
}

// ident is how a key (or a name) is told apart in a merge: keys longer
// than MaxKeyBytes are merged by their prefix.
type ident struct {
	key       string
	truncated bool
}

// merging gathers one limit name's entries from several reports.
type merging struct {
	l            Limit
	hot, refused map[ident]*Key
}

// Merge sums reports (several nodes', or one node's intervals): counts,
// rates and errors of the same name and key are added, and each list is
// cut to its largest keys entries (all of them when keys <= 0). A key in
// one list takes its other count from the other list where it is there.
// Limits are ordered by checks, largest first.
func Merge(reports []Report, keys int) Report {
	var out Report
	byName := make(map[ident]*merging)
	for _, r := range reports {
		out.Seconds = max(out.Seconds, r.Seconds)
		out.Checks += r.Checks
		out.Refusals += r.Refusals
		out.ChecksPerSecond += r.ChecksPerSecond
		out.RefusalsPerSecond += r.RefusalsPerSecond
		for _, l := range r.Limits {
			id := ident{l.Name, l.Truncated}
			m := byName[id]
			if m == nil {
				m = &merging{l: Limit{Name: l.Name, Truncated: l.Truncated}, hot: make(map[ident]*Key), refused: make(map[ident]*Key)}
				byName[id] = m
			}
			m.l.Checks += l.Checks
			m.l.ChecksPerSecond += l.ChecksPerSecond
			addKeys(m.hot, l.Hot)
			addKeys(m.refused, l.Refused)
		}
	}
	for _, m := range byName {
		m.l.Hot = ranked(m.hot, m.refused, keys, func(k *Key) uint64 { return k.Checks }, func(k, other *Key) {
			k.Refusals, k.RefusalsPerSecond = max(k.Refusals, other.Refusals), max(k.RefusalsPerSecond, other.RefusalsPerSecond)
		})
		m.l.Refused = ranked(m.refused, m.hot, keys, func(k *Key) uint64 { return k.Refusals }, func(k, other *Key) {
			k.Checks, k.ChecksPerSecond = max(k.Checks, other.Checks), max(k.ChecksPerSecond, other.ChecksPerSecond)
		})
		out.Limits = append(out.Limits, m.l)
	}
	slices.SortFunc(out.Limits, func(a, b Limit) int {
		if c := cmp.Compare(b.Checks, a.Checks); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

func addKeys(into map[ident]*Key, ks []Key) {
	for _, k := range ks {
		id := ident{k.Key, k.Truncated}
		m := into[id]
		if m == nil {
			m = &Key{Key: k.Key, Truncated: k.Truncated}
			into[id] = m
		}
		m.Checks += k.Checks
		m.Refusals += k.Refusals
		m.ChecksPerSecond += k.ChecksPerSecond
		m.RefusalsPerSecond += k.RefusalsPerSecond
		m.Error += k.Error
	}
}

// ranked returns the keys of list, each given its other count from
// others by fill, ordered by count, largest first, at most n of them
// (all when n <= 0).
func ranked(list, others map[ident]*Key, n int, count func(*Key) uint64, fill func(k, other *Key)) []Key {
	out := make([]Key, 0, len(list))
	for id, k := range list {
		if o := others[id]; o != nil {
			fill(k, o)
		}
		out = append(out, *k)
	}
	slices.SortFunc(out, func(a, b Key) int {
		if c := cmp.Compare(count(&b), count(&a)); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// Hide replaces every key in r by a keyed hash of it ("#" and 16 hex
// digits), for pages and reports that must not show keys: the same key
// gives the same hash under the same secret, so that a hot key can still
// be followed from one refresh to the next, and, without the secret, a
// guessed key cannot be confirmed.
func (r *Report) Hide(secret []byte) {
	for i := range r.Limits {
		for _, ks := range [][]Key{r.Limits[i].Hot, r.Limits[i].Refused} {
			for j := range ks {
				mac := hmac.New(sha256.New, secret)
				mac.Write([]byte(ks[j].Key))
				if ks[j].Truncated {
					mac.Write([]byte{0}) // a key cut short hashes apart from its prefix as a key
				}
				ks[j].Key = "#" + hex.EncodeToString(mac.Sum(nil)[:8])
				ks[j].Truncated = false
			}
		}
	}
}

// Validate checks a report read from another node against the bounds a
// node's own reports keep: at most MaxNames limits of at most MaxKeys
// keys in each list, names and keys of at most MaxKeyBytes, a positive
// interval of at most MaxSeconds. Its error names the field at fault.
func (r *Report) Validate() error {
	switch {
	case !(r.Seconds > 0 && r.Seconds <= MaxSeconds):
		return fmt.Errorf("seconds: %v, want more than 0 and at most %v", r.Seconds, MaxSeconds)
	case len(r.Limits) > MaxNames:
		return fmt.Errorf("limits: %d, more than %d", len(r.Limits), MaxNames)
	}
	for i, l := range r.Limits {
		if len(l.Name) > MaxKeyBytes {
			return fmt.Errorf("limits[%d].name: longer than %d bytes", i, MaxKeyBytes)
		}
		for f, ks := range [2][]Key{l.Hot, l.Refused} {
			field := [2]string{"hot", "refused"}[f]
			if len(ks) > MaxKeys {
				return fmt.Errorf("limits[%d].%s: %d keys, more than %d", i, field, len(ks), MaxKeys)
			}
			for j, k := range ks {
				if len(k.Key) > MaxKeyBytes {
					return fmt.Errorf("limits[%d].%s[%d].key: longer than %d bytes", i, field, j, MaxKeyBytes)
				}
			}
		}
	}
	return nil
}

// MaxSeconds bounds the interval of a report read from another node: far
// longer than two windows of any sensible length.
const MaxSeconds = 24 * 60 * 60
