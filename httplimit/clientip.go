package httplimit

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Header names the header in which trusted proxies pass on the address of
// the client they received a request from.
type Header int

const (
	// XForwardedFor is X-Forwarded-For: addresses separated by commas,
	// each proxy appending the one it received the request from.
	XForwardedFor Header = iota
	// Forwarded is the standard Forwarded header (RFC 7239): elements
	// separated by commas, each proxy appending one whose for= parameter
	// is the address it received the request from.
	Forwarded
)

// maxForwardedBytes bounds the bytes of a forwarding header that are read,
// all its lines together. A real chain of proxies is far shorter; a longer
// header is treated as malformed rather than parsed at length.
const maxForwardedBytes = 4096

// ClientIP returns the address of the client that sent r, the default key.
// It is the host of r.RemoteAddr, unless that is in TrustedProxies: then
// it is the rightmost address in ForwardedHeader that is not a trusted
// proxy (or the leftmost, if all are). Everything left of that address was
// written by the client and is not believed. A header that is missing,
// longer than 4 KiB, or malformed where it is read gives the host of
// RemoteAddr, as does an entry that is not an IP address (RFC 7239's
// "unknown" or an obfuscated identifier).
func (l *Limiter) ClientIP(r *http.Request) string {
	remote := r.RemoteAddr
	if host, _, err := net.SplitHostPort(remote); err == nil {
		remote = host
	}
	ip, err := netip.ParseAddr(remote)
	if err != nil || !l.trusted(ip) {
		return remote
	}
	hops, ok := l.ForwardedHeader.hops(r.Header)
	if !ok {
		return remote
	}
	for i := len(hops) - 1; i >= 0; i-- {
		hop, ok := parseHop(hops[i])
		if !ok {
			return remote
		}
		if i == 0 || !l.trusted(hop) {
			return hop.String()
		}
	}
	return remote // no hops
}

// trusted reports whether ip is one of the trusted proxies.
func (l *Limiter) trusted(ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("")
	for _, p := range l.TrustedProxies {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// hops returns the addresses h's header lists in h, in order, unparsed;
// false if the header is missing, too long or malformed.
func (f Header) hops(h http.Header) ([]string, bool) {
	name := "X-Forwarded-For"
	if f == Forwarded {
		name = "Forwarded"
	}
	lines := h.Values(name)
	n := 0
	for _, line := range lines {
		n += len(line) + 1
	}
	if len(lines) == 0 || n > maxForwardedBytes {
		return nil, false
	}
	joined := strings.Join(lines, ",")
	if f == Forwarded {
		return forwardedFor(joined)
	}
	var hops []string
	for hop := range strings.SplitSeq(joined, ",") {
		hops = append(hops, strings.Trim(hop, " \t"))
	}
	return hops, true
}

// parseHop parses one address from a forwarding header: an IP address,
// with or without a port, IPv6 with or without brackets. The port may be
// anything (RFC 7239 allows obfuscated ports); it is dropped.
func parseHop(s string) (netip.Addr, bool) {
	host := s
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 || (end+1 < len(s) && s[end+1] != ':') {
			return netip.Addr{}, false
		}
		host = s[1:end]
	case strings.Count(s, ":") == 1: // IPv4:port
		host = s[:strings.IndexByte(s, ':')]
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

// forwardedFor returns the for= value of each element of a Forwarded
// header value (RFC 7239 section 4), "" for an element without one; false
// if v is not of the header's syntax or an element has two for=. It is
// lenient only about whitespace around ";" as well as ",".
func forwardedFor(v string) ([]string, bool) {
	p := forwardedParser{s: v}
	var fors []string
	for {
		p.skipSpace()
		if p.i == len(p.s) {
			return fors, true
		}
		if p.s[p.i] == ',' { // empty list element
			p.i++
			continue
		}
		value, ok := p.element()
		if !ok {
			return nil, false
		}
		fors = append(fors, value)
		p.skipSpace()
		if p.i < len(p.s) {
			if p.s[p.i] != ',' {
				return nil, false
			}
			p.i++
		}
	}
}

type forwardedParser struct {
	s string
	i int
}

// element parses forwarded-pairs separated by ";" up to the next "," or
// the end, and returns the value of its for= pair.
func (p *forwardedParser) element() (forValue string, ok bool) {
	seenFor := false
	for {
		p.skipSpace()
		if p.i < len(p.s) && p.s[p.i] != ';' && p.s[p.i] != ',' {
			name := p.token()
			if name == "" || p.i == len(p.s) || p.s[p.i] != '=' {
				return "", false
			}
			p.i++
			value, ok := p.value()
			if !ok {
				return "", false
			}
			if strings.EqualFold(name, "for") {
				if seenFor {
					return "", false
				}
				seenFor, forValue = true, value
			}
			p.skipSpace()
		}
		if p.i == len(p.s) || p.s[p.i] != ';' {
			return forValue, true
		}
		p.i++
	}
}

// value parses a token or a quoted-string and returns its text.
func (p *forwardedParser) value() (string, bool) {
	if p.i == len(p.s) || p.s[p.i] != '"' {
		t := p.token()
		return t, t != ""
	}
	p.i++
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return b.String(), true
		case c == '\\':
			if p.i+1 == len(p.s) || !quotable(p.s[p.i+1]) {
				return "", false
			}
			b.WriteByte(p.s[p.i+1])
			p.i += 2
		case quotable(c):
			b.WriteByte(c)
			p.i++
		default:
			return "", false
		}
	}
	return "", false // unterminated
}

func (p *forwardedParser) token() string {
	start := p.i
	for p.i < len(p.s) && isTokenChar(p.s[p.i]) {
		p.i++
	}
	return p.s[start:p.i]
}

func (p *forwardedParser) skipSpace() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// isTokenChar reports whether c is a tchar of RFC 9110.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// quotable reports whether c may appear in a quoted-string of RFC 9110,
// as qdtext or escaped: tab, space, visible ASCII and obs-text.
func quotable(c byte) bool {
	return c == '\t' || c == ' ' || (0x21 <= c && c != 0x7f)
}
