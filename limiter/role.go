package limiter

import "strings"

// Role tells apart counters that share a name, key and algorithm but
// count different things for one check: a check with a ceiling (a limit
// that borrows from a shared parent when there is room; see package
// service) keeps its own limit in the counter of role RoleLimit, as every
// check does, and everything it admitted, guaranteed or borrowed, in the
// counter of role RoleCeiling beside it. Keys may hold any byte, NUL
// included, so no suffix on the key could keep the two apart: the role is
// part of the counter's identity, in the store and in its record.
type Role uint8

const (
	// RoleLimit is a check's own limit: the role of every counter that
	// is not a ceiling, and the zero value.
	RoleLimit Role = iota
	// RoleCeiling is the counter of a check's ceiling.
	RoleCeiling
	// numRoles is the number of roles a record may carry.
	numRoles
)

// String names the role as logs and errors show it.
func (r Role) String() string {
	switch r {
	case RoleLimit:
		return "limit"
	case RoleCeiling:
		return "ceiling"
	}
	return "unknown"
}

// appendID appends the store's id of the counter of role, name and key to
// b. The id of RoleLimit is name + "\x00" + key, as it always was; that
// of another role is "\x00" + the role's byte + name + "\x00" + key. A
// name is never empty and never holds a NUL, so an id that starts with a
// NUL is never one of RoleLimit, and the NUL after the name keeps ("a",
// "bc") apart from ("ab", "c").
func appendID(b []byte, role Role, name, key string) []byte {
	if role != RoleLimit {
		b = append(b, 0, byte(role))
	}
	return append(append(append(b, name...), 0), key...)
}

// splitID returns the role, name and key of a store id (see appendID).
func splitID(id string) (role Role, name, key string) {
	if len(id) >= 2 && id[0] == 0 {
		role, id = Role(id[1]), id[2:]
	}
	name, key, _ = strings.Cut(id, "\x00")
	return role, name, key
}
