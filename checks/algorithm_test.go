package checks

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestAlgorithmEnumMatches keeps the ringlimit.v1 Algorithm enum and
// algorithms.Kind, the enum the code uses, identical in values and names
// for the six public algorithms: Request converts between them with a
// cast, and the encoded states carry the Kind value as their tag. The
// enum reserves the value of KindSpacing, which is a kind of counter but
// no check's algorithm, so that no public algorithm ever takes it.
func TestAlgorithmEnumMatches(t *testing.T) {
	desc := pb.Algorithm(0).Descriptor()
	values := desc.Values()
	if values.Len() != int(algorithms.NumPublic) {
		t.Errorf("ringlimit.v1 Algorithm has %d values, algorithms.Kind %d public ones", values.Len(), algorithms.NumPublic)
	}
	for i := range values.Len() {
		v := values.Get(i)
		k := algorithms.Kind(v.Number())
		if v.Number() < 0 || !k.Public() || k.String() != string(v.Name()) {
			t.Errorf("ringlimit.v1 Algorithm %s = %d, but algorithms.Kind(%d) is %s", v.Name(), v.Number(), v.Number(), k)
		}
	}
	for k := algorithms.NumPublic; k < algorithms.NumKinds; k++ {
		if !desc.ReservedRanges().Has(protoreflect.EnumNumber(k)) || !desc.ReservedNames().Has(protoreflect.Name(k.String())) {
			t.Errorf("ringlimit.v1 Algorithm does not reserve %s = %d", k, k)
		}
	}
}
