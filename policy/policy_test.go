package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

func loadExample(t *testing.T) *Set {
	t.Helper()
	set, err := Load("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func entries(kv ...string) []Entry {
	var es []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{kv[i], kv[i+1]})
	}
	return es
}

// TestMatch checks envoyproxy/ratelimit's matching rules on the example.
func TestMatch(t *testing.T) {
	set := loadExample(t)
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		want    string // Limit.String(), or "" for no policy
		shared  []string
	}{
		{"key only matches any value", "edge", entries("remote_address", "1.2.3.4"), "5/second FIXED_WINDOW", nil},
		{"key and value", "edge", entries("user", "alice"), "3/minute FIXED_WINDOW", nil},
		{"nested, limit at the last entry", "edge", entries("user", "alice", "path", "/x"), "2/hour FIXED_WINDOW", nil},
		{"a limit applies only at the last entry's depth", "edge", entries("remote_address", "1.2.3.4", "path", "/x"), "", nil},
		{"a deeper limit does not apply to a shorter descriptor", "edge", entries("user", "alice", "path", "/x", "z", "1"), "", nil},
		{"value without a limit does not fall back to the key", "edge", entries("user", "bob"), "", nil},
		{"other values fall back to the key", "edge", entries("user", "carol"), "10/day FIXED_WINDOW", nil},
		{"wildcard", "edge", entries("path", "/api/users"), "4/minute FIXED_WINDOW", nil},
		{"wildcard matches the empty rest", "edge", entries("path", "/api/"), "4/minute FIXED_WINDOW", nil},
		{"share_threshold", "edge", entries("path", "/files/a.pdf"), "2/minute FIXED_WINDOW", []string{"/files/*"}},
		{"wildcard in the middle", "edge", entries("path", "/a-b-c"), "6/week FIXED_WINDOW", nil},
		{"middle wildcard needs every part", "edge", entries("path", "/a-c"), "", nil},
		{"no wildcard matches, no key-only path", "edge", entries("path", "/other"), "", nil},
		{"our extensions", "edge", entries("tier", "free"), "100/month SLIDING_WINDOW soft +10% (enforced 110) name=free", nil},
		{"a minimum spacing", "edge", entries("login", "alice"), "20/hour GCRA min_interval=2s", nil},
		{"a cost known afterwards: reserved", "edge", entries("model", "gpt"), "20000/minute TOKEN_BUCKET reserve_ttl=10m0s", nil},
		{"borrowing from the policy's own parent", "edge", entries("tenant", "acme"), `100/minute TOKEN_BUCKET ceiling=1000 parent="edge/tenant":10000/minute`, nil},
		{"borrowing from a named parent", "edge", entries("team", "a"), `5/second FIXED_WINDOW ceiling=20 parent="teams":50/minute`, nil},
		{"replaces", "edge", entries("tier", "vip"), "1000/year FIXED_WINDOW name=vip replaces=free", nil},
		{"unlimited", "edge", entries("internal", "x"), "unlimited", nil},
		{"zero", "edge", entries("blocked", "x"), "0/second FIXED_WINDOW", nil},
		{"shadow mode", "edge", entries("trial", "x"), "1/minute FIXED_WINDOW shadow_mode", nil},
		{"quota mode", "edge", entries("quota", "x"), "1/minute FIXED_WINDOW quota_mode", nil},
		{"a number value is its text", "other", entries("k", "123"), "1/second FIXED_WINDOW", nil},
		{"unknown domain", "nope", entries("user", "alice"), "", nil},
		{"unknown key", "edge", entries("nope", "x"), "", nil},
		{"no entries", "edge", nil, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := set.Match(tt.domain, tt.entries)
			got := ""
			if m.Limit != nil {
				got = m.Limit.String()
			}
			if got != tt.want {
				t.Errorf("Match = %q, want %q", got, tt.want)
			}
			if strings.Join(m.Shared, ",") != strings.Join(tt.shared, ",") {
				t.Errorf("Shared = %q, want %q", m.Shared, tt.shared)
			}
		})
	}
}

