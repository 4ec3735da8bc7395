package client

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/internal/nodeport"
)

// ErrWrongPort is wrapped by the error of a call to an address that
// serves another of a node's ports than gRPC: its HTTP port (--http-addr)
// or its RESP port (--resp-addr), given by mistake. The error says which
// port the address is, where gRPC would only say "http2: frame too
// large" or "error reading server preface".
var ErrWrongPort = nodeport.ErrWrongPort

// probeEvery is the least time between two probes of one node's address.
const probeEvery = 5 * time.Second

// portProbe tells, after a call to a node failed Unavailable, whether
// the node's address serves another protocol than gRPC. It probes in
// plaintext (the client's TLS is inside its dial options), so over TLS
// it finds only a port that answers in plaintext. It is safe for
// concurrent use: one caller probes at a time, at most once per
// probeEvery, and the others take the last finding.
type portProbe struct {
	addr    string
	probing sync.Mutex
	next    time.Time                // no probe before; guarded by probing
	found   atomic.Pointer[errorBox] // the last finding: a *nodeport.Error, or nil
}

type errorBox struct{ err error }

// explain returns err, or, when err is a call's Unavailable and the
// address serves another port, an error that says which (wrapping
// ErrWrongPort).
func (p *portProbe) explain(err error) error {
	if status.Code(err) != codes.Unavailable {
		return err
	}
	if p.probing.TryLock() {
		if now := time.Now(); now.After(p.next) {
			p.next = now.Add(probeEvery)
			found := nodeport.Check(context.Background(), p.addr, nodeport.GRPC, nil, "the Go client")
			p.found.Store(&errorBox{found})
		}
		p.probing.Unlock()
	}
	if b := p.found.Load(); b != nil && b.err != nil {
		return b.err
	}
	return err
}
