// Package policy holds rate-limit policies written in envoyproxy/ratelimit's
// YAML configuration language, and finds the policy that applies to a
// request's descriptor.
//
// A file (or each --- document of a file) is one domain: a tree of
// descriptors, each a key with an optional value, some with a rate_limit.
// A request's descriptor is walked one entry per level, by
// envoyproxy/ratelimit's rules (config_impl.go at commit f2fb157: exact
// value, else the first matching wildcard, else the key alone; a limit
// only at the depth of the last entry; no going back), so that its files
// answer the same here. Our keys: algorithm, soft_percent,
// min_interval_ms, ceiling and parent, reserve_ttl_ms. See
// docs/policies.md. A Set is an immutable snapshot, safe for concurrent
// use; a Reloader publishes a new one when the files change.
package policy

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
)

// Unit is a rate limit's period. The values are those of Envoy's
// RateLimitResponse.RateLimit.Unit, so the RLS converts with a cast.
type Unit int32

// The units. Month and Year are 30 and 365 days, with windows aligned to
// multiples of them since the Unix epoch, as envoyproxy/ratelimit has them.
const (
	Unknown Unit = 0
	Second  Unit = 1
	Minute  Unit = 2
	Hour    Unit = 3
	Day     Unit = 4
	Month   Unit = 5
	Year    Unit = 6
	Week    Unit = 7
)

var unitNames = map[Unit]string{Second: "SECOND", Minute: "MINUTE", Hour: "HOUR", Day: "DAY", Week: "WEEK", Month: "MONTH", Year: "YEAR"}

// String returns the unit's name as in Envoy's enum, e.g. "MINUTE".
func (u Unit) String() string {
	if n, ok := unitNames[u]; ok {
		return n
	}
	return "UNKNOWN"
}

// Period returns the unit's length; 0 for Unknown.
func (u Unit) Period() time.Duration {
	day := 24 * time.Hour
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return day
	case Week:
		return 7 * day
	case Month:
		return 30 * day
	case Year:
		return 365 * day
	}
	return 0
}

// parseUnit returns the unit named s, ignoring case, as ratelimit does.
func parseUnit(s string) (Unit, bool) {
	for u, n := range unitNames {
		if strings.EqualFold(n, s) {
			return u, true
		}
	}
	return Unknown, false
}

// Window is count units of u: a window of any length, as a policy's
// unit_multiplier asks ("per 30 s" is 30 units of a second). count is at
// least 1.
func Window(u Unit, count uint32) time.Duration {
	return u.Period() * time.Duration(max(count, 1))
}

// unitText names count units of u as `policy check` prints them:
// "second", or "30 seconds".
func unitText(u Unit, count uint32) string {
	name := strings.ToLower(u.String())
	if count <= 1 {
		return name
	}
	return fmt.Sprintf("%d %ss", count, name)
}

// MaxRequestsPerUnit bounds requests_per_unit: the largest limit a check
// may have, checks.MaxLimit. (ratelimit allows up to 2^32-1; a larger
// value is an error here rather than a silently different limit.)
const MaxRequestsPerUnit = checks.MaxLimit

// MaxUnitMultiplier bounds unit_multiplier as a number, before the
// window it makes is held to a year (31,536,000 seconds).
const MaxUnitMultiplier = uint64(checks.MaxDuration / time.Second)

// MaxSoftPercent bounds soft_percent.
const MaxSoftPercent = 1000

// MaxMinIntervalMs bounds min_interval_ms: the longest interval a check
// may ask for (checks.MaxDuration, a year), in milliseconds.
const MaxMinIntervalMs = uint64(checks.MaxDuration / time.Millisecond)