func TestEnforced(t *testing.T) {
	for _, tt := range []struct {
		rpu, soft uint32
		want      int64
	}{{100, 0, 100}, {100, 10, 110}, {9, 10, 9}, {10, 15, 11}, {0, 50, 0}, {1_000_000_000, 0, 1_000_000_000}} {
		l := Limit{RequestsPerUnit: tt.rpu, SoftPercent: tt.soft}
		if got := l.Enforced(); got != tt.want {
			t.Errorf("%d +%d%%: Enforced = %d, want %d", tt.rpu, tt.soft, got, tt.want)
		}
	}
}

func TestResolve(t *testing.T) {
	set := loadExample(t)
	for _, tt := range []struct{ ref, want, err string }{
		{"edge/user=alice", "3/minute FIXED_WINDOW", ""},
		{"edge/user=alice/path", "2/hour FIXED_WINDOW", ""},
		{"edge/user", "10/day FIXED_WINDOW", ""},
		{"edge/path=%2Fapi%2Fwidgets", "4/minute FIXED_WINDOW", ""},
		{"edge/tier=free", "100/month SLIDING_WINDOW soft +10% (enforced 110) name=free", ""},
		{"edge/user=bob", "", "no such policy"},
		{"edge", "", "want domain/key=value"},
		{"/user=alice", "", "want domain/key=value"},
		{"edge/=x", "", "bad segment"},
		{"edge/user=%zz", "", "bad segment"},
		{"nope/user=alice", "", "no such policy"},
	} {
		l, err := set.Resolve(tt.ref)
		switch {
		case tt.err != "":
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("Resolve(%q) error = %v, want %q", tt.ref, err, tt.err)
			}
		case err != nil:
			t.Errorf("Resolve(%q): %v", tt.ref, err)
		case l.String() != tt.want:
			t.Errorf("Resolve(%q) = %q, want %q", tt.ref, l, tt.want)
		}
	}
	if _, err := set.Resolve("edge/user=bob"); !errors.Is(err, ErrNoPolicy) {
		t.Errorf("unknown policy: %v, want ErrNoPolicy", err)
	}
}

