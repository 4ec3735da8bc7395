package main

import (
	"encoding/base64"
	"strings"
	"testing"
)

// FuzzParseGossipKeys: whatever --gossip-key holds, parsing returns keys of
// a valid AES size or an error that does not quote the input, and never
// panics.
func FuzzParseGossipKeys(f *testing.F) {
	for _, s := range []string{
		base64.StdEncoding.EncodeToString(make([]byte, 32)),
		base64.StdEncoding.EncodeToString(make([]byte, 16)) + "," + base64.StdEncoding.EncodeToString(make([]byte, 24)),
		"", ",", " , ", "%%%", "AAAA", "c2VjcmV0", strings.Repeat("A", 44) + ",x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		keys, err := parseGossipKeys(s)
		if err != nil {
			if len(s) >= 8 && strings.Contains(err.Error(), s) {
				t.Errorf("error %q quotes the input", err)
			}
			return
		}
		if len(keys) == 0 {
			t.Fatal("no keys and no error")
		}
		for _, k := range keys {
			if n := len(k); n != 16 && n != 24 && n != 32 {
				t.Errorf("key of %d bytes accepted", n)
			}
		}
	})
}
