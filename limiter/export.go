package limiter

import (
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ringlimit/ringlimit/algorithms"
)

// Counters yields a copy of every counter the store holds, without taking
// any: it copies one shard's counters under that shard's lock, then yields
// them with no lock held, so a slow consumer delays no check. Counters
// changed or added after their shard was copied may be missed or seen as
// they were; it suits snapshots, which run again.
func (s *Store) Counters() iter.Seq[Counter] {
	return s.walk(func(a Algorithm, t counters, out []Counter) []Counter {
		return t.snapshot(a, out)
	}, false, nil)
}

// Charged is Counters without the counters back to full at now: those
// the store would drop as idle (see makeRoom), which carry no
// information. Snapshots write these, so that a counter full again is not
// kept past its use. It is Counters made for walking a million counters
// while checks go on: under each shard's lock it reads the entries in
// memory order rather than by recency, and encodes their states into one
// buffer it reuses, so the lock is held for as short a time as it can
// be. So the State of a counter it yields is valid only until the next
// one is yielded: copy it to keep it.
func (s *Store) Charged(now time.Time) iter.Seq[Counter] {
	ns := now.UnixNano()
	return func(yield func(Counter) bool) {
		var states []byte
		s.walk(func(a Algorithm, t counters, out []Counter) []Counter {
			if len(out) == 0 { // a new shard: its states go where the last shard's were
				states = states[:0]
			}
			out, states = t.charged(a, ns, out, states)
			return out
		}, false, nil)(yield)
	}
}

// Changed yields a copy of every counter charged or merged since the last
// Changed walk (or MarkChanged), and clears that mark, shard by shard as
// Counters does: it is how replication sends only what changed. A counter
// changed again after its shard was walked is marked again, and yielded by
// the next walk. A consumer that cannot deliver what it was yielded gives
// it back with Restore, which marks it again. If the consumer stops early,
// the counters of the current shard not yet yielded are marked again.
func (s *Store) Changed() iter.Seq[Counter] {
	return s.walk(func(a Algorithm, t counters, out []Counter) []Counter {
		return t.changed(a, out)
	}, false, s.Restore)
}

// MarkChanged marks every counter whose key match accepts as changed, so
// that the next Changed walk yields it: replication does this when the
// ring changes, for the keys whose would-be heir changed. match is called
// once per counter, under its shard's lock.
func (s *Store) MarkChanged(match func(key string) bool) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, t := range sh.tables {
			t.markChanged(match)
		}
		sh.mu.Unlock()
	}
}

// Extract yields, and removes from the store, every counter whose key move
// accepts, for hand-off to their new owner. It walks the store once,
// calling move once per counter: it takes one shard's counters under its
// lock and yields them with no lock held. If the consumer stops early, the
// counters taken from the current shard but not yet yielded are put back;
// what was yielded is the consumer's (put it back with Restore if it
// cannot be delivered).
func (s *Store) Extract(move func(key string) bool) iter.Seq[Counter] {
	return s.walk(func(a Algorithm, t counters, out []Counter) []Counter {
		n := len(out)
		out = t.extract(a, move, out)
		s.held.Add(-int64(len(out) - n))
		return out
	}, true, s.Restore)
}

// walk yields, shard by shard, the counters collect appends for each table
// under the shard's lock, with their reservations (moved out of the store
// with move), yielding them with no lock held. If the consumer stops
// early, stopped (if not nil) gets the shard's counters not yielded.
func (s *Store) walk(collect func(a Algorithm, t counters, out []Counter) []Counter, move bool, stopped func([]Counter)) iter.Seq[Counter] {
	return func(yield func(Counter) bool) {
		var buf []Counter
		for i := range s.shards {
			sh := &s.shards[i]
			sh.mu.Lock()
			buf = buf[:0]
			for a, t := range sh.tables {
				buf = collect(Algorithm(a), t, buf)
			}
			s.attachReservations(i, buf, move)
			sh.mu.Unlock()
			for j, c := range buf {
				if !yield(c) {
					if stopped != nil {
						stopped(buf[j+1:])
					}
					return
				}
			}
		}
	}
}

