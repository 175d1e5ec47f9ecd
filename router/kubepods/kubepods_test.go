package kubepods

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// klog's flush daemon, started once per process by client-go.
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}

// eventually is how long a pod change may take to show: generous, never
// a speed assertion.
const eventually = 30 * time.Second

const ns = "llm"

// pod is a pod of namespace ns labelled app=vllm, Running and Ready at ip
// unless changed by opts.
func pod(name, ip string, opts ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "vllm", "tier": "gpu"}},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func notReady(p *corev1.Pod) { p.Status.Conditions[1].Status = corev1.ConditionFalse }

func inNamespace(n string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Namespace = n }
}

func labelled(k, v string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Labels = map[string]string{k: v} }
}

// start starts a Pods over client and returns it; it stops when the test
// ends (and the test waits for it).
func start(t *testing.T, client *fake.Clientset, o Options) *Pods {
	t.Helper()
	if o.Namespace == "" {
		o.Namespace = ns
	}
	o.Client = client.CoreV1().Pods(o.Namespace)
	if o.Selector == "" {
		o.Selector = "app=vllm,tier in (gpu,tpu)"
	}
	if o.Template.Port == 0 {
		o.Template.Port = 8000
	}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		<-p.Done()
	})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}

// worker is the worker the default template makes of a pod labelled as
// pod labels it.
func worker(name, url string) config.Worker {
	return config.Worker{Name: name, URL: url, MetricsURL: url + "/metrics", Role: shared.RoleAggregated,
		Labels: map[string]string{"app": "vllm", "tier": "gpu"}}
}

// waitWorkers waits until p's workers are want.
func waitWorkers(t *testing.T, p *Pods, want []config.Worker) {
	t.Helper()
	deadline := time.After(eventually)
	for {
		got := p.Workers()
		diff := cmp.Diff(want, got, cmpopts.EquateEmpty())
		if diff == "" {
			return
		}
		select {
		case <-p.Changes():
		case <-deadline:
			t.Fatalf("workers (-want +got):\n%s", diff)
		}
	}
}