// Limit is a descriptor's rate_limit.
type Limit struct {
	// RequestsPerUnit hits are admitted per Unit; 0 refuses every hit.
	RequestsPerUnit uint32
	Unit            Unit
	// UnitMultiplier makes the window that many Units long (unit_multiplier,
	// named as Envoy's RateLimitResponse names it): 30 with Second is "per
	// 30 s". 1 unless the file says; see Window.
	UnitMultiplier uint32
	// Unlimited: the descriptor is never limited (Unit is Unknown).
	Unlimited bool
	// Name identifies the limit for other limits' Replaces.
	Name string
	// Replaces names limits that this one, when it applies, switches off
	// in the same request.
	Replaces []string
	// ShadowMode: an over-limit answer is reported OK (the hits are still
	// counted).
	ShadowMode bool
	// QuotaMode: an over-limit answer refuses the request only if every
	// quota-mode descriptor of the request is over its limit.
	QuotaMode bool
	// Algorithm decides the limit; FIXED_WINDOW unless the file says.
	Algorithm limiter.Algorithm
	// SoftPercent admits this percentage over RequestsPerUnit: the limit
	// enforced (and reported) is Enforced().
	SoftPercent uint32
	// MinInterval, when positive, is the least time between two admitted
	// requests of one counter (a check's min_interval_ms), whole
	// milliseconds.
	MinInterval time.Duration
	// Ceiling, when positive, lets each key borrow beyond Enforced(), up
	// to Ceiling hits a Unit, while Parent has room (a check's ceiling):
	// Enforced() is then the key's guarantee.
	Ceiling uint32
	// Parent is the limit the keys borrow from, set with Ceiling.
	Parent *Parent
	// ReserveTTL, when positive, makes the policy's costs known only
	// afterwards (reserve_ttl_ms): a native check of at least one hit that
	// names it reserves its hits for this long (a check's reserve_ttl_ms),
	// to be settled with the real cost; Envoy's rate limit service, which
	// cannot carry a reservation, checks and charges its descriptors as
	// package rls says. Whole milliseconds, at most checks.MaxReserveTTL.
	ReserveTTL time.Duration
}

// Parent is a rate_limit's parent: one limit shared by every key of the
// policy (and of every policy that names the same key).
type Parent struct {
	// Key names the parent counter, with the check's name; by default the
	// policy's reference, so that the keys of one policy share it.
	Key             string
	RequestsPerUnit uint32
	Unit            Unit
	UnitMultiplier  uint32
}

// Window is the length of the parent's window.
func (p *Parent) Window() time.Duration { return Window(p.Unit, p.UnitMultiplier) }

// WindowName names the limit's window in the names of its counters: the
// unit ("MINUTE"), with the multiplier when there is one ("SECONDx30"),
// so that a limit whose window changes starts new counters, and a window
// of one unit keeps the name it had before multipliers.
func (l *Limit) WindowName() string {
	if l.UnitMultiplier <= 1 {
		return l.Unit.String()
	}
	return l.Unit.String() + "x" + strconv.FormatUint(uint64(l.UnitMultiplier), 10)
}

// Window is the length of the limit's window: UnitMultiplier Units; 0 if
// the limit is unlimited.
func (l *Limit) Window() time.Duration { return Window(l.Unit, l.UnitMultiplier) }

// Enforced is the number of hits a window admits: RequestsPerUnit plus
// SoftPercent of it, rounded down.
func (l *Limit) Enforced() int64 {
	return int64(l.RequestsPerUnit) + int64(l.RequestsPerUnit)*int64(l.SoftPercent)/100
}