// Merge takes c, which came from another node, into the store, unless it
// is invalid, in which case it changes nothing: its record, its limit, its
// Last (not after now+skew) and its state (possible for its algorithm
// under c.Limit at now, allowing skew) are checked first, and a counter
// that fails is refused with an error wrapping ErrBadCounter or
// ErrUnknownVersion. A new counter is inserted, making room as a check's
// would (or refused with ErrFull); an existing one keeps the more charged
// of the two states, so that merging never refills a counter. The
// reservations c carries are taken as a peer's word (see travel.go).
func (s *Store) Merge(c Counter, now time.Time, skew time.Duration) error {
	return s.mergeUnder(c, c.Key, now, skew, false)
}

// MergeUnder is Merge for a store that keeps counters under keys of its
// own (replicas, under their sender's name: see package replica): c is
// checked under its own key, then kept under key. Its reservations give
// back whatever they reserved: a replica is its sender's own counter, and
// becomes a counter of the node's only when the sender owned its key.
func (s *Store) MergeUnder(c Counter, key string, now time.Time, skew time.Duration) error {
	return s.mergeUnder(c, key, now, skew, true)
}

func (s *Store) mergeUnder(c Counter, key string, now time.Time, skew time.Duration, vouched bool) error {
	if err := c.validate(now, skew); err != nil {
		return err
	}
	if err := s.shards[0].tables[c.Algorithm].validate(&c, now, skew); err != nil {
		return err
	}
	c.Key = key
	mode := mergeMeet
	if vouched {
		mode = mergeCopy
	}
	return s.mergeLocked(&c, now.UnixNano(), true, mode)
}

// mergeLocked merges c into its shard under the shard's lock, with its
// reservations (see travel.go), at now (Unix ns), making room for it with
// room, and its stand-in hits as mode says (see table.merge). In
// mergeMeet, c is a peer's word about a counter: its reservations give
// back only as keepReservations allows.
func (s *Store) mergeLocked(c *Counter, now int64, room bool, mode mergeMode) error {
	vouched := mode != mergeMeet
	i := s.shardIndex(c.Key)
	sh := &s.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s.settleArrived(int(i), c)
	heldBefore := len(c.Reservations) > 0 && sh.holds(Request{Name: c.Name, Key: c.Key, Algorithm: c.Algorithm, Role: c.Role})
	if err := sh.tables[c.Algorithm].merge(s, sh, c, now, room, mode); err != nil {
		return err
	}
	s.keepReservations(int(i), c, now, vouched || !heldBefore, vouched)
	return nil
}

// Restore puts back counters that this store yielded (from Extract) but
// that could not be delivered, merging each with any counter made for the
// same key since (which, if a stand-in's, adds its hits: see mergeBack).
// Unlike Merge, it trusts them to be possible: they are this store's own.
// (One whose algorithm or state does not even decode, which Extract never
// yields, is skipped.) Nor does it make room for them, as they are debts
// it would otherwise forgive: the store may then exceed its bounds by the
// counters that were out for delivery.
func (s *Store) Restore(cs []Counter) { s.restore(cs, mergeBack) }

// Remark is Restore for copies of counters the store still holds (from
// Changed) that could not be delivered: merging them changes nothing but
// marks them changed again, so that the next Changed walk yields them.
func (s *Store) Remark(cs []Counter) { s.restore(cs, mergeCopy) }

// Promote is Restore for copies of another node's counters (replicas,
// validated when they arrived) that this store takes as its own, its key's
// owner being unreachable or gone. A copy may descend from the counter
// here (one that went to its sender and was replicated back, stand-in hits
// and all), so it merges as a copy does (mergeCopy): the more charged
// state, nothing added. (A stand-in's hits made here before its replica
// was promoted are then not added to it: the heir promotes at its first
// decision for the key, before it has made any.)
func (s *Store) Promote(cs []Counter) { s.restore(cs, mergeCopy) }

func (s *Store) restore(cs []Counter, mode mergeMode) {
	for i := range cs {
		c := &cs[i]
		if !c.Algorithm.Valid() {
			continue
		}
		_ = s.mergeLocked(c, c.Last, false, mode)
	}
}

// stateError wraps an error decoding or validating a counter's state: an
// unknown state version stays ErrUnknownVersion, anything else is a bad
// counter.
func stateError(err error) error {
	if errors.Is(err, ErrUnknownVersion) {
		return fmt.Errorf("counter state: %w", err)
	}
	return fmt.Errorf("counter state: %w: %w", ErrBadCounter, err)
}

