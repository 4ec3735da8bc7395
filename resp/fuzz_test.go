package resp

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"testing"

	"github.com/ringlimit/ringlimit/service"
)

// FuzzCommands serves arbitrary input on a connection, decided by a real
// service: the server never panics nor hangs, and everything it writes
// is well-formed RESP, one reply after another.
func FuzzCommands(f *testing.F) {
	f.Add([]byte("CL.THROTTLE k 1 1 1\r\nPING\r\nHELLO 3\r\nCLIENT SETINFO LIB-NAME x\r\nSELECT 0\r\nCOMMAND DOCS\r\nQUIT\r\n"))
	f.Add(encode("CL.THROTTLE", "k", "15", "30", "60", "0"))
	f.Add([]byte("HELLO 3 SETNAME\r\nHELLO 2 AUTH\r\nCLIENT\r\nPING a b\r\nMULTI\r\n*1\r\n$-5\r\n"))
	svc := service.New(service.Config{})
	f.Fuzz(func(t *testing.T, in []byte) {
		s := New(Config{Checker: svc, Limits: Limits{MaxArgs: 8, MaxBulk: 64, MaxCommand: 256, MaxInline: 256, Buffer: 256}})
		client, server := net.Pipe()
		c := &conn{s: s, raw: server, nc: server}
		done := make(chan struct{})
		go func() { defer close(done); c.serve(); server.Close() }()
		go func() { client.Write(in); client.Close() }()
		out, _ := io.ReadAll(client)
		<-done
		br := bufio.NewReader(bytes.NewReader(out))
		for {
			if err := skipReply(br); err == io.EOF {
				return
			} else if err != nil {
				t.Fatalf("reply is not RESP: %v in %q", err, out)
			}
		}
	})
}

// skipReply reads one reply, whatever its kind.
func skipReply(br *bufio.Reader) error {
	line, err := br.ReadString('\n')
	if err != nil {
		if err == io.EOF && line == "" {
			return io.EOF
		}
		return err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return io.ErrUnexpectedEOF
	}
	n := 0
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+', '-', ':':
		return nil
	case '$':
		for _, c := range body {
			n = n*10 + int(c-'0')
		}
		_, err := br.Discard(n + 2)
		return err
	case '*', '%':
		for _, c := range body {
			n = n*10 + int(c-'0')
		}
		if line[0] == '%' {
			n *= 2
		}
		for range n {
			if err := skipReply(br); err != nil {
				return err
			}
		}
		return nil
	}
	return io.ErrNoProgress
}
