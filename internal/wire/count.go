package wire

import (
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// MaxDepth bounds how deep CountMessages follows nested messages;
// ringlimit's and Envoy's requests nest a few levels.
const MaxDepth = 32

// CountMessages counts the messages that decoding the encoded message msg,
// of type d, would build, nested ones included and msg itself not, without
// building any, and reports false as soon as there are more than max or
// they nest deeper than MaxDepth. A small message costs some tens of bytes
// decoded however few it takes on the wire (an empty one two), so a
// server counts before it decodes, and refuses a message of many empty
// ones at the cost of a walk over its bytes. The count is an upper bound:
// a message type with no repeated message field below it (a check item
// and its parent) counts as the most it can build, without a walk over
// its bytes, however often its fields occur. Malformed input is counted as
// far as it parses, and left for the decoder to refuse.
func CountMessages(msg []byte, d protoreflect.MessageDescriptor, max int) (int, bool) {
	budget := max
	if !countMessages(msg, planOf(d), &budget, 0) {
		return 0, false
	}
	return max - budget, true
}

func countMessages(msg []byte, p *plan, budget *int, depth int) bool {
	if depth > MaxDepth {
		return false
	}
	for f := range Fields(msg) {
		fp, ok := p.fields[f.Num]
		if !ok || f.Type != protowire.BytesType {
			continue
		}
		if *budget -= 1 + fp.fixed; *budget < 0 {
			return false
		}
		if fp.walk != nil {
			val, _ := protowire.ConsumeBytes(msg[f.Off+f.TagLen:])
			if !countMessages(val, fp.walk, budget, depth+1) {
				return false
			}
		}
	}
	return true
}

// plan is how CountMessages counts a message type: for each of its
// message fields, either the most messages an element builds below it
// (fixed), or the plan to walk it with.
type plan struct {
	fields map[protowire.Number]fieldPlan
}

type fieldPlan struct {
	fixed int   // messages built below each element, if walk is nil
	walk  *plan // the element's plan, for a type that must be walked
}

// plans caches planOf: protoreflect.FullName -> *plan. A plan is stored
// once complete and never changed after; plansMu serializes building.
var (
	plans   sync.Map
	plansMu sync.Mutex
)

// planOf returns d's plan.
func planOf(d protoreflect.MessageDescriptor) *plan {
	if p, ok := plans.Load(d.FullName()); ok {
		return p.(*plan)
	}
	plansMu.Lock()
	defer plansMu.Unlock()
	building := map[protoreflect.FullName]*plan{}
	p := build(d, building)
	for name, b := range building {
		plans.LoadOrStore(name, b)
	}
	return p
}

// build makes d's plan, and those of the types it walks into, in
// building (so that a type that holds itself is planned once).
func build(d protoreflect.MessageDescriptor, building map[protoreflect.FullName]*plan) *plan {
	if p, ok := plans.Load(d.FullName()); ok {
		return p.(*plan)
	}
	if p, ok := building[d.FullName()]; ok {
		return p
	}
	p := &plan{fields: map[protowire.Number]fieldPlan{}}
	building[d.FullName()] = p
	for i := range d.Fields().Len() {
		fd := d.Fields().Get(i)
		if fd.Message() == nil {
			continue
		}
		if n, ok := fixed(fd.Message(), 0); ok && !fd.IsMap() {
			p.fields[fd.Number()] = fieldPlan{fixed: n}
		} else {
			p.fields[fd.Number()] = fieldPlan{walk: build(fd.Message(), building)}
		}
	}
	return p
}

// fixed returns the most messages a message of type d builds below
// itself, if that is bounded whatever its encoding: no repeated or map
// field of messages below it, and no recursion.
func fixed(d protoreflect.MessageDescriptor, depth int) (int, bool) {
	if depth > MaxDepth {
		return 0, false
	}
	n := 0
	for i := range d.Fields().Len() {
		fd := d.Fields().Get(i)
		if fd.Message() == nil {
			continue
		}
		if fd.IsList() || fd.IsMap() {
			return 0, false
		}
		m, ok := fixed(fd.Message(), depth+1)
		if !ok {
			return 0, false
		}
		n += 1 + m
	}
	return n, true
}