// TestWindows: unit_multiplier makes a window of that many units, which
// Window gives, Resolve shows, and a unit alone leaves at one unit.
func TestWindows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.yaml")
	yaml := `domain: w
descriptors:
  - key: half_minute
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 10}
  - key: five_minutes
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 100, algorithm: TOKEN_BUCKET}
  - key: one
    rate_limit: {unit: hour, unit_multiplier: 1, requests_per_unit: 7}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: year
    rate_limit: {unit: day, unit_multiplier: 365, requests_per_unit: 1}
  - key: borrows
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 1, ceiling: 5, parent: {requests_per_unit: 20, unit: second, unit_multiplier: 10}}
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		ref, want string
		window    time.Duration
	}{
		{"w/half_minute", "10/30 seconds FIXED_WINDOW", 30 * time.Second},
		{"w/five_minutes", "100/5 minutes TOKEN_BUCKET", 5 * time.Minute},
		{"w/one", "7/hour FIXED_WINDOW", time.Hour},
		{"w/plain", "7/hour FIXED_WINDOW", time.Hour},
		{"w/year", "1/365 days FIXED_WINDOW", 365 * 24 * time.Hour},
		{"w/borrows", `1/10 seconds FIXED_WINDOW ceiling=5 parent="w/borrows":20/10 seconds`, 10 * time.Second},
	} {
		l, err := set.Resolve(tt.ref)
		if err != nil {
			t.Fatalf("Resolve(%q): %v", tt.ref, err)
		}
		if l.String() != tt.want || l.Window() != tt.window {
			t.Errorf("Resolve(%q) = %q with a window of %v, want %q and %v", tt.ref, l, l.Window(), tt.want, tt.window)
		}
		if l.Parent != nil && l.Parent.Window() != tt.window {
			t.Errorf("Resolve(%q): the parent's window %v, want %v", tt.ref, l.Parent.Window(), tt.window)
		}
	}
}

// TestPolicies lists the loaded policies with references that resolve to
// them.
func TestPolicies(t *testing.T) {
	set := loadExample(t)
	ps := set.Policies()
	if len(ps) != 18 {
		t.Fatalf("%d policies, want 18", len(ps))
	}
	for _, p := range ps {
		if strings.Contains(p.Ref, "*") {
			continue // a wildcard's reference is its pattern, which matches itself only by chance
		}
		l, err := set.Resolve(p.Ref)
		if err != nil || l != p.Limit {
			t.Errorf("Resolve(%q) = %v, %v; want the listed limit %v", p.Ref, l, err, p.Limit)
		}
		if p.File != "testdata/example.yaml" || p.Line == 0 {
			t.Errorf("%s listed at %s:%d", p.Ref, p.File, p.Line)
		}
	}
	if ps[0].Ref != "edge/remote_address" || ps[0].Line != 5 {
		t.Errorf("first policy %s at line %d", ps[0].Ref, ps[0].Line)
	}
	if got := set.Match("edge", entries("tier", "free")).Limit.Algorithm; got != limiter.SlidingWindow {
		t.Errorf("algorithm = %v", got)
	}
}

// TestErrors checks that every configuration error names file, line and
// field, and rejects the file.
func TestErrors(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"syntax", "domain: a\ndescriptors: [\n", `f.yaml:2: (document): invalid YAML: line 2`},
		{"empty file", "", `f.yaml:1: domain: missing`},
		{"empty domain", "descriptors: []\n", `f.yaml:1: domain: missing or empty`},
		{"unknown top key", "domain: a\nfoo: 1\n", `f.yaml:2: foo: unknown key`},
		{"misspelled", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, request_per_unit: 1}\n", `f.yaml:4: descriptors[0].rate_limit.request_per_unit: unknown key`},
		{"empty key", "domain: a\ndescriptors:\n  - value: v\n", `f.yaml:3: descriptors[0].key: missing or empty`},
		{"duplicate", "domain: a\ndescriptors:\n  - key: k\n  - key: k\n", `f.yaml:4: descriptors[1]: duplicate descriptor "k"`},
		{"bad unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", `f.yaml:5: descriptors[0].rate_limit.unit: invalid unit "fortnight"`},
		{"missing unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1\n", `f.yaml:5: descriptors[0].rate_limit.unit: invalid unit ""`},
		{"unlimited with unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", `f.yaml:4: descriptors[0].rate_limit.unit: must not be set`},
		{"negative", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", `descriptors[0].rate_limit.requests_per_unit: want a whole number`},
		{"too big", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4000000000}\n", `requests_per_unit: want a whole number from 0 to 1000000000`},
		{"bool", "domain: a\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n", `f.yaml:4: descriptors[0].shadow_mode: want true or false`},
		{"replaces empty", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: \"\"}]}\n", `descriptors[0].rate_limit.replaces[0].name: missing or empty`},
		{"replaces self", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {name: x, unit: second, requests_per_unit: 1, replaces: [{name: x}]}\n", `replaces[0].name: a limit must not replace itself`},
		{"share without wildcard", "domain: a\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", `descriptors[0].share_threshold: needs a wildcard`},
		{"algorithm", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}\n", `f.yaml:4: descriptors[0].rate_limit.algorithm: unknown algorithm "magic"`},
		{"soft", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, soft_percent: 5000}\n", `rate_limit.soft_percent: want a whole number from 0 to 1000`},
		{"soft over the bound", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000000, soft_percent: 10}\n", `rate_limit.soft_percent: the enforced limit 1100000000 is above`},
		{"min interval negative", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, min_interval_ms: -1}\n", `f.yaml:4: descriptors[0].rate_limit.min_interval_ms: want a whole number from 0 to 31536000000`},
		{"min interval over a year", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, min_interval_ms: 31536000001}\n", `rate_limit.min_interval_ms: want a whole number from 0 to 31536000000`},
		{"min interval as a duration", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, min_interval_ms: 2s}\n", `rate_limit.min_interval_ms: want a whole number`},
		{"multiplier of 0", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}\n", `f.yaml:4: descriptors[0].rate_limit.unit_multiplier: must be at least 1`},
		{"multiplier negative", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: -30}\n", `rate_limit.unit_multiplier: want a whole number from 0 to 31536000`},
		{"multiplier as a duration", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 30s}\n", `rate_limit.unit_multiplier: want a whole number`},
		{"window over a year", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, unit_multiplier: 366}\n", `rate_limit.unit_multiplier: 366 days make a window of 8784h0m0s, longer than a year`},
		{"multiplier when unlimited", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit_multiplier: 2}\n", `rate_limit.unit_multiplier: must not be set when unlimited is true`},
		{"parent multiplier of 0", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, ceiling: 2, parent: {requests_per_unit: 9, unit: second, unit_multiplier: 0}}\n", `rate_limit.parent.unit_multiplier: must be at least 1`},
		{"parent window over a year", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, ceiling: 2, parent: {requests_per_unit: 9, unit: week, unit_multiplier: 53}}\n", `rate_limit.parent.unit_multiplier: 53 weeks make a window`},
		{"reserve ttl of 0", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, reserve_ttl_ms: 0}\n", `f.yaml:4: descriptors[0].rate_limit.reserve_ttl_ms: want a whole number from 1 to 86400000 (a day), got 0`},
		{"reserve ttl over a day", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, reserve_ttl_ms: 86400001}\n", `rate_limit.reserve_ttl_ms: want a whole number from 0 to 86400000`},
		{"reserve ttl as a duration", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, reserve_ttl_ms: 10m}\n", `rate_limit.reserve_ttl_ms: want a whole number`},
		{"reserve when unlimited", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, reserve_ttl_ms: 1000}\n", `rate_limit.reserve_ttl_ms: must not be set when unlimited is true`},
		{"reserve with a spacing", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, min_interval_ms: 5, reserve_ttl_ms: 1000}\n", `rate_limit.reserve_ttl_ms: not with min_interval_ms`},
		{"reserve while borrowing", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, reserve_ttl_ms: 1000, ceiling: 2, parent: {requests_per_unit: 9, unit: second}}\n", `rate_limit.reserve_ttl_ms: not with ceiling`},
		{"min interval when unlimited", "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      min_interval_ms: 10\n", `f.yaml:6: descriptors[0].rate_limit.min_interval_ms: must not be set when unlimited is true`},
		{"sliding log", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 20000, algorithm: SLIDING_LOG}\n", `rate_limit.requests_per_unit: SLIDING_LOG keeps a timestamp`},
		{"ceiling without parent", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, ceiling: 2}\n", `f.yaml:4: descriptors[0].rate_limit.parent: missing: a ceiling borrows from a parent`},
		{"parent without ceiling", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, parent: {requests_per_unit: 9, unit: second}}\n", `descriptors[0].rate_limit.ceiling: missing`},
		{"ceiling not above", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, soft_percent: 10, ceiling: 11, parent: {requests_per_unit: 9, unit: second}}\n", `rate_limit.ceiling: must be above the enforced limit 11, got 11`},
		{"ceiling on zero", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0, ceiling: 2, parent: {requests_per_unit: 9, unit: second}}\n", `rate_limit.ceiling: needs requests_per_unit above 0`},
		{"ceiling too big", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, ceiling: 1000000001, parent: {requests_per_unit: 9, unit: second}}\n", `rate_limit.ceiling: want a whole number from 0 to 1000000000`},
		{"ceiling when unlimited", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, ceiling: 2}\n", `rate_limit.ceiling: must not be set when unlimited is true`},
		{"parent unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      ceiling: 2\n      parent: {requests_per_unit: 9, unit: aeon}\n", `f.yaml:8: descriptors[0].rate_limit.parent.unit: invalid unit "aeon"`},
		{"parent of nothing", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, ceiling: 2, parent: {unit: second}}\n", `rate_limit.parent.requests_per_unit: missing or 0`},
		{"parent unknown key", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, ceiling: 2, parent: {limit: 9}}\n", `rate_limit.parent.limit: unknown key (want one of key, requests_per_unit, unit, unit_multiplier)`},
		{"parent key too long", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, ceiling: 2, parent: {key: " + strings.Repeat("p", 257) + ", requests_per_unit: 9, unit: second}}\n", `rate_limit.parent.key: longer than 256 bytes`},
		{"default parent key too long", "domain: a\ndescriptors:\n  - key: " + strings.Repeat("k", 300) + "\n    rate_limit: {unit: second, requests_per_unit: 1, ceiling: 2, parent: {requests_per_unit: 9, unit: second}}\n", `rate_limit.parent.key: the default, the policy's reference`},
		{"sliding log ceiling", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: SLIDING_LOG, ceiling: 10001, parent: {requests_per_unit: 9, unit: second}}\n", `rate_limit.ceiling: SLIDING_LOG keeps a timestamp`},
		{"sliding log parent", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: SLIDING_LOG, ceiling: 2, parent: {requests_per_unit: 10001, unit: second}}\n", `rate_limit.parent.requests_per_unit: SLIDING_LOG keeps a timestamp`},
		{"list of scalars", "domain: a\ndescriptors:\n  - k\n", `f.yaml:3: descriptors[0]: want a mapping, got a scalar`},
		{"key not a string", "domain: a\ndescriptors:\n  - {[x]: 1}\n", `descriptors[0]: a key must be a string`},
		{"nested error", "domain: a\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        rate_limit: {unit: minute}\n        bogus: 1\n", `f.yaml:7: descriptors[0].descriptors[0].bogus: unknown key`},
		{"repeated key", "domain: a\ndomain: b\n", `f.yaml:2: domain: repeated key`},
		{"duplicate domain", "domain: a\n---\ndomain: a\n", `f.yaml:3: domain: domain "a" is defined twice`},
		{"descriptors not a list", "domain: a\ndescriptors: {key: k}\n", `f.yaml:2: descriptors: want a list, got a mapping`},
		{"key is a list", "domain: a\ndescriptors:\n  - key: [k]\n", `f.yaml:3: descriptors[0].key: want a string, got a list`},
		{"metadata not a map", "domain: a\ndescriptors:\n  - key: k\n    metadata: 3\n", `f.yaml:4: descriptors[0].metadata: want a mapping`},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "f.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			set, err := Load(path)
			var perr *Error
			if !errors.As(err, &perr) {
				t.Fatalf("Load = %v, %v; want an *Error", set, err)
			}
			got := strings.TrimPrefix(err.Error(), dir+string(filepath.Separator))
			if !strings.Contains(got, tt.want) {
				t.Errorf("error %q\nwant it to contain %q", got, tt.want)
			}
		})
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n")
	write("b.yml", "domain: b\n---\ndomain: c\n---\n")
	write("notes.txt", "not yaml: [")
	write(".hidden.yaml", "not yaml: [")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o700); err != nil {
		t.Fatal(err)
	}
	set, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"a", "b", "c"} {
		if !set.HasDomain(d) {
			t.Errorf("domain %q missing", d)
		}
	}
	write("z.yaml", "domain: a\n")
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "z.yaml:1: domain: domain \"a\" is defined twice") {
		t.Errorf("a domain in two files: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing path loaded")
	}
}