// counter returns the counter at idx as a Counter of algorithm a. It fails
// only for a state its codec refuses to encode (a sliding log of more than
// algorithms.MaxSlidingLogLimit entries).
func (t *table[S, P]) counter(a Algorithm, idx int32) (Counter, error) {
	e := &t.entries[idx]
	state, err := P(&e.state).AppendBinary(nil)
	role, name, key := splitID(e.id)
	return Counter{Name: name, Key: key, Algorithm: a, Role: role, Limit: t.limit(e), Last: e.last, State: state,
		StandInHits: t.standIns[idx]}, err
}

// charged appends to out the counters not back to full at now (Unix ns),
// those dropIdle would keep, in the order of t.entries, their states
// encoded one after another into states.
func (t *table[S, P]) charged(a Algorithm, now int64, out []Counter, states []byte) ([]Counter, []byte) {
	for i := range t.entries {
		idx := int32(i)
		e := &t.entries[idx]
		if !e.inUse() || t.fullAt(idx) <= now {
			continue
		}
		start := len(states)
		var err error
		if states, err = P(&e.state).AppendBinary(states); err != nil {
			states = states[:start]
			continue
		}
		role, name, key := splitID(e.id)
		out = append(out, Counter{Name: name, Key: key, Algorithm: a, Role: role, Limit: t.limit(e), Last: e.last,
			State: states[start:len(states):len(states)], StandInHits: t.standIns[idx]})
	}
	return out, states
}