func TestWorkersFollowPods(t *testing.T) {
	deleting := metav1.NewTime(time.Now())
	client := fake.NewClientset(
		pod("vllm-a", "10.0.0.1"),
		pod("vllm-b", "fd00::2"),
		pod("vllm-pending", "", func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }),
		pod("vllm-unready", "10.0.0.4", notReady),
		pod("vllm-noip", ""),
		pod("vllm-deleting", "10.0.0.5", func(p *corev1.Pod) {
			p.DeletionTimestamp = &deleting
			p.Finalizers = []string{"example.com/hold"}
		}),
		pod("vllm-failed", "10.0.0.6", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
		pod("vllm-elsewhere", "10.0.0.7", inNamespace("other")),
		pod("sglang-a", "10.0.0.8", labelled("app", "sglang")),
		pod("vllm-cpu", "10.0.0.9", func(p *corev1.Pod) { p.Labels["tier"] = "cpu" }),
		pod("default", "10.0.0.10"),
	)
	p := start(t, client, Options{})
	// The first list is in when Start returns.
	if diff := cmp.Diff([]config.Worker{
		worker("vllm-a", "http://10.0.0.1:8000"),
		worker("vllm-b", "http://[fd00::2]:8000"),
	}, p.Workers()); diff != "" {
		t.Fatalf("workers after Start (-want +got):\n%s", diff)
	}

	pods := client.CoreV1().Pods(ns)
	ctx := t.Context()
	update := func(name string, change func(*corev1.Pod)) {
		t.Helper()
		cur, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(cur)
		if _, err := pods.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Becoming ready: the unready pod joins; a new ready pod joins.
	update("vllm-unready", func(p *corev1.Pod) { p.Status.Conditions[1].Status = corev1.ConditionTrue })
	if _, err := pods.Create(ctx, pod("vllm-c", "10.0.0.3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Pods elsewhere or not matching change nothing.
	if _, err := client.CoreV1().Pods("other").Create(ctx, pod("vllm-z", "10.0.1.1", inNamespace("other")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, pod("sglang-b", "10.0.1.2", labelled("app", "sglang")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorkers(t, p, []config.Worker{
		worker("vllm-a", "http://10.0.0.1:8000"),
		worker("vllm-b", "http://[fd00::2]:8000"),
		worker("vllm-c", "http://10.0.0.3:8000"),
		worker("vllm-unready", "http://10.0.0.4:8000"),
	})

	// Losing readiness, an IP change, a deletion, a pod starting to be
	// deleted, and the pending pod running.
	update("vllm-a", notReady)
	update("vllm-b", func(p *corev1.Pod) { p.Status.PodIP = "10.0.0.22" })
	if err := pods.Delete(ctx, "vllm-c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	update("vllm-unready", func(p *corev1.Pod) { p.DeletionTimestamp = &deleting })
	update("vllm-pending", func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = "10.0.0.30"
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	})
	waitWorkers(t, p, []config.Worker{
		worker("vllm-b", "http://10.0.0.22:8000"),
		worker("vllm-pending", "http://10.0.0.30:8000"),
	})

	// A new label shows in the worker's labels (plugins declaring LABELS
	// see them).
	update("vllm-b", func(p *corev1.Pod) { p.Labels["zone"] = "eu-1" })
	relabelled := worker("vllm-b", "http://10.0.0.22:8000")
	relabelled.Labels["zone"] = "eu-1"
	waitWorkers(t, p, []config.Worker{relabelled, worker("vllm-pending", "http://10.0.0.30:8000")})

	// A label change takes a pod out too.
	update("vllm-b", func(p *corev1.Pod) { p.Labels["app"] = "other" })
	waitWorkers(t, p, []config.Worker{worker("vllm-pending", "http://10.0.0.30:8000")})
}

func TestTemplate(t *testing.T) {
	client := fake.NewClientset(pod("vllm-a", "10.0.0.1"), pod("vllm-b", "fd00::2"))
	p := start(t, client, Options{Template: Template{
		Port: 8001, Role: shared.RoleDecode, Models: []string{"llama", "qwen"},
		KVEventsPort: 5557, KVEventsTopic: "kv", KVEventsReplayPort: 5558,
	}})
	want := []config.Worker{
		{
			Name: "vllm-a", URL: "http://10.0.0.1:8001", MetricsURL: "http://10.0.0.1:8001/metrics",
			Role: shared.RoleDecode, Models: []string{"llama", "qwen"}, Labels: map[string]string{"app": "vllm", "tier": "gpu"},
			KVEvents: &config.KVEvents{Endpoint: "tcp://10.0.0.1:5557", Topic: "kv", ReplayEndpoint: "tcp://10.0.0.1:5558"},
		},
		{
			Name: "vllm-b", URL: "http://[fd00::2]:8001", MetricsURL: "http://[fd00::2]:8001/metrics",
			Role: shared.RoleDecode, Models: []string{"llama", "qwen"}, Labels: map[string]string{"app": "vllm", "tier": "gpu"},
			KVEvents: &config.KVEvents{Endpoint: "tcp://[fd00::2]:5557", Topic: "kv", ReplayEndpoint: "tcp://[fd00::2]:5558"},
		},
	}
	got := p.Workers()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("workers (-want +got):\n%s", diff)
	}
	// Workers returns copies: changing them changes nothing.
	got[0].Models[0] = "changed"
	got[0].KVEvents.Topic = "changed"
	got[0].Labels["app"] = "changed"
	if diff := cmp.Diff(want, p.Workers()); diff != "" {
		t.Fatalf("workers after changing a copy (-want +got):\n%s", diff)
	}
}

func TestMaxPods(t *testing.T) {
	var objs []*corev1.Pod
	for i := range 5 {
		objs = append(objs, pod(fmt.Sprintf("vllm-%d", i), fmt.Sprintf("10.0.0.%d", i+1)))
	}
	client := fake.NewClientset(objs[4], objs[2], objs[0], objs[3], objs[1])
	p := start(t, client, Options{MaxPods: 3})
	waitWorkers(t, p, []config.Worker{
		worker("vllm-0", "http://10.0.0.1:8000"),
		worker("vllm-1", "http://10.0.0.2:8000"),
		worker("vllm-2", "http://10.0.0.3:8000"),
	})
	// A pod of the first three leaving lets the fourth in.
	if err := client.CoreV1().Pods(ns).Delete(t.Context(), "vllm-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorkers(t, p, []config.Worker{
		worker("vllm-0", "http://10.0.0.1:8000"),
		worker("vllm-2", "http://10.0.0.3:8000"),
		worker("vllm-3", "http://10.0.0.4:8000"),
	})
}

// A burst of pod events ends in one state holding all of them.
func TestBurst(t *testing.T) {
	client := fake.NewClientset()
	p := start(t, client, Options{})
	var want []config.Worker
	for i := range 300 {
		name := fmt.Sprintf("vllm-%03d", i)
		ip := fmt.Sprintf("10.0.%d.%d", i/200, i%200+1)
		if _, err := client.CoreV1().Pods(ns).Create(t.Context(), pod(name, ip), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		want = append(want, worker(name, "http://"+ip+":8000"))
	}
	waitWorkers(t, p, want)
}

func TestStartCanceled(t *testing.T) {
	p, err := New(Options{Client: fake.NewClientset().CoreV1().Pods(ns), Namespace: ns, Selector: "app=vllm", Template: Template{Port: 8000}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Start(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a canceled context: %v, want context.Canceled", err)
	}
	<-p.Done()
	if err := p.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a second Start: %v, want an error", err)
	}
}

func TestNewErrors(t *testing.T) {
	client := fake.NewClientset().CoreV1().Pods(ns)
	for _, tc := range []struct {
		name string
		o    Options
		is   error
		text string
	}{
		{"empty selector", Options{Selector: " "}, ErrBadSelector, "empty"},
		{"bad selector", Options{Selector: "app in (a"}, ErrBadSelector, `"app in (a"`},
		{"bad selector key", Options{Selector: "-app=x"}, ErrBadSelector, `"-app=x"`},
		{"port 0", Options{Selector: "app=vllm"}, ErrBadPort, "port 0"},
		{"port too big", Options{Selector: "app=vllm", Template: Template{Port: 65536}}, ErrBadPort, "port 65536"},
		{"kv port", Options{Selector: "app=vllm", Template: Template{Port: 8000, KVEventsPort: -1}}, ErrBadPort, "KV events port -1"},
		{"replay without kv", Options{Selector: "app=vllm", Template: Template{Port: 8000, KVEventsReplayPort: 5558}}, nil, "replay port without"},
		{"role", Options{Selector: "app=vllm", Template: Template{Port: 8000, Role: "chef"}}, nil, `role "chef"`},
		{"models", Options{Selector: "app=vllm", Template: Template{Port: 8000, Models: []string{"a", ""}}}, nil, `models ["a" ""]`},
		{"max pods", Options{Selector: "app=vllm", Template: Template{Port: 8000}, MaxPods: -1}, nil, "MaxPods -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Client, tc.o.Namespace = client, ns
			_, err := New(tc.o)
			if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("New: %v, want an error wrapping %v containing %q", err, tc.is, tc.text)
			}
		})
	}
}

// TestNewClientOverHTTP runs NewClient's client (from a kubeconfig file)
// against an API server stand-in that speaks the pods list and watch as
// the API server does: the first list's pod and a watched one become
// workers, and the selector and namespace reach the server.
func TestNewClientOverHTTP(t *testing.T) {
	encode := func(p *corev1.Pod) []byte {
		p.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
		b, err := json.Marshal(p)
		if err != nil {
			t.Error(err)
		}
		return b
	}
	events := make(chan []byte, 1)
	queries := make(chan url.Values, 10)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/api/v1/namespaces/"+ns+"/pods" {
			http.NotFound(w, r)
			return
		}
		queries <- r.URL.Query()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") != "true" {
			list := corev1.PodList{
				TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
				ListMeta: metav1.ListMeta{ResourceVersion: "10"},
				Items:    []corev1.Pod{*pod("vllm-a", "10.0.0.1")},
			}
			_ = json.NewEncoder(w).Encode(list)
			return
		}
		w.(http.Flusher).Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case obj := <-events:
				ev, _ := json.Marshal(metav1.WatchEvent{Type: string(watch.Added), Object: runtime.RawExtension{Raw: obj}})
				_, _ = w.Write(append(ev, '\n'))
				w.(http.Flusher).Flush()
			}
		}
	}))
	t.Cleanup(hs.Close)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
contexts:
- name: test
  context:
    cluster: test
    user: test
users:
- name: test
  user: {}
current-context: test
`, hs.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	client, err := NewClient(kubeconfig, ns)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{Client: client, Namespace: ns, Selector: "app=vllm", Template: Template{Port: 8000}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); <-p.Done() })
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitWorkers(t, p, []config.Worker{worker("vllm-a", "http://10.0.0.1:8000")})
	events <- encode(pod("vllm-b", "10.0.0.2"))
	waitWorkers(t, p, []config.Worker{worker("vllm-a", "http://10.0.0.1:8000"), worker("vllm-b", "http://10.0.0.2:8000")})
	list, watchQ := <-queries, <-queries
	if got := list.Get("labelSelector"); got != "app=vllm" || list.Get("watch") != "" {
		t.Errorf("list query %v, want labelSelector=app=vllm", list)
	}
	if watchQ.Get("labelSelector") != "app=vllm" || watchQ.Get("watch") != "true" || watchQ.Get("resourceVersion") != "10" {
		t.Errorf("watch query %v, want labelSelector=app=vllm, watch=true, resourceVersion=10", watchQ)
	}
}
