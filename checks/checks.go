// Package checks owns what a check is: the bounds a check must respect,
// its conversion from the wire (a ringlimit.v1 CheckItem) to the store's
// form (a limiter.Request) with the validation that goes with it, the
// intake of counters that come from outside a node (hand-off, replicas,
// snapshots), which must be counters a check could have made, and the one
// mapping from its errors to the codes of gRPC, HTTP and per-item results.
//
// Every package that needs one of these rules imports this one: the
// public faces (api, rls), the node's service, the peer server, GLOBAL
// sync, hand-off, replication and snapshots. It imports only the store's
// types (limiter, algorithms) and the generated messages, so that nothing
// low in the house depends on the service.
package checks

import (
	"errors"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// The bounds a check must respect. They keep one request's cost and one
// counter's memory bounded whatever a client or a peer sends.
//
// The bounds of a limit's name and key are limiter.MaxNameLen and
// limiter.MaxKeyLen: a counter record carries both, and package limiter,
// which this one imports, decodes it, so they live there, once.
const (
	// MaxItems is the most items one request may carry, from a client or
	// forwarded by a peer.
	MaxItems = 1000
	// MaxLimit bounds limit, burst, hits, ceiling and a parent's limit.
	MaxLimit = 1_000_000_000
	// MaxDuration bounds duration_ms and min_interval_ms: a year.
	MaxDuration = 365 * 24 * time.Hour
	// MaxParentKeyLen bounds the bytes of a parent's key. A parent names a
	// pool that many keys share ("all", "tenant:acme"), as a name names a
	// limit, so it has a name's bound rather than a key's: that keeps the
	// longest check within the bodies and messages the API takes.
	MaxParentKeyLen = limiter.MaxNameLen
)

// ErrInvalid is wrapped by every validation error, so that each face maps
// them all to one code (see Code).
var ErrInvalid = errors.New("invalid argument")

// ErrUnavailable reports an item that could not be decided now, for
// example because the node is shutting down or the client has gone.
var ErrUnavailable = errors.New("unavailable")

// ErrTooManyItems reports a request with more than MaxItems items.
var ErrTooManyItems = fmt.Errorf("requests: more than %d items: %w", MaxItems, ErrInvalid)

// FieldError reports an invalid field of a check item, named as on the wire.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap makes every FieldError match ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// AdmitsOne reports whether a check of 1 would be admitted now, by the
// answer to a peek (a check of 0 hits, which charges nothing): its
// verdict, and the whole hits it found remaining. A peek is admitted
// unless it is invalid; a counter spent, or spaced by a minimum interval
// not yet over, has none remaining. The HTTP answer's admits_one and
// rlnode check's PEEK say it.
func AdmitsOne(admitted bool, remaining int64) bool { return admitted && remaining > 0 }
