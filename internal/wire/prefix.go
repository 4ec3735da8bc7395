package wire

import (
	"iter"

	"google.golang.org/protobuf/encoding/protowire"
)

// Prefix returns the longest prefix of the encoded message msg that holds
// at most n elements of field: decoding it builds no more than n of them,
// however many msg holds, which is how a server bounds a request's
// repeated field before it builds the elements. Malformed input is
// returned whole, for the decoder to refuse.
func Prefix(msg []byte, field protowire.Number, n int) []byte {
	seen := 0
	for f := range Fields(msg) {
		if f.Num == field {
			if seen == n {
				return msg[:f.Off]
			}
			seen++
		}
	}
	return msg
}

// Field is one field of an encoded message: its number and wire type,
// where it starts, and the length of its tag.
type Field struct {
	Num    protowire.Number
	Type   protowire.Type
	Off    int
	TagLen int
}

// Fields yields the fields of the encoded message msg in order. It stops
// at a malformed field.
func Fields(msg []byte) iter.Seq[Field] {
	return func(yield func(Field) bool) {
		for off := 0; off < len(msg); {
			num, typ, tagLen := protowire.ConsumeTag(msg[off:])
			if tagLen < 0 {
				return
			}
			valLen := protowire.ConsumeFieldValue(num, typ, msg[off+tagLen:])
			if valLen < 0 || !yield(Field{num, typ, off, tagLen}) {
				return
			}
			off += tagLen + valLen
		}
	}
}
