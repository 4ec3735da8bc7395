package cluster

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"testing"
)

// recorder is a slog.Handler that keeps records, enabled from minLevel.
type recorder struct {
	minLevel slog.Level
	records  []slog.Record
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.minLevel }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.records = append(r.records, rec)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func TestLogWriter(t *testing.T) {
	for _, tc := range []struct {
		line  string
		level slog.Level
		msg   string
	}{
		{"[DEBUG] memberlist: Stream connection from=127.0.0.1:1234", slog.LevelDebug, "Stream connection from=127.0.0.1:1234"},
		{"[INFO] memberlist: Suspect a has failed", slog.LevelInfo, "Suspect a has failed"},
		{"[WARN] memberlist: Was able to connect to b", slog.LevelWarn, "Was able to connect to b"},
		{"[ERR] memberlist: Failed to send ping", slog.LevelError, "Failed to send ping"},
		{"[ERR] Failed to shutdown transport: x", slog.LevelError, "Failed to shutdown transport: x"},
		{"no level here", slog.LevelInfo, "no level here"},
		{"[ODD] memberlist: unknown level", slog.LevelInfo, "[ODD] memberlist: unknown level"},
	} {
		t.Run(tc.msg, func(t *testing.T) {
			rec := &recorder{minLevel: slog.LevelDebug}
			// memberlist logs through a *log.Logger with LstdFlags.
			l := log.New(logWriter{log: slog.New(rec)}, "", log.LstdFlags)
			l.Print(tc.line)
			if len(rec.records) != 1 {
				t.Fatalf("got %d records, want 1", len(rec.records))
			}
			if r := rec.records[0]; r.Level != tc.level || r.Message != tc.msg {
				t.Errorf("got %v %q, want %v %q", r.Level, r.Message, tc.level, tc.msg)
			}
		})
	}
}

func TestLogWriterFiltersLevel(t *testing.T) {
	rec := &recorder{minLevel: slog.LevelInfo}
	w := logWriter{log: slog.New(rec)}
	for _, l := range []string{"[DEBUG] memberlist: a", "[INFO] memberlist: b"} {
		if n, err := fmt.Fprintln(w, l); err != nil || n != len(l)+1 {
			t.Errorf("Write = %d, %v; want %d, nil", n, err, len(l)+1)
		}
	}
	if len(rec.records) != 1 || rec.records[0].Message != "b" {
		t.Errorf("records = %v, want only b", rec.records)
	}
}
