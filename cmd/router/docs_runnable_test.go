package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit"
)

// runnableMarker, on the line right before a ```sh fence in README.md or
// docs/*.md, marks the shell block as runnable: TestRunnableDocBlocks runs
// it (docs/architecture.md, "Runnable examples in the docs").
const runnableMarker = "<!-- runnable -->"

// runnableTimeout bounds one block's run: generous, since the machine
// may be loaded; the test asserts that the block succeeds, never how fast.
const runnableTimeout = 10 * time.Minute

// docBlock is one runnable shell block of a page.
type docBlock struct {
	page string // relative to the repository root
	line int    // of the opening fence, 1-based
	text string
}

// runnableBlocks returns the marked blocks of the repository's README.md
// and docs/*.md, failing the test on a marker that is not right before a
// ```sh fence, or on a block left open.
func runnableBlocks(t testing.TB, root string) []docBlock {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{filepath.Join(root, "README.md")}, pages...)
	var blocks []docBlock
	for _, p := range pages {
		rel, _ := filepath.Rel(root, p)
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(src), "\n")
		for i := 0; i < len(lines); i++ {
			if strings.TrimSpace(lines[i]) != runnableMarker {
				continue
			}
			if i+1 >= len(lines) || strings.TrimSpace(lines[i+1]) != "```sh" {
				t.Errorf("%s:%d: %s is not right before a ```sh fence", rel, i+1, runnableMarker)
				continue
			}
			start := i + 1
			end := start + 1
			for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
				end++
			}
			if end >= len(lines) {
				t.Errorf("%s:%d: the runnable block is never closed", rel, start+1)
				break
			}
			blocks = append(blocks, docBlock{page: rel, line: start + 1, text: strings.Join(lines[start+1:end], "\n") + "\n"})
			i = end
		}
	}
	return blocks
}

// docWorkspace returns a directory that looks like the repository's root
// after `make build`: a symbolic link to each of the root's entries but
// bin/, and a bin/ of its own holding the router and the example plugins
// built by this test process.
func docWorkspace(t *testing.T, root string) string {
	t.Helper()
	w := t.TempDir()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "bin" || e.Name() == ".git" {
			continue
		}
		if err := os.Symlink(filepath.Join(root, e.Name()), filepath.Join(w, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(w, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	bins := map[string]string{"router": testkit.BuildNamed(t, ".", "router")}
	for _, name := range []string{"plugin-example", "disagg-filter-score-pick", "soft-pin-repin"} {
		bins[name] = examplePlugin(t, name)
	}
	for name, path := range bins {
		if err := os.Symlink(path, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// TestRunnableDocBlocks runs every shell block of README.md and docs/*.md
// marked runnable, each with bash -e -o pipefail, from a copy of the
// repository's root whose bin/ holds freshly built binaries (also first
// on PATH), with /tmp/ in the block replaced by a directory of its own
// (also TMPDIR), under runnableTimeout: each must exit 0.
func TestRunnableDocBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the router and runs the docs' commands as processes")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	blocks := runnableBlocks(t, root)
	pages := map[string]int{}
	for _, b := range blocks {
		pages[b.page]++
	}
	if pages["README.md"] == 0 || pages["docs/replay.md"] < 2 {
		t.Fatalf("runnable blocks per page %v; want README.md's usage and at least two of docs/replay.md", pages)
	}
	w := docWorkspace(t, root)
	for _, b := range blocks {
		t.Run(b.page+":"+strconv.Itoa(b.line), func(t *testing.T) {
			tmp := t.TempDir()
			script := strings.ReplaceAll(b.text, "/tmp/", tmp+"/")
			ctx, cancel := context.WithTimeout(context.Background(), runnableTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script)
			cmd.Dir = w
			cmd.Env = append(os.Environ(), "PATH="+filepath.Join(w, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"), "TMPDIR="+tmp)
			// The block's processes are a group of their own, killed
			// together at the timeout.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
			cmd.WaitDelay = 10 * time.Second
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("%s:%d: %v (timeout %v)\n--- block\n%s--- output\n%s", b.page, b.line, err, runnableTimeout, b.text, tail(out, 4000))
			}
		})
	}
}

// TestRunnableBlocksFound: the marker's parser finds a marked block and
// refuses a marker that is not right before a ```sh fence.
func TestRunnableBlocksFound(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	readme := "# x\n\n" + runnableMarker + "\n```sh\necho a\necho b\n```\n\n```sh\nnot marked\n```\n"
	if err := os.WriteFile(filepath.Join(root, "README.md"), []byte(readme), 0o644); err != nil {
		t.Fatal(err)
	}
	blocks := runnableBlocks(t, root)
	if len(blocks) != 1 || blocks[0].text != "echo a\necho b\n" || blocks[0].line != 4 || blocks[0].page != "README.md" {
		t.Errorf("blocks %+v, want README.md:4 \"echo a\\necho b\\n\"", blocks)
	}
	bad := "# y\n" + runnableMarker + "\n\n```sh\necho\n```\n"
	if err := os.WriteFile(filepath.Join(root, "docs", "y.md"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	ft := &fakeTB{TB: t}
	_ = runnableBlocks(ft, root)
	if !strings.Contains(strings.Join(ft.errors, "\n"), "docs/y.md:2: <!-- runnable --> is not right before a ```sh fence") {
		t.Errorf("errors %q, want docs/y.md:2 refused", ft.errors)
	}
}

// fakeTB records Errorf's messages instead of failing.
type fakeTB struct {
	testing.TB
	errors []string
}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

// tail is the last n bytes of b, from a line's start.
func tail(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	_, rest, _ := strings.Cut(string(b[len(b)-n:]), "\n")
	return "...\n" + rest
}
