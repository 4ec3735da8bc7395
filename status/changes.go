package status

import (
	"slices"
	"sync"
	"time"
)

// MaxChanges is how many ring changes a Changes keeps, and maxNamed how
// many names of members that joined, or left, one change keeps: a
// cluster that changes without end, or by hundreds of members at once,
// keeps a log of fixed size.
const (
	MaxChanges = 32
	maxNamed   = 16
)

// Change is one change of the ring as this node saw it.
type Change struct {
	Time   time.Time `json:"time"`
	Joined []string  `json:"joined,omitempty"`
	Left   []string  `json:"left,omitempty"`
	// More counts the members that joined or left beyond the maxNamed of
	// each kept by name.
	More    int `json:"more,omitempty"`
	Members int `json:"members"` // how many the ring holds after the change
}

// Changes is the log of the last MaxChanges ring changes, newest last.
// The zero value is an empty log; it is safe for concurrent use.
type Changes struct {
	mu      sync.Mutex
	members []string // the ring's, as last recorded, sorted
	log     []Change // at most MaxChanges, oldest first
}

// Record logs the ring whose members are named members, at now, as the
// change from the ring recorded last (the first ring: every member
// joined). A ring of the same members is no change, and is not logged.
func (c *Changes) Record(now time.Time, members []string) {
	members = slices.Sorted(slices.Values(members))
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := Change{Time: now, Members: len(members)}
	for _, m := range members {
		if _, found := slices.BinarySearch(c.members, m); !found {
			ch.Joined, ch.More = named(ch.Joined, ch.More, m)
		}
	}
	for _, m := range c.members {
		if _, found := slices.BinarySearch(members, m); !found {
			ch.Left, ch.More = named(ch.Left, ch.More, m)
		}
	}
	c.members = members
	if len(ch.Joined) == 0 && len(ch.Left) == 0 && ch.More == 0 {
		return
	}
	if len(c.log) == MaxChanges {
		c.log = slices.Delete(c.log, 0, 1)
	}
	c.log = append(c.log, ch)
}

func named(names []string, more int, name string) ([]string, int) {
	if len(names) == maxNamed {
		return names, more + 1
	}
	return append(names, name), more
}

// Log returns the changes kept, newest first.
func (c *Changes) Log() []Change {
	c.mu.Lock()
	out := slices.Clone(c.log)
	c.mu.Unlock()
	slices.Reverse(out)
	return out
}
