package plugintest

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// routerOnly are module path prefixes of the router's dependencies that no
// dependency of the SDK module requires: a plugin's module must never see
// them, in its build list or its go.sum.
var routerOnly = []string{
	"github.com/nats-io/",
	"k8s.io/",
	"sigs.k8s.io/",
	"github.com/chromedp/",
	"github.com/prometheus/",
}

// notLinked are module path prefixes of router dependencies that grpc's own
// go.mod also names (its xDS support and its tests): they are in any grpc
// user's build list, at grpc's versions, but no package of theirs may be
// compiled into a plugin.
var notLinked = append([]string{"github.com/envoyproxy/", "gonum.org/"}, routerOnly...)

// downloadFailure matches the go command's words for a module it could not
// fetch (no proxy reachable, GOPROXY=off with an empty cache): the only
// failure TestPluginModuleOutsideRepository skips on.
var downloadFailure = regexp.MustCompile(`dial tcp|no such host|connection refused|i/o timeout|TLS handshake timeout|proxyconnect|network is unreachable|module lookup disabled|GOPROXY=off`)

// TestPluginModuleOutsideRepository copies the template plugin's sources
// (cmd/plugin-example without its tests: main_test.go imports this package,
// which is the router module's) into a module of its own in a temporary
// directory, requiring only the SDK module (shared/, by a replace to this
// checkout), and checks what go mod tidy gives it: no module of routerOnly
// and not the router module in its build list or go.sum; no module there
// that the SDK module's own build list lacks (the router adds nothing to
// version selection); no package of notLinked compiled into the plugin;
// and a binary that builds and passes Check. Modules come through GOPROXY
// as set (or the module cache); the test skips, saying so, only when a
// module download fails.
func TestPluginModuleOutsideRepository(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src := filepath.Join(root, "cmd", "plugin-example")
	var copied []string
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		text = []byte(strings.ReplaceAll(string(text),
			"github.com/switchyard-router/switchyard/cmd/plugin-example/", "example.com/myplugin/"))
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(rel)), 0o755); err != nil {
			return err
		}
		copied = append(copied, rel)
		return os.WriteFile(filepath.Join(dir, rel), text, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"main.go", filepath.Join("queuedepth", "queuedepth.go")}; strings.Join(copied, " ") != strings.Join(want, " ") {
		t.Fatalf("copied %q from %s, want %q", copied, src, want)
	}
	sdk := "github.com/switchyard-router/switchyard/shared"
	gomod := "module example.com/myplugin\n\ngo 1.26.0\n\nreplace " + sdk + " => " + filepath.Join(root, "shared") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	// The SDK's go.sum, so that no checksum has to be looked up in GOSUMDB
	// (the module proxy alone serves); go mod tidy drops what the plugin
	// does not need.
	sdkSum, err := os.ReadFile(filepath.Join(root, "shared", "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sdkSum, 0o644); err != nil {
		t.Fatal(err)
	}
	goCmd := func(args ...string) (string, error) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "go", args...)
		cmd.Dir = dir
		// GOPROXY, GOSUMDB, GOMODCACHE and GOFLAGS come from the
		// environment; no workspace may add the router module.
		cmd.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"), "GOWORK=off")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	if out, err := goCmd("mod", "tidy"); err != nil {
		if downloadFailure.MatchString(out) {
			t.Skipf("skipped: go mod tidy could not download a module (GOPROXY=%q): %s", os.Getenv("GOPROXY"), out)
		}
		t.Fatalf("go mod tidy: %v\n%s", err, out)
	}
	list, err := goCmd("list", "-m", "all")
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, list)
	}
	t.Logf("go list -m all of the plugin module:\n%s", list)
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	sdkCmd := exec.CommandContext(t.Context(), "go", "list", "-m", "all")
	sdkCmd.Dir = filepath.Join(root, "shared")
	sdkList, err := sdkCmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all in shared/: %v\n%s", err, sdkList)
	}
	sdkModules := firstFields(string(sdkList))
	modules := firstFields(list)
	for path := range firstFields(string(sum)) {
		modules[path] = true
	}
	for path := range modules {
		if hasPrefix(path, routerOnly) || path == "github.com/switchyard-router/switchyard" {
			t.Errorf("the plugin module's go.sum or build list has %s, a router dependency", path)
		}
		if !sdkModules[path] && path != sdk && path != "example.com/myplugin" {
			t.Errorf("the plugin module's go.sum or build list has %s, which the SDK module's build list lacks", path)
		}
	}
	// What a plugin does need is there: the SDK and the transport.
	for _, want := range []string{sdk, "github.com/hashicorp/go-plugin", "google.golang.org/grpc", "google.golang.org/protobuf"} {
		if !modules[want] {
			t.Errorf("the plugin module's build list lacks %s:\n%s", want, list)
		}
	}
	linked, err := goCmd("list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".")
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, linked)
	}
	linkedModules := firstFields(linked)
	for path := range linkedModules {
		if hasPrefix(path, notLinked) {
			t.Errorf("a package of %s is compiled into the plugin", path)
		}
	}
	if !linkedModules[sdk] || !linkedModules["google.golang.org/grpc"] {
		t.Errorf("the plugin's packages come from %v, want the SDK and grpc among them", linkedModules)
	}

	bin := filepath.Join(dir, "bin", "myplugin")
	if out, err := goCmd("build", "-o", bin, "."); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	Check(t, bin, Type("queue-depth"))
}

// firstFields returns the first field of every non-empty line of text: the
// module paths of `go list -m all`, `go list -deps` or a go.sum.
func firstFields(text string) map[string]bool {
	first := map[string]bool{}
	for line := range strings.Lines(text) {
		if f := strings.Fields(line); len(f) > 0 {
			first[f[0]] = true
		}
	}
	return first
}

// hasPrefix reports whether path starts with one of prefixes.
func hasPrefix(path string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}
