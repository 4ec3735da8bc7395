package resp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/api"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/service"
)

// FuzzCommands serves arbitrary input on a connection, decided by a real
// service (RL.CHECK's payloads by its gRPC face): the server never panics nor hangs, and everything it writes
// is well-formed RESP, one reply after another.
func FuzzCommands(f *testing.F) {
	f.Add([]byte("CL.THROTTLE k 1 1 1\r\nPING\r\nHELLO 3\r\nCLIENT SETINFO LIB-NAME x\r\nSELECT 0\r\nCOMMAND DOCS\r\nQUIT\r\n"))
	f.Add(encode("CL.THROTTLE", "k", "15", "30", "60", "0"))
	f.Add([]byte("HELLO 3 SETNAME\r\nHELLO 2 AUTH\r\nCLIENT\r\nPING a b\r\nMULTI\r\n*1\r\n$-5\r\n"))
	hits := int64(1)
	payload, _ := proto.Marshal(&pb.CheckStreamRequest{Id: 1, TimeoutMs: 100, Ring: 9, Requests: []*pb.CheckItem{{Name: "n", Key: "k", Limit: 1, DurationMs: 1000, Hits: &hits}}})
	f.Add(encode("RL.CHECK", string(payload)))
	f.Add(append(encode("RL.CHECK", string(payload[:len(payload)-3])), encode("RL.CHECK", "\x0a\x80")...))
	svc := service.New(service.Config{})
	face := api.New(api.Config{Checker: svc})
	f.Fuzz(func(t *testing.T, in []byte) {
		s := New(Config{Checker: svc, Native: face, Limits: Limits{MaxArgs: 8, MaxBulk: 64, MaxCommand: 256, MaxInline: 256, Buffer: 256}})
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

// FuzzConnEndings drives the connection loop over real loopback TCP (the
// raw read and write path) with a client that sends a prefix of its
// input, up to cut bytes, and then ends its connection as how says:
// 0 resets it (SO_LINGER 0), 1 half-closes it and reads every answer,
// 2 closes it with its answers unread, 3 abandons it while another client
// is served, then closes it. Whatever the input and the ending, the
// server neither panics nor hangs, what it answers a half-closed
// connection is well-formed RESP, and the next client is served.
func FuzzConnEndings(f *testing.F) {
	f.Add([]byte("PING\r\n"), uint16(6), uint8(0))
	f.Add([]byte("*5\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n$2\r\n15\r\n$2\r\n30\r\n$2\r\n60\r\n"), uint16(20), uint8(1))
	f.Add([]byte(strings.Repeat("CL.THROTTLE r 5 10 60\r\n", 300)), uint16(6000), uint8(2))
	f.Add([]byte("CL.THROTTLE k 1 1 1\r\nPING\r\nHELLO 3\r\nCL.THR"), uint16(40), uint8(3))
	f.Add([]byte("*3\r\n$4\r\nPING\r\n"), uint16(9), uint8(1))
	addr := startServer(f, newClock(), Config{Limits: Limits{MaxArgs: 8, MaxBulk: 64, MaxCommand: 256, MaxInline: 256, Buffer: 256}}).addr
	f.Fuzz(func(t *testing.T, in []byte, cut uint16, how uint8) {
		in = in[:min(int(cut), len(in))]
		c := dial(t, addr).(*net.TCPConn)
		c.SetReadBuffer(4 << 10)
		c.SetWriteDeadline(time.Now().Add(time.Second)) // a server that stops reading ends the write: no assertion
		c.Write(in)
		switch how % 4 {
		case 0:
			c.SetLinger(0)
			c.Close()
		case 1:
			c.CloseWrite()
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			out, err := io.ReadAll(c)
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				t.Fatalf("the server did not close a half-closed connection within 10s")
			case err != nil:
				break // a reset (the server closed with input unread): the answers end anywhere
			default:
				br := bufio.NewReader(bytes.NewReader(out))
				for {
					if err := skipReply(br); err == io.EOF {
						break
					} else if err != nil {
						t.Fatalf("reply is not RESP: %v in %q", err, out)
					}
				}
			}
		case 2:
			c.Close()
		}
		probe := dial(t, addr)
		probe.Write([]byte("PING\r\n"))
		got := make([]byte, 7)
		if _, err := io.ReadFull(probe, got); err != nil || string(got) != "+PONG\r\n" {
			t.Fatalf("the next client: PING = %q, %v", got, err)
		}
		probe.Close()
		c.Close()
	})
}
