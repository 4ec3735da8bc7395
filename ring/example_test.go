package ring_test

import (
	"fmt"

	"github.com/ringlimit/ringlimit/ring"
)

func ExampleRing_Owner() {
	r := ring.New(
		ring.Member{Name: "rlnode-0", PeerAddr: "10.0.0.1:8082"},
		ring.Member{Name: "rlnode-1", PeerAddr: "10.0.0.2:8082"},
		ring.Member{Name: "rlnode-2", PeerAddr: "10.0.0.3:8082"},
	)
	if m, ok := r.Owner("user:42"); ok {
		fmt.Println(m.Name, m.PeerAddr) // the same on every node
	}
	_, ok := ring.New().Owner("user:42")
	fmt.Println(ok)
	// Output:
	// rlnode-0 10.0.0.1:8082
	// false
}