// String describes l as `policy check` prints it.
func (l *Limit) String() string {
	if l.Unlimited {
		return "unlimited"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d/%s %s", l.RequestsPerUnit, unitText(l.Unit, l.UnitMultiplier), l.Algorithm)
	if l.SoftPercent > 0 {
		fmt.Fprintf(&b, " soft +%d%% (enforced %d)", l.SoftPercent, l.Enforced())
	}
	if l.MinInterval > 0 {
		fmt.Fprintf(&b, " min_interval=%v", l.MinInterval)
	}
	if l.Ceiling > 0 {
		fmt.Fprintf(&b, " ceiling=%d parent=%q:%d/%s", l.Ceiling, l.Parent.Key, l.Parent.RequestsPerUnit, unitText(l.Parent.Unit, l.Parent.UnitMultiplier))
	}
	if l.ReserveTTL > 0 {
		fmt.Fprintf(&b, " reserve_ttl=%v", l.ReserveTTL)
	}
	if l.Name != "" {
		fmt.Fprintf(&b, " name=%s", l.Name)
	}
	if len(l.Replaces) > 0 {
		fmt.Fprintf(&b, " replaces=%s", strings.Join(l.Replaces, ","))
	}
	if l.ShadowMode {
		b.WriteString(" shadow_mode")
	}
	if l.QuotaMode {
		b.WriteString(" quota_mode")
	}
	return b.String()
}

// Entry is one (key, value) of a request's descriptor.
type Entry struct{ Key, Value string }

// node is one descriptor of the tree, or a domain's root.
type node struct {
	// children by "key" (key-only) or "key_value", as ratelimit keys them.
	children map[string]*node
	// wildcards are the children whose composite key holds a '*', in file
	// order: the first that matches wins.
	wildcards []wildcard
	limit     *Limit
	// shareThreshold: the values a wildcard matches share one counter.
	shareThreshold bool
}

// wildcard is a child's composite key split at its '*'s.
type wildcard struct {
	key   string
	parts []string
}

// match reports whether s matches w, each '*' matching any run of bytes.
func (w wildcard) match(s string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if !strings.HasPrefix(s, first) {
		return false
	}
	s = s[len(first):]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, last)
}

// Policy is one descriptor with a rate_limit, as loaded, for listing.
type Policy struct {
	// Ref names the policy as a check's policy field does:
	// "domain/key=value/key".
	Ref   string
	Limit *Limit
	File  string
	Line  int
}

// Set is a loaded set of domains. It is immutable and safe for concurrent
// use. The zero value (and nil) holds no domain.
type Set struct {
	domains  map[string]*node
	policies []Policy
}

// HasDomain reports whether s has the domain.
func (s *Set) HasDomain(domain string) bool {
	if s == nil {
		return false
	}
	_, ok := s.domains[domain]
	return ok
}

// Domains lists the domains of s, in name order.
func (s *Set) Domains() []string {
	if s == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(s.domains))
}

// Policies lists every descriptor with a rate_limit, in file order.
func (s *Set) Policies() []Policy {
	if s == nil {
		return nil
	}
	return s.policies
}

// Match is the policy that applies to a descriptor.
type Match struct {
	// Limit is nil when no policy applies.
	Limit *Limit
	// Shared is nil unless a share_threshold wildcard matched: then
	// Shared[i], when not empty, replaces entry i's value in the counter's
	// identity, so that every value the wildcard matches shares a counter.
	Shared []string
}

// Match walks domain's tree with entries and returns the policy that
// applies, by the rules of the package comment.
func (s *Set) Match(domain string, entries []Entry) Match {
	if s == nil {
		return Match{}
	}
	cur := s.domains[domain]
	if cur == nil {
		return Match{}
	}
	var m Match
	var shared []string
	for i, e := range entries {
		composite := e.Key + "_" + e.Value
		next := cur.children[composite]
		via := ""
		if next == nil {
			for _, w := range cur.wildcards {
				if w.match(composite) {
					next, via = cur.children[w.key], w.key
					break
				}
			}
		}
		if next == nil {
			next = cur.children[e.Key]
		}
		if next == nil {
			break
		}
		if via != "" && next.shareThreshold {
			if shared == nil {
				shared = make([]string, len(entries))
			}
			shared[i] = strings.TrimPrefix(via, e.Key+"_")
		}
		if i == len(entries)-1 && next.limit != nil {
			m = Match{Limit: next.limit, Shared: shared}
		}
		if len(next.children) == 0 {
			break
		}
		cur = next
	}
	return m
}

