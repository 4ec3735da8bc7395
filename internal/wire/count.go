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
// ones at the cost of a walk over its bytes. Malformed input is counted as
// far as it parses, and left for the decoder to refuse.
func CountMessages(msg []byte, d protoreflect.MessageDescriptor, max int) (int, bool) {
	budget := max
	if !countMessages(msg, d, &budget, 0) {
		return 0, false
	}
	return max - budget, true
}

func countMessages(msg []byte, d protoreflect.MessageDescriptor, budget *int, depth int) bool {
	if depth > MaxDepth {
		return false
	}
	if leaf(d) { // a check item, say: nothing to count inside
		return true
	}
	fields := d.Fields()
	for f := range Fields(msg) {
		if fd := fields.ByNumber(f.Num); fd != nil && fd.Message() != nil && f.Type == protowire.BytesType {
			if *budget--; *budget < 0 {
				return false
			}
			val, _ := protowire.ConsumeBytes(msg[f.Off+f.TagLen:])
			if !countMessages(val, fd.Message(), budget, depth+1) {
				return false
			}
		}
	}
	return true
}

// leaves caches leaf: protoreflect.FullName -> bool.
var leaves sync.Map

// leaf reports whether messages of type d hold no messages.
func leaf(d protoreflect.MessageDescriptor) bool {
	if l, ok := leaves.Load(d.FullName()); ok {
		return l.(bool)
	}
	l := true
	for i := range d.Fields().Len() {
		l = l && d.Fields().Get(i).Message() == nil
	}
	leaves.Store(d.FullName(), l)
	return l
}
