package httplimit

import (
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

var proxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}

func TestClientIP(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remote string
		header Header
		values []string // lines of the header
		want   string
	}{
		{"no proxy trusted: header ignored", "192.0.2.1:1", XForwardedFor, []string{"203.0.113.9"}, "192.0.2.1"},
		{"untrusted peer: header ignored", "192.0.2.1:1", XForwardedFor, []string{"203.0.113.9"}, "192.0.2.1"},
		{"trusted proxy, no header", "10.0.0.1:1", XForwardedFor, nil, "10.0.0.1"},
		{"one hop", "10.0.0.1:1", XForwardedFor, []string{"203.0.113.9"}, "203.0.113.9"},
		{"spoofed left part ignored", "10.0.0.1:1", XForwardedFor, []string{"1.1.1.1, 203.0.113.9"}, "203.0.113.9"},
		{"trusted hops skipped", "10.0.0.1:1", XForwardedFor, []string{"1.1.1.1, 203.0.113.9, 10.0.0.7 ,10.2.3.4"}, "203.0.113.9"},
		{"several lines join in order", "10.0.0.1:1", XForwardedFor, []string{"1.1.1.1", "203.0.113.9, 10.0.0.7"}, "203.0.113.9"},
		{"all trusted: the leftmost", "10.0.0.1:1", XForwardedFor, []string{"10.9.9.9, 10.0.0.7"}, "10.9.9.9"},
		{"port and brackets", "10.0.0.1:1", XForwardedFor, []string{"[2001:db8::1]:443"}, "2001:db8::1"},
		{"IPv4 with port", "10.0.0.1:1", XForwardedFor, []string{"203.0.113.9:5000"}, "203.0.113.9"},
		{"IPv4-mapped IPv6 unmapped", "10.0.0.1:1", XForwardedFor, []string{"::ffff:203.0.113.9"}, "203.0.113.9"},
		{"IPv6 proxy", "[fd00::1]:1", XForwardedFor, []string{"203.0.113.9, fd00::2"}, "203.0.113.9"},
		{"malformed where read", "10.0.0.1:1", XForwardedFor, []string{"203.0.113.9, not-an-ip"}, "10.0.0.1"},
		{"malformed left of the client is not read", "10.0.0.1:1", XForwardedFor, []string{"garbage, 203.0.113.9"}, "203.0.113.9"},
		{"empty entry where read", "10.0.0.1:1", XForwardedFor, []string{"203.0.113.9,"}, "10.0.0.1"},
		{"too long", "10.0.0.1:1", XForwardedFor, []string{strings.Repeat("1.1.1.1,", 600) + "203.0.113.9"}, "10.0.0.1"},
		{"Forwarded, one element", "10.0.0.1:1", Forwarded, []string{"for=203.0.113.9;proto=https"}, "203.0.113.9"},
		{"Forwarded, chain", "10.0.0.1:1", Forwarded, []string{`for=1.1.1.1, for="203.0.113.9:4711", for=10.0.0.5;by=10.0.0.1`}, "203.0.113.9"},
		{"Forwarded, IPv6 quoted", "10.0.0.1:1", Forwarded, []string{`For="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"Forwarded, unknown", "10.0.0.1:1", Forwarded, []string{"for=unknown"}, "10.0.0.1"},
		{"Forwarded, obfuscated", "10.0.0.1:1", Forwarded, []string{"for=_hidden"}, "10.0.0.1"},
		{"Forwarded, element without for", "10.0.0.1:1", Forwarded, []string{"for=203.0.113.9, proto=http"}, "10.0.0.1"},
		{"Forwarded, bad syntax", "10.0.0.1:1", Forwarded, []string{`for="203.0.113.9`}, "10.0.0.1"},
		{"Forwarded ignores X-Forwarded-For", "10.0.0.1:1", Forwarded, nil, "10.0.0.1"},
		{"RemoteAddr without port", "10.0.0.1", XForwardedFor, []string{"203.0.113.9"}, "203.0.113.9"},
		{"RemoteAddr not an IP", "pipe", XForwardedFor, []string{"203.0.113.9"}, "pipe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &Limiter{TrustedProxies: proxies, ForwardedHeader: tc.header}
			if strings.HasPrefix(tc.name, "no proxy trusted") {
				l.TrustedProxies = nil
			}
			r := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}
			name := "X-Forwarded-For"
			if tc.header == Forwarded {
				name = "Forwarded"
				r.Header.Set("X-Forwarded-For", "198.51.100.1") // ignored
			}
			for _, v := range tc.values {
				r.Header.Add(name, v)
			}
			if got := l.ClientIP(r); got != tc.want {
				t.Errorf("ClientIP = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestForwardedFor(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string // nil: malformed
	}{
		{"", []string{}},
		{"for=192.0.2.43", []string{"192.0.2.43"}},
		{`for="_gazonk"`, []string{"_gazonk"}},
		{`For="[2001:db8:cafe::17]:4711"`, []string{"[2001:db8:cafe::17]:4711"}},
		{"for=192.0.2.60;proto=http;by=203.0.113.43", []string{"192.0.2.60"}},
		{"for=192.0.2.43, for=198.51.100.17", []string{"192.0.2.43", "198.51.100.17"}},
		{"proto=https ; for=1.2.3.4 ;by=x", []string{"1.2.3.4"}},
		{",, for=1.2.3.4 ,", []string{"1.2.3.4"}},
		{"by=x", []string{""}},
		{`for="a\"b"`, []string{`a"b`}},
		{"for=1.2.3.4;for=5.6.7.8", nil},
		{"for", nil},
		{"for=", nil},
		{"=1.2.3.4", nil},
		{"for = 1.2.3.4", nil},
		{`for="1.2.3.4`, nil},
		{`for="a\`, nil},
		{"for=1.2.3.4 5.6.7.8", nil},
		{"for=\"a\x00b\"", nil},
		{"for=a\x7fb", nil},
	} {
		got, ok := forwardedFor(tc.in)
		if tc.want == nil {
			if ok {
				t.Errorf("forwardedFor(%q) = %q, want malformed", tc.in, got)
			}
			continue
		}
		if !ok || !slices.Equal(got, tc.want) {
			t.Errorf("forwardedFor(%q) = %q, %v; want %q", tc.in, got, ok, tc.want)
		}
	}
}

// FuzzForwardedFor feeds the Forwarded parser arbitrary text: it must not
// panic, and what it accepts must parse again the same when written back
// as quoted for= elements.
func FuzzForwardedFor(f *testing.F) {
	for _, s := range []string{"for=192.0.2.43", `for="[2001:db8::1]:80";proto=https, for=10.0.0.1`, `for="a\"b"`, ",,", "for=;"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fors, ok := forwardedFor(s)
		if !ok {
			return
		}
		var b strings.Builder
		for i, v := range fors {
			if v == "" {
				return // an element without for= has no written form here
			}
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(`for="` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(v) + `"`)
		}
		again, ok := forwardedFor(b.String())
		if !ok || !slices.Equal(again, fors) {
			t.Errorf("%q -> %q -> %q -> %q, %v", s, fors, b.String(), again, ok)
		}
	})
}

// FuzzClientIP: whatever the headers say, ClientIP answers RemoteAddr's
// host, or an IP address from the header and then only when RemoteAddr is
// a trusted proxy.
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:80", "203.0.113.9, 10.0.0.2", "for=203.0.113.9")
	f.Add("192.0.2.1:80", "1.2.3.4", `for="[::1]:4"`)
	f.Add("10.0.0.1:80", "[::1", "for=\"")
	f.Fuzz(func(t *testing.T, remote, xff, fwd string) {
		host := remote
		if h, _, err := net.SplitHostPort(remote); err == nil {
			host = h
		}
		peer, err := netip.ParseAddr(host)
		for _, h := range []Header{XForwardedFor, Forwarded} {
			l := &Limiter{TrustedProxies: proxies, ForwardedHeader: h}
			r := &http.Request{RemoteAddr: remote, Header: http.Header{"X-Forwarded-For": {xff}, "Forwarded": {fwd}}}
			got := l.ClientIP(r)
			if got == host {
				continue
			}
			if err != nil || !l.trusted(peer) {
				t.Fatalf("ClientIP(%q, %q, %q) = %q: header believed from an untrusted peer", remote, xff, fwd, got)
			}
			if _, err := netip.ParseAddr(got); err != nil {
				t.Fatalf("ClientIP(%q, %q, %q) = %q: not an IP", remote, xff, fwd, got)
			}
		}
	})
}