// refSegment escapes '%', '/' and '=' in a key or value of a policy
// reference, so that "api/path=%2Fapi%2F*" names the value "/api/*".
func refSegment(s string) string {
	return strings.NewReplacer("%", "%25", "/", "%2F", "=", "%3D").Replace(s)
}

// ErrNoPolicy reports a policy reference that names no policy.
var ErrNoPolicy = errors.New("no such policy")

// Resolve returns the limit that the policy reference ref names. A
// reference is "domain/key=value/key", one segment per descriptor entry
// ("key" alone is the entry with an empty value), with '%', '/' and '='
// in keys and values escaped as %25, %2F and %3D. It is matched by the
// same rules as an Envoy request (so "api/path=%2Fapi%2Fusers" finds
// a "/api/*" wildcard). When nothing matches, the error wraps ErrNoPolicy
// and says why it may be: a domain that is not loaded, or a value written
// without its escapes (with the escaped reference, if that one matches).
func (s *Set) Resolve(ref string) (*Limit, error) {
	domain, entries, err := parseRef(ref)
	if err != nil {
		return nil, err
	}
	if m := s.Match(domain, entries); m.Limit != nil {
		return m.Limit, nil
	}
	switch escaped := escapeRef(ref); {
	case !s.HasDomain(domain):
		return nil, fmt.Errorf("%q: %w: no domain %q is loaded", ref, ErrNoPolicy, domain)
	case escaped == "":
		return nil, fmt.Errorf("%q: %w", ref, ErrNoPolicy)
	case s.matches(escaped):
		return nil, fmt.Errorf("%q: %w (a '/', '=' or '%%' in a key or value is written %%2F, %%3D or %%25: did you mean %q?)", ref, ErrNoPolicy, escaped)
	default:
		return nil, fmt.Errorf("%q: %w (a '/', '=' or '%%' in a key or value is written %%2F, %%3D or %%25)", ref, ErrNoPolicy)
	}
}

// parseRef splits a policy reference into its domain and entries.
func parseRef(ref string) (string, []Entry, error) {
	segs := strings.Split(ref, "/")
	if len(segs) < 2 || segs[0] == "" {
		return "", nil, fmt.Errorf("%q: want domain/key=value[/key=value...]", ref)
	}
	entries := make([]Entry, len(segs)-1)
	for i, seg := range segs[1:] {
		k, v, _ := strings.Cut(seg, "=")
		var err error
		if entries[i].Key, err = url.PathUnescape(k); err == nil {
			entries[i].Value, err = url.PathUnescape(v)
		}
		if err != nil || entries[i].Key == "" {
			return "", nil, fmt.Errorf("%q: bad segment %q", ref, seg)
		}
	}
	return segs[0], entries, nil
}

// matches reports whether ref is a reference that names a policy.
func (s *Set) matches(ref string) bool {
	domain, entries, err := parseRef(ref)
	return err == nil && s.Match(domain, entries).Limit != nil
}

// escapeRef returns ref as it would read had its values been escaped, or
// "" if nothing in it looks unescaped: a segment "key=" with an empty value
// followed by more segments reads as a value holding '/' (its escaped
// value runs to the end of ref: "edge/path=/api/users" becomes
// "edge/path=%2Fapi%2Fusers"), and a segment with two '=' as a value
// holding '='.
func escapeRef(ref string) string {
	segs := strings.Split(ref, "/")
	out := []string{segs[0]}
	changed := false
	for i := 1; i < len(segs); i++ {
		k, v, ok := strings.Cut(segs[i], "=")
		switch {
		case ok && v == "" && i+1 < len(segs):
			return strings.Join(append(out, k+"="+refSegment("/"+strings.Join(segs[i+1:], "/"))), "/")
		case strings.Contains(v, "="):
			v, changed = strings.ReplaceAll(v, "=", "%3D"), true
		}
		if ok {
			out = append(out, k+"="+v)
		} else {
			out = append(out, k)
		}
	}
	if !changed {
		return ""
	}
	return strings.Join(out, "/")
}
