//go:build linux

package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestBusyPortDoesNotHidePolicyErrors: `router serve` and `router epp` load
// the policy file before they open their listeners. With every address they
// would listen on in use, a file with errors (a worker url without a
// scheme; a classifier naming no queue class, in a file of no worker)
// exits 1 with the file's errors and neither an "address already in use"
// nor the no-workers warning, which used to come first; a file that loads
// exits 1 on the busy address, the no-workers warning (for a file of no
// worker) before it.
func TestBusyPortDoesNotHidePolicyErrors(t *testing.T) {
	bin, _ := e2eBinaries(t)
	busy := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		return ln.Addr().String()
	}
	addr, httpAddr, debugAddr := busy(), busy(), busy()
	badURL := writeFile(t, "bad-url.hcl", "worker \"w\" {\n  url = \"127.0.0.1:8001\"\n}\n")
	badClass := writeFile(t, "bad-class.hcl", "request_classifier {\n  type          = \"header-priority\"\n  default_class = \"zzz\"\n}\n")
	noWorkers := writeFile(t, "no-workers.hcl", "router {\n  block_size = 16\n}\n")
	const inUse = "address already in use"
	const noWorkersWarn = "[WARN]  router: no workers: "
	for _, face := range []string{"serve", "epp"} {
		args := func(policy string) []string {
			a := []string{face, "--policy", policy, "--listen", addr, "--debug-listen", debugAddr}
			if face == "epp" {
				a = append(a, "--http-listen", httpAddr)
			}
			return a
		}
		for _, tt := range []struct{ policy, want string }{
			{badURL, badURL + `:2:9: error: Invalid URL; The value of "url" has no scheme: want http://HOST:PORT (add "http://": "http://127.0.0.1:8001").`},
			{badClass, badClass + `:3:19: error: Unknown queue class; default_class names queue class "zzz"`},
		} {
			code, stderr := runBinary(t, bin, args(tt.policy)...)
			if code != 1 || !hasLinePrefix(stderr, tt.want) || !hasLinePrefix(stderr, "router: "+tt.policy+" does not load") ||
				strings.Contains(stderr, inUse) || strings.Contains(stderr, noWorkersWarn) {
				t.Errorf("%s %s: exit %d, stderr\n%s\nwant exit 1, a line starting %q, no %q and no no-workers warning",
					face, filepath.Base(tt.policy), code, stderr, tt.want, inUse)
			}
		}
		code, stderr := runBinary(t, bin, args(noWorkers)...)
		warnAt, busyAt := strings.Index(stderr, noWorkersWarn), strings.Index(stderr, "router: --listen "+addr+": listen tcp "+addr+": bind: "+inUse)
		if code != 1 || warnAt < 0 || busyAt < warnAt {
			t.Errorf("%s, a file that loads: exit %d, stderr\n%s\nwant exit 1, the no-workers warning, then --listen %s: ... %s",
				face, code, stderr, addr, inUse)
		}
	}
}

// TestPoolSelectorDoesNotHidePolicyErrors: with --pool-selector the pods
// are listed once the policy file and the workers file have loaded, as
// the listeners are opened (TestBusyPortDoesNotHidePolicyErrors). With a
// kubeconfig that cannot be read, a policy file or a workers file with
// errors exits 1 with the file's errors and no Kubernetes error, which
// used to come first and alone; files that load exit 1 on the
// kubeconfig.
func TestPoolSelectorDoesNotHidePolicyErrors(t *testing.T) {
	bin, _ := e2eBinaries(t)
	dir := t.TempDir()
	badURL := writeFile(t, "bad-url.hcl", "worker \"w\" {\n  url = \"127.0.0.1:8001\"\n}\n")
	good := writeFile(t, "good.hcl", "router {\n  block_size = 16\n}\n")
	badWorkers := writeFile(t, "bad-workers.hcl", "worker \"x\" {\n  url = \"127.0.0.1:8002\"\n}\n")
	kubeconfig := filepath.Join(dir, "no-such-kubeconfig")
	kubeErr := "router: --kubeconfig: kubernetes client configuration: stat " + kubeconfig + ": no such file or directory"
	for _, face := range []string{"serve", "epp"} {
		args := func(policy string, more ...string) []string {
			a := []string{face, "--policy", policy, "--listen", "127.0.0.1:0",
				"--pool-selector", "app=vllm", "--pool-port", "8000", "--kubeconfig", kubeconfig}
			if face == "epp" {
				a = append(a, "--http-listen", "127.0.0.1:0")
			}
			return append(a, more...)
		}
		for _, tt := range []struct {
			args      []string
			want, bad string
		}{
			{args(badURL), badURL + `:2:9: error: Invalid URL; The value of "url" has no scheme: want http://HOST:PORT (add "http://": "http://127.0.0.1:8001").`, badURL},
			{args(good, "--workers-file", badWorkers), badWorkers + `:2:9: error: Invalid URL; The value of "url" has no scheme: want http://HOST:PORT (add "http://": "http://127.0.0.1:8002").`, badWorkers},
		} {
			code, stderr := runBinary(t, bin, tt.args...)
			if code != 1 || !hasLinePrefix(stderr, tt.want) || !hasLinePrefix(stderr, "router: "+tt.bad+" does not load") || strings.Contains(stderr, "kubeconfig") {
				t.Errorf("%s %v: exit %d, stderr\n%s\nwant exit 1, a line starting %q, %s does not load and no Kubernetes error",
					face, tt.args[1:], code, stderr, tt.want, filepath.Base(tt.bad))
			}
		}
		code, stderr := runBinary(t, bin, args(good)...)
		if code != 1 || !hasLinePrefix(stderr, kubeErr) {
			t.Errorf("%s, files that load: exit %d, stderr\n%s\nwant exit 1 and a line starting %q", face, code, stderr, kubeErr)
		}
	}
}
