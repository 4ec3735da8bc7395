// Package tlsfiles serves TLS material from PEM files and takes up new
// files without a restart: a Source looks at its files on every
// handshake, one stat each, and reads them again when one changed (a
// Secret rotated, a symlink flipped), with no goroutine to own. A change
// that does not load (a certificate whose key is not rewritten yet) is
// logged and the previous material stays in use; only Load fails on bad
// files, so a node never starts without the TLS material it was told to
// use. See docs/design-ports.md, "TLS files are read again when they
// change".
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// Files names the PEM files of one side of a TLS connection.
type Files struct {
	// Cert and Key are this side's certificate chain and private key. Both
	// or neither: a client without them presents no certificate.
	Cert, Key string
	// CA is the bundle the other side's certificate must chain to. Empty
	// means the system roots, when verifying a server; a server without a
	// CA asks for no client certificate.
	CA string
}

// Source is the TLS material read from Files, read again when the files
// change. It is safe for concurrent use.
type Source struct {
	files Files
	log   *slog.Logger

	mu     sync.Mutex // serializes refresh
	stamps []stamp    // of files.paths(), as of the last load attempt
	cur    material   // guarded by mu
}

// material is one consistent load of the files.
type material struct {
	cert *tls.Certificate // nil without Cert and Key
	pool *x509.CertPool   // nil without CA
}

// stamp identifies a version of a file well enough to notice a rewrite: a
// symlink flip changes the file (inode), an edit in place its size or
// modification time.
type stamp struct {
	info os.FileInfo
	err  error
}

func (a stamp) same(b stamp) bool {
	if a.err != nil || b.err != nil {
		return (a.err == nil) == (b.err == nil)
	}
	return os.SameFile(a.info, b.info) && a.info.Size() == b.info.Size() && a.info.ModTime().Equal(b.info.ModTime())
}

// Load reads files and returns a Source of them. It fails, naming the file,
// if any cannot be read or parsed, if only one of Cert and Key is given, or
// if nothing is given at all. log receives reload failures; nil discards
// them.
func Load(files Files, log *slog.Logger) (*Source, error) {
	if (files.Cert == "") != (files.Key == "") {
		return nil, errors.New("a certificate and its key go together: give both or neither")
	}
	if files.Cert == "" && files.CA == "" {
		return nil, errors.New("no files")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Source{files: files, log: log}
	s.stamps = s.stat()
	m, err := files.load()
	if err != nil {
		return nil, err
	}
	s.cur = m
	return s, nil
}

// paths lists the files in a fixed order.
func (f Files) paths() []string {
	var out []string
	for _, p := range []string{f.Cert, f.Key, f.CA} {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

func (f Files) load() (material, error) {
	var m material
	if f.Cert != "" {
		c, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return material{}, fmt.Errorf("certificate %s and key %s: %w", f.Cert, f.Key, err)
		}
		m.cert = &c
	}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return material{}, fmt.Errorf("CA: %w", err)
		}
		m.pool = x509.NewCertPool()
		if !m.pool.AppendCertsFromPEM(pem) {
			return material{}, fmt.Errorf("CA %s: no PEM certificate in it", f.CA)
		}
	}
	return m, nil
}

func (s *Source) stat() []stamp {
	paths := s.files.paths()
	out := make([]stamp, len(paths))
	for i, p := range paths {
		out[i].info, out[i].err = os.Stat(p)
	}
	return out
}

// current returns the material, read again first if a file changed.
func (s *Source) current() material {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.stat()
	changed := false
	for i := range now {
		changed = changed || !now[i].same(s.stamps[i])
	}
	if !changed {
		return s.cur
	}
	// Remember these versions even if they fail to load, so that a broken
	// file is reported once, not on every handshake; the next change is
	// tried again.
	s.stamps = now
	m, err := s.files.load()
	if err != nil {
		s.log.Warn("TLS files changed but do not load; the previous ones stay in use", "err", err)
		return s.cur
	}
	s.cur = m
	s.log.Info("TLS files reloaded", "cert", s.files.Cert, "ca", s.files.CA)
	return m
}

// ServerConfig returns the config of a listener that presents the current
// certificate. With a CA, clients must present a certificate that chains to
// it (tls.RequireAndVerifyClientCert); without one, none is asked for.
// Source needs Cert and Key for this.
func (s *Source) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.current()
			if m.cert == nil {
				return nil, errors.New("no server certificate configured")
			}
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*m.cert},
				// The config returned here replaces the listener's for the
				// handshake, ALPN included: offer what both our servers
				// speak (gRPC needs h2).
				NextProtos: []string{"h2", "http/1.1"},
			}
			if m.pool != nil {
				c.ClientCAs = m.pool
				c.ClientAuth = tls.RequireAndVerifyClientCert
			}
			return c, nil
		},
	}
}

// ClientConfig returns the config of a connection that presents the current
// certificate, if any, and verifies the server's chain against the current
// CA (the system roots without one). With name not empty, the server's
// certificate must also be valid for name as a host name. With name empty
// only the chain is checked: peers dial each other by IP address from
// gossip, and a cluster CA issues only cluster certificates.
func (s *Source) ClientConfig(name string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: name,
		// Verified in VerifyConnection instead, against the CA as it is at
		// this handshake.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if m := s.current(); m.cert != nil {
				return m.cert, nil
			}
			return &tls.Certificate{}, nil // none: the server decides
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verify(cs.PeerCertificates, s.current().pool, name)
		},
	}
}

// verify checks that a server's certs (leaf first) chain to roots (the
// system roots if nil), and that the leaf is valid for name unless name is
// empty.
func verify(certs []*x509.Certificate, roots *x509.CertPool, name string) error {
	if len(certs) == 0 {
		return errors.New("no certificate from the server")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		DNSName:       name,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	return err
}