func (t *table[S, P]) snapshot(a Algorithm, out []Counter) []Counter {
	for idx := t.head; idx >= 0; idx = t.entries[idx].next {
		if c, err := t.counter(a, idx); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// changed appends to out the counters marked changed, and clears their
// marks. A counter that cannot be encoded is skipped, and stays marked.
func (t *table[S, P]) changed(a Algorithm, out []Counter) []Counter {
	for idx := t.head; idx >= 0; idx = t.entries[idx].next {
		if e := &t.entries[idx]; e.changed {
			if c, err := t.counter(a, idx); err == nil {
				out = append(out, c)
				e.changed = false
			}
		}
	}
	return out
}

func (t *table[S, P]) markChanged(match func(key string) bool) {
	for idx := t.head; idx >= 0; idx = t.entries[idx].next {
		e := &t.entries[idx]
		if _, _, key := splitID(e.id); match(key) {
			e.changed = true
		}
	}
}

// extract appends to out, and removes, the counters whose key move
// accepts. A counter that cannot be encoded stays.
func (t *table[S, P]) extract(a Algorithm, move func(key string) bool, out []Counter) []Counter {
	for idx := t.head; idx >= 0; {
		e := &t.entries[idx]
		next := e.next
		if _, _, key := splitID(e.id); move(key) {
			if c, err := t.counter(a, idx); err == nil {
				out = append(out, c)
				t.remove(idx, fold(xxhash.Sum64String(e.id)))
			}
		}
		idx = next
	}
	return out
}

// takeOut removes and returns the counter whose id is id, if it is here
// and encodes.
func (t *table[S, P]) takeOut(a Algorithm, id []byte, hash uint32) (Counter, bool) {
	idx := t.find(id, hash)
	if idx < 0 {
		return Counter{}, false
	}
	c, err := t.counter(a, idx)
	if err != nil {
		return Counter{}, false
	}
	t.remove(idx, hash)
	return c, true
}

// validate decodes c's state and checks it is possible under c.Limit.
func (t *table[S, P]) validate(c *Counter, now time.Time, skew time.Duration) error {
	var s S
	if err := P(&s).UnmarshalBinary(c.State); err != nil {
		return stateError(err)
	}
	if err := P(&s).Validate(now, c.Limit, skew); err != nil {
		return stateError(err)
	}
	return nil
}

// How a merge treats the hits stand-ins charged (Counter.StandInHits).
type mergeMode uint8

const (
	// mergeMeet is a counter from another node (hand-off, snapshots)
	// meeting this store's: hits a stand-in charged on either side are
	// added to the other's state (see table.merge).
	mergeMeet mergeMode = iota
	// mergeCopy is a copy of a counter (a replica from its sender, or one
	// this store promotes): it may descend from the counter here, stand-in
	// hits and all (a counter that went to another node and was replicated
	// back), so nothing is added: the more charged state and the larger
	// count of stand-in hits are kept.
	mergeCopy
	// mergeBack is a counter this store yielded (Extract) coming back
	// beside one it made meanwhile: if that one was a stand-in's (made
	// while the key's counter was away), its hits are added to the state
	// that came back, and are no longer counted apart if that was the
	// key's own counter (it counted no stand-in hits).
	mergeBack
)

// merge folds c's state into its counter in t, part of shard sh of store,
// inserting it if new: the counter keeps the more charged state, the later
// Last and the limit of the later evaluation (but a stand-in's never
// replaces the key's own: keptLimit), clamped to that limit. Stand-in
// hits (Request.StandIn) are added, in mergeMeet, rather than lost to the
// more charged state, at most up to what the stand-in's state still holds
// charged at now and to empty under the kept limit. A state that does not
// decode changes nothing. With room, a new counter, or a sliding log that
// may grow, must find room as a check's would (see Store.take), or is
// refused with ErrFull. sh.mu is held. See docs/design-store.md, "Merging
// two counters of one key".
func (t *table[S, P]) merge(store *Store, sh *shard, c *Counter, now int64, room bool, mode mergeMode) error {
	var s S
	if err := P(&s).UnmarshalBinary(c.State); err != nil {
		return stateError(err)
	}
	id, hash := sh.counterID(&Request{Name: c.Name, Key: c.Key, Role: c.Role})
	idx := t.find(id, hash)
	if room && !t.logRoom(idx, now) {
		store.metrics.refused.Inc()
		return ErrFull
	}
	held := idx >= 0
	if !held {
		if room {
			if err := store.makeRoom(sh, t, now, 1, t.cost(len(id)), nil); err != nil {
				return err
			}
		}
		idx = t.insert(id, hash, c.Last)
		store.held.Add(1)
		t.setLimit(&t.entries[idx], c.Limit)
	}
	e := &t.entries[idx]
	before := t.footprint(idx)
	kept := c.Limit
	if held {
		kept = t.keptLimit(idx, c, mode)
	}
	twoLimits := t.limit(e) != kept || c.Limit != kept
	if held && mode != mergeCopy {
		t.meet(idx, &s, c, now, mode, kept)
	}
	P(&e.state).Merge(s)
	t.setLimit(e, kept)
	e.last = max(e.last, c.Last)
	if twoLimits {
		P(&e.state).Clamp(time.Unix(0, e.last), kept)
	}
	if hits, ok := t.standIns[idx]; c.StandInHits > 0 && (!held || mode != mergeMeet || ok) {
		// Counted apart here unless they were added to the key's own
		// counter (mergeMeet, held, not a stand-in's).
		if t.standIns == nil {
			t.standIns = make(map[int32]int64)
		}
		if mode == mergeCopy {
			t.standIns[idx] = max(hits, c.StandInHits)
		} else {
			t.standIns[idx] = addSaturating(hits, c.StandInHits)
		}
	}
	e.changed = true
	t.settle(idx, before)
	return nil
}

// meet adds, before the two states merge, the hits a stand-in charged on
// one side to the other (see merge and mergeMode): arriving's
// (c.StandInHits) to the counter at idx, in mergeMeet, or the counter's
// (t.standIns) to s, arriving's decoded state, which then, if it is the
// key's own (mergeMeet, or mergeBack of a counter that counts no
// stand-in hits), is the key's counter here.
func (t *table[S, P]) meet(idx int32, s *S, c *Counter, now int64, mode mergeMode, kept algorithms.Limit) {
	e := &t.entries[idx]
	mine, standingIn := t.standIns[idx]
	switch {
	case c.StandInHits > 0 && mode == mergeMeet:
		at := max(now, c.Last, e.last)
		n := min(c.StandInHits, spent[S, P](s, at, c.Limit), P(&e.state).Check(time.Unix(0, at), kept, 0).Remaining)
		if n > 0 {
			t.take(idx, false, at, kept, n, false)
		}
	case standingIn:
		at := max(now, c.Last, e.last)
		n := min(mine, spent[S, P](&e.state, at, t.limit(e)), P(s).Check(time.Unix(0, at), kept, 0).Remaining)
		if n > 0 {
			P(s).Take(time.Unix(0, at), kept, n)
		}
		if mode == mergeMeet || mode == mergeBack && c.StandInHits == 0 {
			delete(t.standIns, idx)
		}
	}
}

// keptLimit returns the limit the counter at idx keeps as c merges into
// it: that of the later evaluation, but that a stand-in's limit (of a
// counter that counts stand-in hits) never replaces the limit of the
// key's own counter, in a merge that is not of copies. A stand-in's may
// be a share of the key's (the service's fallback decides with limit /
// members): the owner's counter, clamped to a share that came later,
// forgot what it had admitted and admitted it again (the chaos partition
// scenario: 125 on a bound of 120, after the heal). The key's next check
// brings its limit, and a counter evaluated under another is clamped to
// it then (see follow).
func (t *table[S, P]) keptLimit(idx int32, c *Counter, mode mergeMode) algorithms.Limit {
	e := &t.entries[idx]
	if mode != mergeCopy {
		_, standingIn := t.standIns[idx]
		switch {
		case c.StandInHits > 0 && !standingIn:
			return t.limit(e)
		case standingIn && c.StandInHits == 0:
			return c.Limit
		}
	}
	if c.Last >= e.last {
		return c.Limit
	}
	return t.limit(e)
}

// spent returns the hits st holds charged at now (Unix ns) under l: how
// many fewer it would admit than a counter at rest.
func spent[S any, P state[S]](st P, now int64, l algorithms.Limit) int64 {
	var rest S
	at := time.Unix(0, now)
	return max(P(&rest).Check(at, l, 0).Remaining-st.Check(at, l, 0).Remaining, 0)
}

// Holds reports whether the store has a counter for r's name, key,
// algorithm and role, or, for a request with a MinInterval, its spacing
// counter, or, for a request of RoleLimit, the RoleCeiling counter beside
// it (a check with a ceiling is decided on both), without creating,
// charging or touching any. A node asked to decide a key its ring gives
// to another uses it to tell whether the counter is here (see
// service.Owner.Forwarded).
func (s *Store) Holds(r *Request) bool {
	sh := s.shard(r.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.holdsOneOf(r)
}

// lacks reports whether r may be decided only on a counter held here
// (Request.Held) and sh, r's shard, whose lock is held, holds none.
func (sh *shard) lacks(r *Request) bool { return r.Held && !sh.holdsOneOf(r) }

// holdsOneOf reports whether sh, r's shard, whose lock is held, holds one
// of the counters a check of r is decided on (see Holds).
func (sh *shard) holdsOneOf(r *Request) bool {
	if !r.Algorithm.Valid() {
		return false
	}
	for _, c := range r.decidedOn() {
		if c.Name != "" && sh.holds(c) {
			return true
		}
	}
	return false
}

// decidedOn returns the requests of the counters a check of r may be
// decided on: r's own; its ceiling counter, for a request of RoleLimit
// that is not a spacing; its spacing, for a request with a MinInterval.
// Those that do not apply are zero Requests.
func (r *Request) decidedOn() [3]Request {
	out := [3]Request{*r}
	if r.Role == RoleLimit && r.Algorithm != Spacing {
		out[1] = *r
		out[1].Role = RoleCeiling
	}
	if r.spaced() {
		out[2] = r.spacing()
	}
	return out
}

// holds reports whether sh has r's counter. sh.mu is held.
func (sh *shard) holds(r Request) bool {
	id, hash := sh.counterID(&r)
	return sh.tables[r.Algorithm].find(id, hash) >= 0
}

// TakeOut removes and returns the counters a check of r is decided on
// that the store holds (see decidedOn: its own, its ceiling counter, its
// spacing): what a replica store gives up when its key's owner cannot be
// reached (see replica.Node.PromoteKey).
func (s *Store) TakeOut(r *Request) []Counter {
	if !r.Algorithm.Valid() {
		return nil
	}
	i := s.shardIndex(r.Key)
	sh := &s.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var out []Counter
	for _, c := range r.decidedOn() {
		if c.Name != "" {
			out = s.takeOut(sh, c, out)
		}
	}
	s.attachReservations(int(i), out, true)
	return out
}

// takeOut appends to out, and removes from sh, r's counter if sh holds it
// and it encodes. sh.mu is held.
func (s *Store) takeOut(sh *shard, r Request, out []Counter) []Counter {
	id, hash := sh.counterID(&r)
	if c, ok := sh.tables[r.Algorithm].takeOut(r.Algorithm, id, hash); ok {
		s.held.Add(-1)
		out = append(out, c)
	}
	return out
}
