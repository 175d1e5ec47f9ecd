package live

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// buildExample builds cmd/plugin-example reporting version v into dir.
func buildExample(t *testing.T, dir, v string) string {
	t.Helper()
	path := filepath.Join(dir, "plugin-example-"+v)
	cmd := exec.Command("go", "build", "-ldflags", "-X main.version="+v, "-o", path, "../../cmd/plugin-example")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building cmd/plugin-example %s: %v\n%s", v, err, out)
	}
	return path
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// waitPlugin polls /readyz until its one plugin is up with version v, and
// returns it.
func (rd *runningDaemon) waitPlugin(t *testing.T, v string) PluginReadiness {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, a := getReadyz(t, rd.base)
		if len(a.Plugins) == 1 && a.Plugins[0].State == "up" && a.Plugins[0].Version == v {
			return a.Plugins[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz plugins %+v a minute on, want one up at version %s; logs:\n%s", a.Plugins, v, rd.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A plugin run by an interpreter (/bin/sh running a script that execs
// cmd/plugin-example) under --watch: editing the script on disk restarts
// the plugin through a reload, and /readyz and the metrics show the new
// version, the script's new checksum and a later start time; a script
// whose new plugin cannot start fails the reload and the running version
// stays; fixing it reloads again.
func TestDaemonWatchPluginScript(t *testing.T) {
	dir := t.TempDir()
	v1, v2 := buildExample(t, dir, "1.0.0"), buildExample(t, dir, "2.0.0")
	w := newMock(t, "", 50)
	script := filepath.Join(dir, "plugin.sh")
	writeScript := func(bin string) {
		t.Helper()
		// In place, as `vi` with backupcopy or `cp` does; the watch
		// covers a rename over it too (filewatch).
		if err := os.WriteFile(script, []byte("exec "+bin+" \"$@\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeScript(v1)
	policy := filepath.Join(dir, "policy.hcl")
	replaceFile(t, policy, fmt.Sprintf(`plugin "example" {
  command      = "/bin/sh"
  args         = [%q]
  call_timeout = "5s"
}

policy "queue" {
  scorer "depth" {
    type = "queue-depth"
  }
  picker "pick" {
    type = "min-cost"
  }
}

worker_selection {
  aggregated = "queue"
}
`, script)+workerBlocks("a="+w.URL))
	reg := prometheus.NewRegistry()
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy, Watch: true, Registry: reg})
	rd.waitWorkers(t, "a")

	first := rd.waitPlugin(t, "1.0.0")
	shSum, sum1 := fileSum(t, "/bin/sh"), fileSum(t, script)
	if first.SHA256 != shSum || len(first.Files) != 2 || first.Files[1].Path != script || first.Files[1].SHA256 != sum1 {
		t.Fatalf("plugin %+v, want sha256 %s (/bin/sh) and files [/bin/sh, %s %s]", first, shSum, script, sum1)
	}
	started1, err := time.Parse(time.RFC3339Nano, first.Started)
	if err != nil {
		t.Fatal(err)
	}
	if got := rd.split(t, 4); got["a"] != 4 {
		t.Fatalf("answers by worker %v, want 4 from a", got)
	}

	writeScript(v2)
	second := rd.waitPlugin(t, "2.0.0")
	sum2 := fileSum(t, script)
	started2, err := time.Parse(time.RFC3339Nano, second.Started)
	if err != nil {
		t.Fatal(err)
	}
	if second.Files[1].SHA256 != sum2 || !started2.After(started1) {
		t.Errorf("after the edit: plugin %+v, want the script's sha256 %s and a start after %v", second, sum2, started1)
	}
	if !strings.Contains(rd.logs.String(), "plugin file changed: "+script) {
		t.Errorf("logs do not give the reload's cause:\n%s", rd.logs)
	}
	metrics := getMetrics(t, rd.base)
	for _, want := range []string{
		fmt.Sprintf(`switchyard_plugin_info{files_sha256=%q,plugin="example",sha256=%q,version="2.0.0"} 1`, sum2, shSum),
		`switchyard_policy_reloads_total{result="success"} 1`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(metrics, "switchyard_p"))
		}
	}
	if strings.Count(metrics, "switchyard_plugin_info{") != 1 {
		t.Errorf("want one switchyard_plugin_info series:\n%s", grepLines(metrics, "switchyard_plugin_info"))
	}

	// A broken new version: the reload fails, 2.0.0 goes on serving.
	writeScript(filepath.Join(dir, "no-such-plugin"))
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(getMetrics(t, rd.base), `switchyard_policy_reloads_total{result="failure"} 1`+"\n") {
		if time.Now().After(deadline) {
			t.Fatalf("no failed reload a minute after breaking the script; logs:\n%s", rd.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p := rd.waitPlugin(t, "2.0.0"); p.Started != second.Started {
		t.Errorf("after the failed reload the plugin is %+v, want the one started at %s", p, second.Started)
	}
	if got := rd.split(t, 4); got["a"] != 4 {
		t.Fatalf("answers by worker %v, want 4 from a", got)
	}
	writeScript(v1)
	rd.waitPlugin(t, "1.0.0")
}

func getMetrics(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
