package live

import (
	"context"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/switchyard-router/switchyard/router/kubepods"
	"github.com/switchyard-router/switchyard/router/mockworker"
)

// mocksOnOnePort starts a mock engine on each of ips (loopback addresses)
// at one port, as the pods of an InferencePool listen each on its own IP
// at the same target port, and returns the port.
func mocksOnOnePort(t *testing.T, ips ...string) int {
	t.Helper()
	for range 20 {
		probe, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
		if err != nil {
			t.Fatal(err)
		}
		lns := []net.Listener{probe}
		port := probe.Addr().(*net.TCPAddr).Port
		for _, ip := range ips[1:] {
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				break // the port is taken on this address: try another
			}
			lns = append(lns, ln)
		}
		if len(lns) < len(ips) {
			for _, ln := range lns {
				_ = ln.Close()
			}
			continue
		}
		for _, ln := range lns {
			m, err := mockworker.New(mockworker.Config{Speedup: 50, BlockTokens: 16})
			if err != nil {
				t.Fatal(err)
			}
			hs := httptest.NewUnstartedServer(m)
			hs.Listener = ln
			hs.Start()
			t.Cleanup(func() { hs.CloseClientConnections(); hs.Close(); m.Close() })
		}
		return port
	}
	t.Fatalf("no port free on all of %v", ips)
	return 0
}

// readyPod is a Running, Ready pod labelled app=vllm at ip.
func readyPod(name, ip string, ready bool) *corev1.Pod {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{"app": "vllm"}},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}},
		},
	}
}

// TestDaemonPods: a Daemon whose DaemonOptions.StartPods starts a
// kubepods.Pods over client-go's fake clientset (once the policy file
// has loaded) routes to the ready pods (mock engines
// at the pods' IPs) beside its worker blocks; a pod becoming ready joins,
// a deleted one leaves, and a pod named as a worker block is refused
// with a log while the workers stay.
func TestDaemonPods(t *testing.T) {
	port := mocksOnOnePort(t, "127.0.0.2", "127.0.0.3")
	a := newMock(t, "", 50)
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	replaceFile(t, policy, daemonPolicy("rr", "a="+a.URL))

	client := fake.NewClientset(
		readyPod("vllm-0", "127.0.0.2", true),
		readyPod("vllm-1", "127.0.0.3", false),
	)
	pods, err := kubepods.New(kubepods.Options{
		Client: client.CoreV1().Pods("llm"), Namespace: "llm", Selector: "app=vllm",
		Template: kubepods.Template{Port: port, Models: []string{"m"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); <-pods.Done() })
	rd := startDaemon(t, DaemonOptions{PolicyFile: policy, StartPods: func() (WorkerSource, error) {
		if err := pods.Start(ctx); err != nil {
			return nil, err
		}
		return pods, nil
	}})

	rd.waitWorkers(t, "a", "vllm-0")
	if got := rd.split(t, 6); got["a"] != 3 || got["vllm-0"] != 3 {
		t.Errorf("round-robin split %v, want 3 each on a and vllm-0", got)
	}

	// vllm-1 becomes ready: it joins.
	podsAPI := client.CoreV1().Pods("llm")
	if _, err := podsAPI.UpdateStatus(t.Context(), readyPod("vllm-1", "127.0.0.3", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rd.waitWorkers(t, "a", "vllm-0", "vllm-1")
	if got := rd.split(t, 6); got["a"] != 2 || got["vllm-0"] != 2 || got["vllm-1"] != 2 {
		t.Errorf("round-robin split %v, want 2 each on a, vllm-0 and vllm-1", got)
	}

	// vllm-0 is deleted: it leaves.
	if err := podsAPI.Delete(t.Context(), "vllm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rd.waitWorkers(t, "a", "vllm-1")
	if got := rd.split(t, 4); got["a"] != 2 || got["vllm-1"] != 2 {
		t.Errorf("round-robin split %v, want 2 each on a and vllm-1", got)
	}

	// A pod named as the policy file's worker: the change is refused and
	// logged, the workers stay; once it is gone the pods apply again.
	if _, err := podsAPI.Create(t.Context(), readyPod("a", "127.0.0.2", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for logs := rd.logs.String(); !strings.Contains(logs, "pod change not applied") || !strings.Contains(logs, "duplicate worker"); logs = rd.logs.String() {
		if time.Now().After(deadline) {
			t.Fatalf("the clashing pod was not refused; logs:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	rd.waitWorkers(t, "a", "vllm-1")
	if err := podsAPI.Delete(t.Context(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := podsAPI.Create(t.Context(), readyPod("vllm-2", "127.0.0.2", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rd.waitWorkers(t, "a", "vllm-1", "vllm-2")
	if got := rd.split(t, 6); got["a"] != 2 || got["vllm-1"] != 2 || got["vllm-2"] != 2 {
		t.Errorf("round-robin split %v, want 2 each on a, vllm-1 and vllm-2", got)
	}
	for name, ip := range map[string]string{"vllm-1": "127.0.0.3", "vllm-2": "127.0.0.2"} {
		want := "http://" + net.JoinHostPort(ip, strconv.Itoa(port))
		if got, ok := rd.d.mgr.URL(name); !ok || got != want {
			t.Errorf("worker %s's URL %q (%v), want %q", name, got, ok, want)
		}
	}
}