func TestLoadTooLarge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, []byte("domain: a\n"+strings.Repeat("#", MaxFileSize)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("Load = %v, want too large", err)
	}
}

func TestNilSet(t *testing.T) {
	var s *Set
	if s.HasDomain("a") || s.Match("a", entries("k", "v")).Limit != nil || s.Policies() != nil {
		t.Error("a nil Set holds something")
	}
}

// FuzzLoad checks that no file content makes the loader panic or hang,
// and that what loads can be matched.
func FuzzLoad(f *testing.F) {
	seed, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed, "user", "alice")
	f.Add([]byte("domain: a\ndescriptors: [{key: k, value: '*x*', rate_limit: {unit: second, requests_per_unit: 1}}]"), "k", "axb")
	f.Add([]byte("domain: &a a\ndescriptors: [*a]"), "k", "")
	f.Add([]byte("---\n---\n"), "", "")
	f.Add([]byte("domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1, ceiling: 2, parent: {key: p, requests_per_unit: 9, unit: hour}}}]"), "k", "v")
	f.Fuzz(func(t *testing.T, data []byte, key, value string) {
		set := newSet()
		p := parser{file: "fuzz.yaml", set: set}
		if err := p.parse(data); err != nil {
			var perr *Error
			if !errors.As(err, &perr) || perr.Line < 1 {
				t.Fatalf("error %v is not an *Error with a line", err)
			}
			return
		}
		for d := range set.domains {
			set.Match(d, []Entry{{key, value}, {key, value}})
		}
	})
}

