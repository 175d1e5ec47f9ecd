package main

import (
	"bytes"
	"testing"
)

// TestEPPBodyFlags: --max-body-bytes takes 1 KiB to serve's parser bound
// (32 MiB), --max-body-bytes-in-flight at least --max-body-bytes; other
// values are a usage error naming the flag and its range.
func TestEPPBodyFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-body-bytes", "1023"}, "--max-body-bytes 1023: want a whole number of bytes from 1024 to 33554432"},
		{[]string{"--max-body-bytes", "33554433"}, "--max-body-bytes 33554433: want a whole number of bytes from 1024 to 33554432"},
		{[]string{"--max-body-bytes-in-flight", "33554431"}, "--max-body-bytes-in-flight 33554431: want a whole number of bytes, at least --max-body-bytes (--max-body-bytes is 33554432)"},
		{[]string{"--max-body-bytes", "4096", "--max-body-bytes-in-flight", "0"}, "--max-body-bytes-in-flight 0: want a whole number of bytes, at least --max-body-bytes (--max-body-bytes is 4096)"},
		{[]string{"--max-body-bytes", "4096", "--max-body-bytes-in-flight", "-1"}, "--max-body-bytes-in-flight -1: want a whole number of bytes, at least --max-body-bytes (--max-body-bytes is 4096)"},
	} {
		args := append([]string{"epp", "--policy", rrPolicy, "--listen", "127.0.0.1:0"}, tt.args...)
		var out, errb bytes.Buffer
		if code := runContext(canceled(), args, &out, &errb); code != 2 || errb.String() != "router: "+tt.want+"\n" {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", args, code, errb.String(), "router: "+tt.want+"\n")
		}
	}
}
