package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPoolFlags: the --pool-* flags of epp and serve are checked before
// anything starts, and each error names its flag.
func TestPoolFlags(t *testing.T) {
	const portWantText = "want a port number from 1 to 65535"
	dir := t.TempDir()
	missing := filepath.Join(dir, "no-kubeconfig")
	deadServer := filepath.Join(dir, "kubeconfig")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	if err := os.WriteFile(deadServer, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://"+addr+
		"\ncontexts:\n- name: c\n  context:\n    cluster: c\ncurrent-context: c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		code int
		want string // stderr's prefix
	}{
		{[]string{"--pool-selector", "app in (a", "--pool-port", "8000"}, 2, `router: --pool-selector "app in (a": invalid label selector "app in (a": `},
		{[]string{"--pool-selector", "", "--pool-port", "8000"}, 2, "router: --pool-port needs --pool-selector\n"},
		{[]string{"--pool-selector", "app=vllm"}, 2, "router: --pool-selector needs --pool-port, the engines' HTTP port on the pods\n"},
		{[]string{"--pool-selector", "app=vllm", "--pool-port", "0"}, 2, "router: --pool-port 0: " + portWantText + "\n"},
		{[]string{"--pool-selector", "app=vllm", "--pool-port", "65536"}, 2, "router: --pool-port 65536: " + portWantText + "\n"},
		{[]string{"--pool-selector", "app=vllm", "--pool-port", "x"}, 2, "router: --pool-port x: " + portWantText + "\n"},
		{[]string{"--pool-selector", "app=vllm", "--pool-port", "8000", "--pool-kv-events-port", "0"}, 2, "router: --pool-kv-events-port 0: " + portWantText + "\n"},
		{[]string{"--pool-selector", "app=vllm", "--pool-port", "8000", "--pool-kv-events-topic", "kv"}, 2,
			"router: --pool-kv-events-topic and --pool-kv-events-replay-port need --pool-kv-events-port\n"},
		{[]string{"--pool-selector", "app=vllm", "--pool-port", "8000", "--pool-role", "chef"}, 2, `router: --pool-role "chef": want aggregated, prefill or decode` + "\n"},
		{[]string{"--pool-selector", "app=vllm", "--pool-port", "8000", "--pool-models", "a,a"}, 2, `router: --pool-models "a,a": want distinct, non-empty model names` + "\n"},
		{[]string{"--pool-namespace", "llm"}, 2, "router: --pool-namespace needs --pool-selector\n"},
		{[]string{"--kubeconfig", missing}, 2, "router: --kubeconfig needs --pool-selector\n"},
		// A signal while the pods are first listed (an API server that
		// does not answer): a clean stop, exit 0.
		{[]string{"--pool-selector", "app=vllm", "--pool-port", "8000", "--kubeconfig", deadServer}, 0, ""},
		// Valid flags, a kubeconfig that is not there: exit 1 naming it.
		{[]string{"--pool-selector", "app=vllm", "--pool-port", "8000", "--kubeconfig", missing}, 1, "router: --kubeconfig: kubernetes client configuration: "},
	} {
		for _, cmd := range []string{"epp", "serve"} {
			args := append([]string{cmd, "--policy", rrPolicy, "--listen", "127.0.0.1:0"}, tt.args...)
			// A cancelled context: a case that wrongly starts serving stops at once.
			var out, errb bytes.Buffer
			code := runContext(canceled(), args, &out, &errb)
			if code != tt.code || !strings.HasPrefix(errb.String(), tt.want) {
				t.Errorf("%q: exit %d, stderr %q; want %d and %q...", args, code, errb.String(), tt.code, tt.want)
			}
			if tt.code == 1 && !strings.Contains(errb.String(), missing) {
				t.Errorf("%q: stderr %q does not name %s", args, errb.String(), missing)
			}
		}
	}
}