// TestAliasBomb checks that aliases cannot make loading exponential.
func TestAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: k0\n    descriptors: &l0 [{key: a}, {key: b}]\n")
	for i := 1; i < 30; i++ {
		fmt.Fprintf(&b, "  - key: k%d\n    descriptors: &l%d [{key: a, descriptors: *l%d}, {key: b, descriptors: *l%d}]\n", i, i, i-1, i-1)
	}
	p := parser{file: "bomb.yaml", set: newSet()}
	err := p.parse([]byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "more than 100000 descriptors") {
		t.Errorf("parse = %v, want an error", err)
	}
}

// TestLoadNoPolicyFiles: a directory without policy files is an error, so
// that a mistyped or empty path fails where it is given instead of
// loading policies that limit nothing.
func TestLoadNoPolicyFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "no policy files (*.yaml, *.yml)") {
		t.Errorf("empty directory: %v, want an error saying it holds no policy files", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("domain: a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "no policy files") {
		t.Errorf("a directory of other files: %v, want an error saying it holds no policy files", err)
	}
}

// TestResolveSaysWhy: a reference that names no policy says why it may
// be: a domain not loaded, or a value written without its escapes, with
// the escaped reference when that one names a policy.
func TestResolveSaysWhy(t *testing.T) {
	set := loadExample(t)
	for _, tt := range []struct{ ref, want, unwanted string }{
		{"nope/user=alice", `no such policy: no domain "nope" is loaded`, ""},
		{"edge/path=/api/widgets", `no such policy (a '/', '=' or '%' in a key or value is written %2F, %3D or %25: did you mean "edge/path=%2Fapi%2Fwidgets"?)`, ""},
		{"edge/tier=a=b", `no such policy (a '/', '=' or '%' in a key or value is written %2F, %3D or %25)`, "did you mean"},
		{"edge/user=bob", `"edge/user=bob": no such policy`, "%2F"},
	} {
		_, err := set.Resolve(tt.ref)
		if !errors.Is(err, ErrNoPolicy) || !strings.Contains(err.Error(), tt.want) ||
			tt.unwanted != "" && strings.Contains(err.Error(), tt.unwanted) {
			t.Errorf("Resolve(%q) = %v\nwant ErrNoPolicy saying %q", tt.ref, err, tt.want)
		}
	}
}
