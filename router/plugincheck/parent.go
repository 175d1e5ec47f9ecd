package plugincheck

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/supervisor"
)

// ParentEnv names the environment variable that makes a process linking
// this package the parent of a plugin, for the parent-death check: its
// value is the JSON of the config.Plugin to start. Such a process starts
// the plugin as the router does, prints "PID SOCKET_DIR" on stdout, and
// waits until it is killed or its stdin ends; it never returns to main.
const ParentEnv = "SWITCHYARD_PLUGINCHECK_PARENT"

func init() {
	if spec, ok := os.LookupEnv(ParentEnv); ok {
		os.Exit(runParent(spec, os.Stdin, os.Stdout))
	}
}

// runParent is the parent process's work; it returns the exit status once
// stdin ends, without stopping the plugin (it must see its parent die).
func runParent(spec string, stdin io.Reader, stdout io.Writer) int {
	var p config.Plugin
	if err := json.Unmarshal([]byte(spec), &p); err != nil {
		fmt.Fprintf(stdout, "error: %s: %v\n", ParentEnv, err)
		return 2
	}
	host := supervisor.NewHost(supervisor.Options{Logger: hclog.NewNullLogger()})
	if _, err := host.Start(context.Background(), p); err != nil {
		fmt.Fprintf(stdout, "error: %v\n", strings.ReplaceAll(err.Error(), "\n", " "))
		return 2
	}
	proc, err := host.Process(p.Name)
	if err != nil {
		fmt.Fprintf(stdout, "error: %v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "%d %s\n", proc.PID, proc.SocketDir)
	_, _ = io.Copy(io.Discard, stdin)
	return 0
}

// parentWait bounds how long the parent-death check waits for the plugin
// to exit and remove its socket directory once its parent is killed: the
// Go SDK polls its parent every 250 ms, and Linux signals it at once.
const parentWait = 10 * time.Second

// checkParentDeath starts the plugin again under a parent process of its
// own (this executable re-run with ParentEnv), SIGKILLs that parent, and
// checks that the plugin exits and removes its socket directory
// (docs/plugin-protocol.md, section 6) within parentWait. What it left
// behind is then killed and removed.
func checkParentDeath(ctx context.Context, p config.Plugin) Result {
	const name = "parent death"
	const expected = "the plugin gone and its socket directory removed within 10s of its parent's SIGKILL"
	if !parentDeathChecked {
		return pass(name, "not checked on this system")
	}
	exe, err := os.Executable()
	if err != nil {
		return fail(name, "this executable, to serve as the parent", err.Error())
	}
	spec, err := json.Marshal(p)
	if err != nil {
		return fail(name, "the plugin's description", err.Error())
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), ParentEnv+"="+string(spec))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fail(name, "a parent process", err.Error())
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fail(name, "a parent process", err.Error())
	}
	if err := cmd.Start(); err != nil {
		return fail(name, "a parent process", err.Error())
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fail(name, "the plugin started by its parent", "no answer from the parent: "+err.Error())
	}
	pidText, dir, ok := strings.Cut(strings.TrimSpace(line), " ")
	pid, perr := strconv.Atoi(pidText)
	if !ok || perr != nil || pid <= 0 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fail(name, "the plugin started by its parent", strings.TrimSpace(line))
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	killed := time.Now()
	var running, dirLeft bool
	for {
		running, dirLeft = processRunning(pid), exists(dir)
		if !running && !dirLeft || time.Since(killed) > parentWait {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if running {
		left := fmt.Sprintf("process %d still running", pid)
		if dirLeft {
			left += ", socket directory " + dir + " still there"
		}
		killGroup(pid)
		_ = os.RemoveAll(dir)
		return fail(name, expected, left+" after "+parentWait.String())
	}
	if dirLeft {
		// The router removes it: a router sweeps the socket directories
		// of dead routers at start (supervisor.SweepSocketDirs).
		_ = os.RemoveAll(dir)
		r := pass(name, "gone "+ms(time.Since(killed))+" after its parent's SIGKILL")
		r.Warning = "the plugin exited but left its socket directory " + dir + " (docs/plugin-protocol.md §6 asks it to remove it); the next router to start on this machine removes such a directory, since its router is dead"
		return r
	}
	return pass(name, "gone, its socket directory removed, "+ms(time.Since(killed))+" after its parent's SIGKILL")
}

// exists reports whether path exists.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
