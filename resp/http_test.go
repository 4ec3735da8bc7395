package resp

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"time"
)

// TestHTTPIsRefused: an HTTP request, or gRPC's HTTP/2 preface, sent to
// the RESP port is answered at once with an error that names the port,
// and the connection closed, rather than left waiting for a command; a
// form a web page posts here runs none of the commands its body holds.
func TestHTTPIsRefused(t *testing.T) {
	s := startServer(t, newClock(), Config{})
	for name, in := range map[string]string{
		"HTTP": "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 24\r\n\r\n" +
			"CL.THROTTLE k 0 1 3600\r\n",
		"gRPC": "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
	} {
		conn := dial(t, s.addr)
		conn.SetDeadline(time.Now().Add(time.Minute)) // a bound on a hang, not a timing
		go conn.Write([]byte(in))
		got, err := io.ReadAll(bufio.NewReader(conn))
		if err != nil && !isReset(err) {
			t.Fatalf("%s: %v after %q, want the connection closed", name, err, got)
		}
		if want := "-ERR Protocol error: this is the RESP (Redis protocol) port of a ringlimit node, not HTTP: " +
			"HTTP is served on its --http-addr (default :8080), gRPC on its --grpc-addr (default :8081)\r\n"; string(got) != want {
			t.Errorf("%s: answered %q, want %q and the end", name, got, want)
		}
	}
	conn := dial(t, s.addr)
	conn.Write([]byte("CL.THROTTLE k 0 1 3600\r\n"))
	if got := readArray(t, bufio.NewReader(conn)); got[0] != "0" {
		t.Errorf("CL.THROTTLE after the posted form: %v, want admitted (the form's command not run)", got)
	}
}

func TestIsHTTP(t *testing.T) {
	for line, want := range map[string]bool{
		"GET / HTTP/1.1":                        true,
		"POST /v1/check HTTP/1.1\r\n":           true,
		"PRI * HTTP/2.0":                        true,
		"OPTIONS * HTTP/1.0":                    true,
		"CL.THROTTLE k 1 1 1":                   false,
		"PING HTTP/1.1":                         false,
		"get / HTTP/1.1":                        false,
		"SET key HTTP/1.1 EX 1":                 false,
		strings.Repeat("A", 17) + " / HTTP/1.1": false,
	} {
		if got := isHTTP([]byte(line)); got != want {
			t.Errorf("isHTTP(%q) = %v, want %v", line, got, want)
		}
	}
}
