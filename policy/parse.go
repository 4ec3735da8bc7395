package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
)

// MaxFileSize bounds one policy file, so that a stray file in the
// directory cannot make a node read gigabytes.
const MaxFileSize = 4 << 20

// MaxDepth bounds the nesting of descriptors (Envoy sends a handful of
// entries; ratelimit sets no bound).
const MaxDepth = 32

// Error is a configuration error: it names the file, the line and the
// field (a path such as "descriptors[1].rate_limit.unit"). Any Error
// rejects the whole file, and a reload keeps the policies in force.
type Error struct {
	File   string
	Line   int
	Field  string
	Reason string
}

func (e *Error) Error() string {
	field := e.Field
	if field == "" {
		field = "(document)"
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, field, e.Reason)
}

// MaxDescriptors bounds the descriptors of one file. YAML aliases can
// make a small file name exponentially many; this keeps loading linear.
const MaxDescriptors = 100_000

// parser builds domains from one file's documents.
type parser struct {
	file  string
	set   *Set
	count int // descriptors parsed
}

// parse adds the domains of data (one per YAML document) to p.set.
func (p *parser) parse(data []byte) error {
	if len(data) > MaxFileSize {
		return &Error{File: p.file, Line: 1, Reason: fmt.Sprintf("file larger than %d bytes", MaxFileSize)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	docs := 0
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return p.syntaxError(err)
		}
		if len(doc.Content) == 0 || isNull(doc.Content[0]) {
			continue // an empty document, e.g. after a trailing ---
		}
		docs++
		if err := p.domain(doc.Content[0]); err != nil {
			return err
		}
	}
	if docs == 0 {
		return &Error{File: p.file, Line: 1, Field: "domain", Reason: "missing: the file has no document"}
	}
	return nil
}

var lineRE = regexp.MustCompile(`line (\d+)`)

// syntaxError turns a YAML syntax error into an Error with its line.
func (p *parser) syntaxError(err error) error {
	line := 1
	if m := lineRE.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
	}
	return &Error{File: p.file, Line: line, Reason: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
}

func (p *parser) errorf(n *yaml.Node, field, format string, args ...any) error {
	return &Error{File: p.file, Line: n.Line, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// deref follows an alias to its anchor.
func deref(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

// fields calls set for every key of mapping n, in order. A key not in
// known is an error, as in ratelimit; so is a repeated key.
func (p *parser) fields(n *yaml.Node, path string, known []string, set func(key string, v *yaml.Node) error) error {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		return p.errorf(n, path, "want a mapping, got %s", kindName(n))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return p.errorf(k, path, "a key must be a string, got %s", kindName(k))
		}
		field := join(path, k.Value)
		if !contains(known, k.Value) {
			return p.errorf(k, field, "unknown key (want one of %s)", strings.Join(known, ", "))
		}
		if seen[k.Value] {
			return p.errorf(k, field, "repeated key")
		}
		seen[k.Value] = true
		if err := set(k.Value, v); err != nil {
			return err
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if isNull(n) {
			return "null"
		}
		return "a scalar"
	}
	return "an alias"
}

// scalar returns n's text; any scalar works, as in ratelimit where
// `value: 123` is the string "123". Null is the empty string.
func (p *parser) scalar(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", p.errorf(n, field, "want a string, got %s", kindName(n))
	}
	if isNull(n) {
		return "", nil
	}
	return n.Value, nil
}

func (p *parser) boolean(n *yaml.Node, field string) (bool, error) {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		return false, p.errorf(n, field, "want true or false, got %q", n.Value)
	}
	return b, nil
}

func (p *parser) uint(n *yaml.Node, field string, most uint64) (uint64, error) {
	var u uint64
	if n.Kind != yaml.ScalarNode || n.Decode(&u) != nil || u > most {
		return 0, p.errorf(n, field, "want a whole number from 0 to %d, got %q", most, n.Value)
	}
	return u, nil
}

