package api

import (
	"testing"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestAlgorithmEnumMatches keeps the ringlimit.v1 Algorithm enum and
// algorithms.Kind, the enum the code uses, identical in values and names:
// the service converts between them with a cast, and the encoded states
// carry the Kind value as their tag.
func TestAlgorithmEnumMatches(t *testing.T) {
	values := pb.Algorithm(0).Descriptor().Values()
	if values.Len() != int(algorithms.NumKinds) {
		t.Errorf("ringlimit.v1 Algorithm has %d values, algorithms.Kind %d", values.Len(), algorithms.NumKinds)
	}
	for i := range values.Len() {
		v := values.Get(i)
		k := algorithms.Kind(v.Number())
		if v.Number() < 0 || !k.Valid() || k.String() != string(v.Name()) {
			t.Errorf("ringlimit.v1 Algorithm %s = %d, but algorithms.Kind(%d) is %s", v.Name(), v.Number(), v.Number(), k)
		}
	}
}
