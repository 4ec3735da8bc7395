package cluster

import (
	"bytes"
	"context"
	"log/slog"
)

// logWriter turns memberlist's log lines into slog records. memberlist
// writes lines like "2026/01/02 15:04:05 [WARN] memberlist: text\n" through
// a *log.Logger; the bracketed level becomes the slog level, and the
// timestamp and "memberlist: " prefix are dropped. A line without a known
// level is logged at Info. logWriter is safe for concurrent use.
type logWriter struct {
	log *slog.Logger
}

// Write logs one line from p. It always reports success, so that logging can
// never fail memberlist.
func (w logWriter) Write(p []byte) (int, error) {
	level, line := parseLevel(trimTime(bytes.TrimSpace(p)))
	ctx := context.Background()
	if !w.log.Enabled(ctx, level) {
		return len(p), nil
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	w.log.Log(ctx, level, string(line))
	return len(p), nil
}

// parseLevel finds the first bracketed level in line and returns it with the
// text after it. Lines without a known level are Info, returned whole.
func parseLevel(line []byte) (slog.Level, []byte) {
	i := bytes.IndexByte(line, '[')
	j := bytes.IndexByte(line, ']')
	if i < 0 || j < i {
		return slog.LevelInfo, line
	}
	var level slog.Level
	switch string(line[i+1 : j]) {
	case "DEBUG", "TRACE":
		level = slog.LevelDebug
	case "INFO":
		level = slog.LevelInfo
	case "WARN":
		level = slog.LevelWarn
	case "ERR", "ERROR":
		level = slog.LevelError
	default:
		return slog.LevelInfo, line
	}
	return level, bytes.TrimSpace(line[j+1:])
}

// trimTime drops the "2006/01/02 15:04:05 " that log.LstdFlags adds.
func trimTime(line []byte) []byte {
	const layout = "2006/01/02 15:04:05 "
	if len(line) < len(layout) {
		return line
	}
	for i, c := range []byte(layout) {
		if c >= '0' && c <= '9' {
			if line[i] < '0' || line[i] > '9' {
				return line
			}
		} else if line[i] != c {
			return line
		}
	}
	return line[len(layout):]
}