// list calls each for every element of sequence n (null is empty).
func (p *parser) list(n *yaml.Node, path string, each func(i int, v *yaml.Node) error) error {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return p.errorf(n, path, "want a list, got %s", kindName(n))
	}
	for i, v := range n.Content {
		if err := each(i, deref(v)); err != nil {
			return err
		}
	}
	return nil
}

// domain adds the domain of document n to p.set.
func (p *parser) domain(n *yaml.Node) error {
	var name string
	var descs *yaml.Node
	err := p.fields(n, "", []string{"domain", "descriptors"}, func(key string, v *yaml.Node) (err error) {
		if key == "domain" {
			name, err = p.scalar(v, "domain")
			return err
		}
		descs = v
		return nil
	})
	if err != nil {
		return err
	}
	switch {
	case name == "":
		return p.errorf(n, "domain", "missing or empty")
	case p.set.domains[name] != nil:
		return p.errorf(n, "domain", "domain %q is defined twice", name)
	}
	root := &node{children: map[string]*node{}}
	p.set.domains[name] = root
	if descs == nil {
		return nil
	}
	return p.descriptors(root, descs, "descriptors", name, 1)
}

// descriptors adds the descriptors of list n to parent. ref is the parent's
// policy reference ("domain/key=value").
func (p *parser) descriptors(parent *node, n *yaml.Node, path, ref string, depth int) error {
	if depth > MaxDepth {
		return p.errorf(n, path, "descriptors nested deeper than %d levels", MaxDepth)
	}
	return p.list(n, path, func(i int, v *yaml.Node) error {
		return p.descriptor(parent, v, fmt.Sprintf("%s[%d]", path, i), ref, depth)
	})
}

var descriptorKeys = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
	"detailed_metric", "value_to_metric", "share_threshold", "metadata"}

// descriptor adds descriptor n to parent.
func (p *parser) descriptor(parent *node, n *yaml.Node, path, ref string, depth int) error {
	if p.count++; p.count > MaxDescriptors {
		return p.errorf(n, path, "more than %d descriptors in one file (counting each use of an alias)", MaxDescriptors)
	}
	var key, value string
	var limitNode, children *yaml.Node
	var shadow, quota, share bool
	d := &node{children: map[string]*node{}}
	err := p.fields(n, path, descriptorKeys, func(k string, v *yaml.Node) (err error) {
		field := join(path, k)
		switch k {
		case "key":
			key, err = p.scalar(v, field)
		case "value":
			value, err = p.scalar(v, field)
		case "rate_limit":
			limitNode = v
		case "descriptors":
			children = v
		case "shadow_mode":
			shadow, err = p.boolean(v, field)
		case "quota_mode":
			quota, err = p.boolean(v, field)
		case "share_threshold":
			share, err = p.boolean(v, field)
		case "detailed_metric", "value_to_metric":
			_, err = p.boolean(v, field) // they shape ratelimit's statsd names only
		case "metadata":
			if v.Kind != yaml.MappingNode && !isNull(v) {
				err = p.errorf(v, field, "want a mapping, got %s", kindName(v))
			}
		}
		return err
	})
	if err != nil {
		return err
	}
	if key == "" {
		return p.errorf(n, join(path, "key"), "missing or empty")
	}
	composite := key
	ref += "/" + refSegment(key)
	if value != "" {
		composite += "_" + value
		ref += "=" + refSegment(value)
	}
	if parent.children[composite] != nil {
		return p.errorf(n, path, "duplicate descriptor %q (key %q, value %q) at this level", composite, key, value)
	}
	wild := strings.Contains(composite, "*")
	if share && !wild {
		return p.errorf(n, join(path, "share_threshold"), "needs a wildcard value (with '*'), got %q", composite)
	}
	d.shareThreshold = share
	if limitNode != nil && !isNull(limitNode) {
		if d.limit, err = p.limit(limitNode, join(path, "rate_limit"), shadow, quota); err != nil {
			return err
		}
		if err := p.defaultParentKey(d.limit, limitNode, join(path, "rate_limit.parent.key"), ref); err != nil {
			return err
		}
		p.set.policies = append(p.set.policies, Policy{Ref: ref, Limit: d.limit, File: p.file, Line: n.Line})
	}
	if children != nil {
		if err := p.descriptors(d, children, join(path, "descriptors"), ref, depth+1); err != nil {
			return err
		}
	}
	parent.children[composite] = d
	if wild {
		parent.wildcards = append(parent.wildcards, wildcard{key: composite, parts: strings.Split(composite, "*")})
	}
	return nil
}

