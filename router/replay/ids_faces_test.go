package replay

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/kubepods"
	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// TestWorkerIDsAreOneSchemeInEveryFace: a worker named sim-N has one id in
// router replay (the simulated worker N), in router serve (a worker block
// of that name, through the workers manager) and in router epp (a pod of
// that name, through pod discovery and the same manager): WorkerIDOf of
// the name. Replay's workers also carry their name and role label.
func TestWorkerIDsAreOneSchemeInEveryFace(t *testing.T) {
	const n = 4
	b := loadPolicy(t, roundRobin)
	_, d, err := execute(context.Background(), Options{PolicyName: "rr", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t",
		Records: []trace.Record{{InputLength: 10, OutputLength: 2}}, Workers: n})
	if err != nil {
		t.Fatal(err)
	}
	replayIDs := map[string]shared.WorkerID{}
	for x, w := range d.reps[0].workers {
		name := "sim-" + strconv.Itoa(x)
		if w.Name != name {
			t.Fatalf("replay worker %d is named %q, want %q", x, w.Name, name)
		}
		if v, _ := w.AllLabels.Get(shared.LabelRole); v != "aggregated" {
			t.Errorf("replay worker %s: role label %q, want aggregated", name, v)
		}
		replayIDs[name] = w.ID
	}

	// serve: worker blocks of the same names.
	var src string
	for x := range n {
		src += fmt.Sprintf("worker \"sim-%d\" {\n  url = \"http://127.0.0.1:9\"\n}\n", x)
	}
	ws, diags := config.ParseWorkers("w.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	serveIDs := managerIDs(t, ws)

	// epp: pods of the same names, found by pod discovery.
	var objs []runtime.Object
	for x := range n {
		objs = append(objs, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "sim-" + strconv.Itoa(x), Namespace: "llm", Labels: map[string]string{"app": "vllm"}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0." + strconv.Itoa(x+1),
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		})
	}
	client := fake.NewClientset(objs...)
	pods, err := kubepods.New(kubepods.Options{Client: client.CoreV1().Pods("llm"), Namespace: "llm", Selector: "app=vllm",
		Template: kubepods.Template{Port: 8000}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); <-pods.Done() }()
	if err := pods.Start(ctx); err != nil {
		t.Fatal(err)
	}
	eppIDs := managerIDs(t, pods.Workers())

	for x := range n {
		name := "sim-" + strconv.Itoa(x)
		want := shared.WorkerIDOf(name)
		if replayIDs[name] != want || serveIDs[name] != want || eppIDs[name] != want {
			t.Errorf("%s: replay id %d, serve %d, epp %d; want WorkerIDOf = %d", name, replayIDs[name], serveIDs[name], eppIDs[name], want)
		}
	}
}

// managerIDs syncs ws into a workers manager (the membership router
// serve and router epp use) and returns each worker's id by name.
func managerIDs(t *testing.T, ws []config.Worker) map[string]shared.WorkerID {
	t.Helper()
	r, err := router.New(router.Options{BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	m, err := workers.NewManager(r, workers.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Sync(ws); err != nil {
		t.Fatal(err)
	}
	out := map[string]shared.WorkerID{}
	for _, w := range ws {
		st, ok := m.StatusOf(w.Name)
		if !ok {
			t.Fatalf("no status of %s", w.Name)
		}
		out[w.Name] = st.ID
	}
	return out
}
