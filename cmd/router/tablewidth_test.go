package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// The table's width is $COLUMNS when it is a whole number from 40, else
// the terminal's, else 100 (a buffer is no terminal).
func TestTableWidth(t *testing.T) {
	for _, tt := range []struct {
		columns string
		want    int
	}{{"", 100}, {"150", 150}, {"39", 100}, {"wide", 100}} {
		t.Setenv("COLUMNS", tt.columns)
		if got := tableWidth(&bytes.Buffer{}); got != tt.want {
			t.Errorf("COLUMNS=%q: width %d, want %d", tt.columns, got, tt.want)
		}
	}
}

// router replay's README sweep, on a short trace, prints lines of at
// most 100 runes by default and shows more columns at COLUMNS=200;
// --columns shows what it names, however wide.
func TestReplayTableFitsColumns(t *testing.T) {
	args := []string{"replay", "--quiet", "--limit", "150", "--compare", filepath.Join(policyDir, "round-robin.hcl") + "," + filepath.Join(policyDir, "kv-affinity.hcl"),
		"--workers", "2,4", "--seeds", "2", "--baseline", "round-robin", "--slo", "ttft=2s,tpot=100ms", "--goodput-target", "90"}
	header := func(out string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "policy ") {
				return l
			}
		}
		t.Fatalf("no header line in:\n%s", out)
		return ""
	}
	t.Setenv("COLUMNS", "")
	code, narrow, errOut := runRouter(args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for i, l := range strings.Split(narrow, "\n") {
		if n := utf8.RuneCountInString(l); n > 100 {
			t.Errorf("line %d is %d wide:\n%s", i, n, l)
		}
	}
	t.Setenv("COLUMNS", "200")
	_, wide, _ := runRouter(args...)
	if n, w := len(strings.Fields(header(narrow))), len(strings.Fields(header(wide))); w <= n {
		t.Errorf("%d header words at 100 columns, %d at 200; want more:\n%s\n%s", n, w, narrow, wide)
	}
	t.Setenv("COLUMNS", "")
	_, all, _ := runRouter(append(args, "--columns", "all")...)
	if strings.Contains(all, "left out to fit") || !strings.Contains(all, "wall s") {
		t.Errorf("--columns all: want every column:\n%s", all)
	}
}
