package resp

import (
	"bytes"
	"fmt"
)

// is reports whether arg is the command or option name (ASCII, any case).
func is(arg []byte, name string) bool { return bytes.EqualFold(arg, []byte(name)) }

// unsupported are commands a Redis client may send that this server
// refuses by name, so that the error says why rather than "unknown".
var unsupported = []string{
	"MULTI", "EXEC", "DISCARD", "WATCH", "UNWATCH",
	"SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE", "PUBLISH",
	"MONITOR", "SYNC", "PSYNC", "EVAL", "EVALSHA", "FUNCTION", "AUTH",
}

// command handles one command. CL.THROTTLE joins the batch; any other
// command is answered after the batch, which keeps the answers in order.
func (c *conn) command(args [][]byte) {
	name := args[0]
	if is(name, "CL.THROTTLE") {
		t, err := parseThrottle(args)
		if err != nil {
			c.decide()
			c.w.fail(err.Error())
			return
		}
		c.throttle(t)
		return
	}
	c.decide()
	switch {
	case is(name, "RL.CHECK"):
		c.nativeCheck(args)
	case is(name, "PING"):
		c.ping(args)
	case is(name, "QUIT"):
		c.w.simple("OK")
		c.quit = true
	case is(name, "HELLO"):
		c.hello(args)
	case is(name, "COMMAND"):
		c.commandInfo(args)
	case is(name, "CLIENT"):
		c.client(args)
	case is(name, "SELECT"):
		c.selectDB(args)
	default:
		for _, u := range unsupported {
			if is(name, u) {
				c.w.fail(fmt.Sprintf("ERR %s is not supported: this server only limits rates (CL.THROTTLE)", u))
				return
			}
		}
		c.w.fail(fmt.Sprintf("ERR unknown command '%.64s'", name))
	}
}

func (c *conn) ping(args [][]byte) {
	switch len(args) {
	case 1:
		c.w.simple("PONG")
	case 2:
		c.w.bulk(args[1])
	default:
		c.w.fail(arityError(args[0]).Error())
	}
}

// hello switches the protocol: HELLO [2|3] [SETNAME name]. It answers
// with the server's properties, a map in RESP3. No password is needed or
// taken: AUTH is refused.
func (c *conn) hello(args [][]byte) {
	resp3 := c.w.resp3
	if len(args) > 1 {
		switch string(args[1]) {
		case "2":
			resp3 = false
		case "3":
			resp3 = true
		default:
			c.w.fail(fmt.Sprintf("NOPROTO unsupported protocol version %.16q: this server speaks 2 and 3", args[1]))
			return
		}
	}
	for i := 2; i < len(args); i++ {
		switch {
		case is(args[i], "SETNAME") && i+1 < len(args):
			i++ // names are not kept
		case is(args[i], "AUTH"):
			c.w.fail("ERR AUTH is not supported: this server has no passwords (use TLS client certificates)")
			return
		default:
			c.w.fail(fmt.Sprintf("ERR syntax error in HELLO option '%.64s'", args[i]))
			return
		}
	}
	c.w.resp3 = resp3
	proto := int64(2)
	if resp3 {
		proto = 3
	}
	c.w.mapOf(6)
	c.w.bulk([]byte("server"))
	c.w.bulk([]byte("ringlimit"))
	c.w.bulk([]byte("version"))
	c.w.bulk([]byte("7.0.0")) // the Redis version whose commands clients may assume
	c.w.bulk([]byte("proto"))
	c.w.integer(proto)
	c.w.bulk([]byte("id"))
	c.w.integer(0)
	c.w.bulk([]byte("mode"))
	c.w.bulk([]byte("standalone"))
	c.w.bulk([]byte("role"))
	c.w.bulk([]byte("master"))
}

// commandInfo answers COMMAND, which clients send to learn the server's
// commands: COMMAND COUNT counts CL.THROTTLE, and every other form
// answers an empty list, from which clients assume nothing.
func (c *conn) commandInfo(args [][]byte) {
	if len(args) == 2 && is(args[1], "COUNT") {
		c.w.integer(1)
		return
	}
	c.w.array(0)
}

// client answers CLIENT SETINFO and SETNAME, which clients send as they
// connect, with OK; it keeps nothing.
func (c *conn) client(args [][]byte) {
	switch {
	case len(args) == 4 && is(args[1], "SETINFO"), len(args) == 3 && is(args[1], "SETNAME"):
		c.w.simple("OK")
	case len(args) == 2 && is(args[1], "ID"):
		c.w.integer(0)
	case len(args) < 2:
		c.w.fail(arityError(args[0]).Error())
	default:
		c.w.fail(fmt.Sprintf("ERR unknown subcommand '%.64s' of CLIENT: SETINFO, SETNAME and ID are supported", args[1]))
	}
}

// selectDB accepts SELECT 0, which clients send when configured with a
// database: there is one keyspace.
func (c *conn) selectDB(args [][]byte) {
	switch {
	case len(args) != 2:
		c.w.fail(arityError(args[0]).Error())
	case string(args[1]) == "0":
		c.w.simple("OK")
	default:
		c.w.fail("ERR DB index is out of range: this server has database 0 only")
	}
}
