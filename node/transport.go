package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/internal/tlsfiles"
	"github.com/ringlimit/ringlimit/peer"
)

// transport is how a node's listeners and peer connections are secured,
// from the TLS settings.
type transport struct {
	// peerServer and peerDial secure the peer port and the connections to
	// other nodes' peer ports: mutual TLS with the cluster CA, or plaintext.
	peerServer []grpc.ServerOption
	peerDial   []grpc.DialOption
	// public is the config of the HTTP and gRPC listeners; nil means
	// plaintext.
	public *tls.Config
	// peerTLS reports whether peers authenticate with certificates.
	peerTLS bool
	// peerSrc is the peer port's TLS material, nil without peerTLS.
	peerSrc *tlsfiles.Source
	// memberNames is Config.MemberNames.
	memberNames string
}

// newTransport loads the TLS files named by conf. A file that cannot be
// read fails here, naming its flag; later changes are picked up at the next
// handshake (see tlsfiles).
//
// Every connection to a peer checks, at its handshake, that the
// certificate the peer presents names a member of the ring at the address
// dialled (membersAt), so that an address gossip announced for a member
// reaches that member or nothing.
func newTransport(conf Config, log *slog.Logger, membersAt func(addr string) []string) (transport, error) {
	t := transport{peerDial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, memberNames: conf.MemberNames}
	if err := checkNamePattern(conf.MemberNames); err != nil {
		return transport{}, fmt.Errorf("--member-names: %w", err)
	}
	if conf.MemberNames != "" && !matchName(conf.MemberNames, conf.NodeName) {
		return transport{}, fmt.Errorf("--member-names: this node's name %q does not match %q", conf.NodeName, conf.MemberNames)
	}
	if conf.PeerTLS != (tlsfiles.Files{}) {
		src, err := tlsfiles.Load(conf.PeerTLS, log.With("tls", "peer"))
		if err != nil {
			return transport{}, fmt.Errorf("--peer-tls-*: %w", err)
		}
		t.peerServer = []grpc.ServerOption{grpc.Creds(credentials.NewTLS(src.ServerConfig()))}
		creds := memberCreds{TransportCredentials: credentials.NewTLS(src.ClientConfig("")), membersAt: membersAt}
		t.peerDial = []grpc.DialOption{grpc.WithTransportCredentials(creds)}
		t.peerTLS, t.peerSrc = true, src
	}
	if conf.TLS != (tlsfiles.Files{}) {
		src, err := tlsfiles.Load(conf.TLS, log.With("tls", "public"))
		if err != nil {
			return transport{}, fmt.Errorf("--tls-*: %w", err)
		}
		t.public = src.ServerConfig()
	}
	return t, nil
}

// insecure returns a warning naming what leaves the cluster open to anyone
// on its network, or "" when peers authenticate and gossip is encrypted.
// It names rlnode's flags: it is what an operator reads at start and in
// /readyz.
func (c Config) insecure() string {
	var open []string
	if c.PeerTLS == (tlsfiles.Files{}) {
		open = append(open, "the peer port has no mutual TLS (--peer-tls-cert, --peer-tls-key, --peer-tls-ca)")
	}
	if len(c.GossipKeys) == 0 {
		open = append(open, "gossip is not encrypted (--gossip-key)")
	}
	if len(open) == 0 {
		return ""
	}
	return "warning: " + strings.Join(open, " and ") + ": anyone who can reach those ports can join the cluster, take its counters and change its limits"
}

// grpcServer returns the options of the public gRPC server.
func (t transport) grpcServer() []grpc.ServerOption {
	if t.public == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(t.public))}
}

// admit is cluster.Config.Admit: the member name, whose peer port gossip
// says is at addr, is admitted to the ring once that port has presented a
// certificate from the cluster CA naming it (peer.CertificateNames), and
// only if name matches --member-names. Without peer TLS, only the pattern
// is checked. It returns nil when neither is configured, but then
// admitFunc returns no function at all.
func (t transport) admit(ctx context.Context, name, addr string) error {
	if t.memberNames != "" && !matchName(t.memberNames, name) {
		return fmt.Errorf("name %q does not match --member-names %q", name, t.memberNames)
	}
	if !t.peerTLS {
		return nil
	}
	d := tls.Dialer{Config: t.peerSrc.ClientConfig("")}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("peer port %s: %w", addr, err)
	}
	defer c.Close()
	state := c.(*tls.Conn).ConnectionState()
	if !peer.CertificateNames(state.PeerCertificates[0], name) { // VerifyConnection saw at least one
		return fmt.Errorf("peer port %s: its certificate (%s) does not name %q", addr, describe(state), name)
	}
	return nil
}

// admitFunc returns admit, or nil when there is nothing to check (no peer
// TLS, no --member-names): every member gossip announces is admitted.
func (t transport) admitFunc() func(ctx context.Context, name, addr string) error {
	if !t.peerTLS && t.memberNames == "" {
		return nil
	}
	return t.admit
}

// memberCreds are the peer connections' credentials: TLS with the
// cluster CA, and then the check that the server's certificate names a
// member at the address dialled, which gRPC gives as the authority.
type memberCreds struct {
	credentials.TransportCredentials
	membersAt func(addr string) []string
}

func (c memberCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	tlsInfo, ok := info.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.PeerCertificates) == 0 {
		conn.Close()
		return nil, nil, errors.New("peer handshake: no server certificate")
	}
	names := c.membersAt(authority)
	for _, name := range names {
		if peer.CertificateNames(tlsInfo.State.PeerCertificates[0], name) {
			return conn, info, nil
		}
	}
	conn.Close()
	return nil, nil, fmt.Errorf("peer %s: its certificate (%s) names none of the members at that address %q", authority, describe(tlsInfo.State), names)
}

func (c memberCreds) Clone() credentials.TransportCredentials {
	return memberCreds{TransportCredentials: c.TransportCredentials.Clone(), membersAt: c.membersAt}
}

// describe names the leaf certificate of state, for errors.
func describe(state tls.ConnectionState) string {
	leaf := state.PeerCertificates[0]
	return fmt.Sprintf("CN %q, DNS %q", leaf.Subject.CommonName, leaf.DNSNames)
}

// checkNamePattern checks a --member-names pattern: dot-separated labels,
// each a path.Match pattern ("rlnode-*.rl.ns.svc.cluster.local").
func checkNamePattern(pattern string) error {
	for _, label := range strings.Split(pattern, ".") {
		if _, err := path.Match(label, ""); err != nil {
			return fmt.Errorf("label %q: %w", label, err)
		}
	}
	return nil
}

// matchName reports whether name matches pattern label by label, so that
// a * never reaches across a dot: rlnode-*.rl.ns.svc matches
// rlnode-0.rl.ns.svc, not rlnode-0.evil.rl.ns.svc.
func matchName(pattern, name string) bool {
	pl, nl := strings.Split(pattern, "."), strings.Split(name, ".")
	if len(pl) != len(nl) {
		return false
	}
	for i := range pl {
		if ok, _ := path.Match(pl[i], nl[i]); !ok {
			return false
		}
	}
	return true
}
