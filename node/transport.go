package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/cluster"
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

// openMembers returns the warning a node logs at start when peer TLS
// admits members by certificate but no --member-names pattern bounds
// their names, or "" (see docs/security.md, "Who is a member").
func (c Config) openMembers() string {
	if c.PeerTLS == (tlsfiles.Files{}) || c.MemberNames != "" {
		return ""
	}
	return "warning: --member-names is not set: anyone holding the gossip key and any certificate the cluster CA issued " +
		"(for another service, an ingress) can join the ring under the name that certificate carries, own its share of the keys " +
		"and be handed their counters; set --member-names to the pattern of this cluster's node names (the chart sets it)"
}

// ownName checks that this node's current peer certificate names it, as
// the other members' admission checks will require (peer.CertificateNames);
// nil without peer TLS. It reads the files as a handshake would, so a
// rotated certificate is what it checks.
func (t transport) ownName(name string) error {
	if !t.peerTLS {
		return nil
	}
	conf, err := t.peerSrc.ServerConfig().GetConfigForClient(&tls.ClientHelloInfo{})
	if err != nil {
		return fmt.Errorf("this node's peer certificate: %w", err)
	}
	leaf := conf.Certificates[0].Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(conf.Certificates[0].Certificate[0]); err != nil {
			return fmt.Errorf("this node's peer certificate: %w", err)
		}
	}
	if !peer.CertificateNames(leaf, name) {
		return fmt.Errorf("this node's peer certificate (CN %q, DNS %q) does not name it (--node-name %q), so the other members will not admit it to their rings: "+
			"give --peer-tls-cert a certificate from the cluster CA valid for %q", leaf.Subject.CommonName, leaf.DNSNames, name, name)
	}
	return nil
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
//
// A verdict on the member's identity (the pattern, a certificate that
// does not name it or does not chain to the cluster CA, a port that does
// not speak TLS, a handshake the member refused for this node's own
// certificate) is marked cluster.Refused; any other failure (no answer, a
// timeout, a reset, no free slot) is not, and is retried soon.
func (t transport) admit(ctx context.Context, name, addr string) error {
	if t.memberNames != "" && !matchName(t.memberNames, name) {
		return cluster.Refused(fmt.Errorf("name %q does not match --member-names %q", name, t.memberNames))
	}
	if !t.peerTLS {
		return nil
	}
	d := tls.Dialer{Config: t.peerSrc.ClientConfig("")}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		err = fmt.Errorf("peer port %s: %w", addr, err)
		if identityError(err) {
			return cluster.Refused(err)
		}
		return err
	}
	defer c.Close()
	state := c.(*tls.Conn).ConnectionState()
	if !peer.CertificateNames(state.PeerCertificates[0], name) { // VerifyConnection saw at least one
		return cluster.Refused(fmt.Errorf("peer port %s: its certificate (%s) does not name %q", addr, describe(state), name))
	}
	return nil
}

// identityError reports whether err, from a TLS dial, is the handshake's
// verdict on a certificate (either side's) or on a port that does not
// speak TLS, rather than a connection that did not complete.
func identityError(err error) bool {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var hostname x509.HostnameError
	var record tls.RecordHeaderError
	var alert tls.AlertError
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &invalid) ||
		errors.As(err, &hostname) || errors.As(err, &record) || errors.As(err, &alert)
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