var limitKeys = []string{"requests_per_unit", "unit", "unit_multiplier", "unlimited", "name", "replaces", "algorithm", "soft_percent", "min_interval_ms",
	"ceiling", "parent", "reserve_ttl_ms"}

// limit parses a rate_limit mapping.
func (p *parser) limit(n *yaml.Node, path string, shadow, quota bool) (*Limit, error) {
	l := &Limit{ShadowMode: shadow, QuotaMode: quota, Algorithm: limiter.FixedWindow}
	var unitNode, multiplierNode, intervalNode, ceilingNode, parentNode, reserveNode *yaml.Node
	unit := ""
	err := p.fields(n, path, limitKeys, func(k string, v *yaml.Node) error {
		field := join(path, k)
		switch k {
		case "requests_per_unit":
			u, err := p.uint(v, field, MaxRequestsPerUnit)
			l.RequestsPerUnit = uint32(u)
			return err
		case "unit":
			unitNode = v
			var err error
			unit, err = p.scalar(v, field)
			return err
		case "unit_multiplier":
			multiplierNode = v
			var err error
			l.UnitMultiplier, err = p.multiplier(v, field)
			return err
		case "unlimited":
			var err error
			l.Unlimited, err = p.boolean(v, field)
			return err
		case "name":
			var err error
			l.Name, err = p.scalar(v, field)
			return err
		case "replaces":
			return p.list(v, field, func(i int, r *yaml.Node) error {
				rpath := fmt.Sprintf("%s[%d]", field, i)
				var name string
				err := p.fields(r, rpath, []string{"name"}, func(_ string, v *yaml.Node) (err error) {
					name, err = p.scalar(v, join(rpath, "name"))
					return err
				})
				l.Replaces = append(l.Replaces, name)
				return err
			})
		case "algorithm":
			s, err := p.scalar(v, field)
			if err != nil {
				return err
			}
			if l.Algorithm, err = algorithms.ParseKind(s); err != nil {
				return p.errorf(v, field, "%v", err)
			}
		case "soft_percent":
			u, err := p.uint(v, field, MaxSoftPercent)
			l.SoftPercent = uint32(u)
			return err
		case "min_interval_ms":
			intervalNode = v
			u, err := p.uint(v, field, MaxMinIntervalMs)
			l.MinInterval = time.Duration(u) * time.Millisecond
			return err
		case "ceiling":
			ceilingNode = v
			u, err := p.uint(v, field, MaxRequestsPerUnit)
			l.Ceiling = uint32(u)
			return err
		case "parent":
			parentNode = v
			var err error
			l.Parent, err = p.parent(v, field)
			return err
		case "reserve_ttl_ms":
			reserveNode = v
			u, err := p.uint(v, field, uint64(checks.MaxReserveTTL.Milliseconds()))
			l.ReserveTTL = time.Duration(u) * time.Millisecond
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := p.checkReserve(l, reserveNode, intervalNode, ceilingNode, path); err != nil {
		return nil, err
	}
	u, valid := parseUnit(unit)
	switch {
	case l.Unlimited && unit != "":
		return nil, p.errorf(unitNode, join(path, "unit"), "must not be set when unlimited is true")
	case l.Unlimited && multiplierNode != nil:
		return nil, p.errorf(multiplierNode, join(path, "unit_multiplier"), "must not be set when unlimited is true")
	case l.Unlimited && intervalNode != nil:
		return nil, p.errorf(intervalNode, join(path, "min_interval_ms"), "must not be set when unlimited is true")
	case !l.Unlimited && !valid:
		at := n
		if unitNode != nil {
			at = unitNode
		}
		return nil, p.errorf(at, join(path, "unit"), "invalid unit %q (want second, minute, hour, day, week, month or year)", unit)
	}
	l.Unit = u
	if err := p.window(multiplierNode, path, u, l.UnitMultiplier); err != nil {
		return nil, err
	}
	for i, r := range l.Replaces {
		switch {
		case r == "":
			return nil, p.errorf(n, fmt.Sprintf("%s.replaces[%d].name", path, i), "missing or empty")
		case r == l.Name:
			return nil, p.errorf(n, fmt.Sprintf("%s.replaces[%d].name", path, i), "a limit must not replace itself (%q)", r)
		}
	}
	switch {
	case l.Enforced() > MaxRequestsPerUnit:
		return nil, p.errorf(n, join(path, "soft_percent"), "the enforced limit %d is above %d", l.Enforced(), MaxRequestsPerUnit)
	case l.Algorithm == limiter.SlidingLog && l.Enforced() > algorithms.MaxSlidingLogLimit:
		return nil, p.errorf(n, join(path, "requests_per_unit"), "SLIDING_LOG keeps a timestamp per hit, so it allows at most %d, got %d", algorithms.MaxSlidingLogLimit, l.Enforced())
	}
	return l, p.checkBorrowing(l, n, ceilingNode, parentNode, path)
}

// checkReserve checks l's reserve_ttl_ms, at at (nil if the file has
// none): at least 1 ms, and not on a limit whose checks cannot reserve
// (see checks.Request): unlimited, spaced or borrowing.
func (p *parser) checkReserve(l *Limit, at, intervalNode, ceilingNode *yaml.Node, path string) error {
	field := join(path, "reserve_ttl_ms")
	switch {
	case at == nil:
		return nil
	case l.ReserveTTL == 0:
		return p.errorf(at, field, "want a whole number from 1 to %d (a day), got 0: omit it to spend hits rather than reserve them", checks.MaxReserveTTL.Milliseconds())
	case l.Unlimited:
		return p.errorf(at, field, "must not be set when unlimited is true")
	case intervalNode != nil && l.MinInterval > 0:
		return p.errorf(at, field, "not with min_interval_ms: a spacing counts requests and cannot give them back")
	case ceilingNode != nil:
		return p.errorf(at, field, "not with ceiling: a check that borrows cannot reserve")
	case !limiter.Reservable(l.Algorithm):
		return p.errorf(at, field, "%s cannot give hits back, so it cannot reserve", l.Algorithm)
	}
	return nil
}

// checkBorrowing checks l's ceiling and parent: both or neither, on a
// limit that admits hits, a ceiling above the enforced limit, and within
// SLIDING_LOG's bound.
func (p *parser) checkBorrowing(l *Limit, n, ceilingNode, parentNode *yaml.Node, path string) error {
	switch {
	case ceilingNode == nil && parentNode == nil:
		return nil
	case l.Unlimited:
		at, field := ceilingNode, "ceiling"
		if at == nil {
			at, field = parentNode, "parent"
		}
		return p.errorf(at, join(path, field), "must not be set when unlimited is true")
	case parentNode == nil:
		return p.errorf(ceilingNode, join(path, "parent"), "missing: a ceiling borrows from a parent")
	case ceilingNode == nil:
		return p.errorf(parentNode, join(path, "ceiling"), "missing: a parent is for keys that borrow up to a ceiling")
	case l.RequestsPerUnit == 0:
		return p.errorf(n, join(path, "ceiling"), "needs requests_per_unit above 0: a ceiling borrows beyond a limit")
	case int64(l.Ceiling) <= l.Enforced():
		return p.errorf(ceilingNode, join(path, "ceiling"), "must be above the enforced limit %d, got %d", l.Enforced(), l.Ceiling)
	case l.Algorithm == limiter.SlidingLog && l.Ceiling > algorithms.MaxSlidingLogLimit:
		return p.errorf(ceilingNode, join(path, "ceiling"), "SLIDING_LOG keeps a timestamp per hit, so it allows at most %d, got %d", algorithms.MaxSlidingLogLimit, l.Ceiling)
	case l.Algorithm == limiter.SlidingLog && l.Parent.RequestsPerUnit > algorithms.MaxSlidingLogLimit:
		return p.errorf(parentNode, join(path, "parent.requests_per_unit"), "SLIDING_LOG keeps a timestamp per hit, so it allows at most %d, got %d", algorithms.MaxSlidingLogLimit, l.Parent.RequestsPerUnit)
	}
	return nil
}

var parentKeys = []string{"key", "requests_per_unit", "unit", "unit_multiplier"}

// parent parses a rate_limit's parent mapping.
func (p *parser) parent(n *yaml.Node, path string) (*Parent, error) {
	pl := &Parent{}
	unit := ""
	var unitNode, multiplierNode *yaml.Node
	err := p.fields(n, path, parentKeys, func(k string, v *yaml.Node) (err error) {
		field := join(path, k)
		switch k {
		case "key":
			pl.Key, err = p.scalar(v, field)
			if err == nil && len(pl.Key) > limiter.MaxNameLen {
				err = p.errorf(v, field, "longer than %d bytes", limiter.MaxNameLen)
			}
		case "requests_per_unit":
			var u uint64
			u, err = p.uint(v, field, MaxRequestsPerUnit)
			pl.RequestsPerUnit = uint32(u)
		case "unit":
			unitNode = v
			unit, err = p.scalar(v, field)
		case "unit_multiplier":
			multiplierNode = v
			pl.UnitMultiplier, err = p.multiplier(v, field)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	var ok bool
	if pl.Unit, ok = parseUnit(unit); !ok {
		at := n
		if unitNode != nil {
			at = unitNode
		}
		return nil, p.errorf(at, join(path, "unit"), "invalid unit %q (want second, minute, hour, day, week, month or year)", unit)
	}
	if err := p.window(multiplierNode, path, pl.Unit, pl.UnitMultiplier); err != nil {
		return nil, err
	}
	if pl.RequestsPerUnit == 0 {
		return nil, p.errorf(n, join(path, "requests_per_unit"), "missing or 0: the parent must admit something to lend")
	}
	return pl, nil
}

// multiplier parses a unit_multiplier: a whole number from 1, so that a
// window is never empty.
func (p *parser) multiplier(v *yaml.Node, field string) (uint32, error) {
	u, err := p.uint(v, field, MaxUnitMultiplier)
	if err == nil && u == 0 {
		err = p.errorf(v, field, "must be at least 1 (a window of 0 units admits nothing and never ends)")
	}
	return uint32(u), err
}

// window refuses a unit_multiplier (at v, under path) that makes the
// window longer than a check's may be, checks.MaxDuration.
func (p *parser) window(v *yaml.Node, path string, u Unit, count uint32) error {
	if w := Window(u, count); v != nil && w > checks.MaxDuration {
		return p.errorf(v, join(path, "unit_multiplier"), "%d %ss make a window of %v, longer than a year (%v), the longest a check may have",
			count, strings.ToLower(u.String()), w, checks.MaxDuration)
	}
	return nil
}

// defaultParentKey gives l's parent, if it has no key of its own, the
// policy's reference ref as its key, so that every key of the policy
// shares it; a reference longer than a parent's key may be is an error
// at field.
func (p *parser) defaultParentKey(l *Limit, n *yaml.Node, field, ref string) error {
	if l.Parent == nil || l.Parent.Key != "" {
		return nil
	}
	if len(ref) > limiter.MaxNameLen {
		return p.errorf(n, field, "the default, the policy's reference %.40q..., is longer than %d bytes: set a key", ref, limiter.MaxNameLen)
	}
	l.Parent.Key = ref
	return nil
}
