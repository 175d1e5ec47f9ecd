package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/switchyard-router/switchyard/router/live"
)

// manifests reads the YAML documents of deploy/kubernetes/name by kind
// (each kind once).
func manifests(t *testing.T, name string) map[string][]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", name))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for i, doc := range strings.Split(string(b), "\n---\n") {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("%s document %d: %v", name, i+1, err)
		}
		if err := yaml.Unmarshal(js, &meta); err != nil || meta.Kind == "" {
			t.Fatalf("%s document %d: no kind (%v)", name, i+1, err)
		}
		if meta.Metadata.Namespace != "llm" {
			t.Errorf("%s %s: namespace %q, want llm", name, meta.Kind, meta.Metadata.Namespace)
		}
		if _, dup := out[meta.Kind]; dup {
			t.Fatalf("%s: two %s documents", name, meta.Kind)
		}
		out[meta.Kind] = js
	}
	return out
}

func decode[T any](t *testing.T, js []byte) T {
	t.Helper()
	var v T
	if err := yaml.UnmarshalStrict(js, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// port returns the port of a host:port flag value.
func port(t *testing.T, hostport string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

// TestDeployManifests checks deploy/kubernetes, the example docs/epp.md
// deploys: its policy file loads, its container's arguments are `router
// epp`'s flags, and names, labels and ports agree across the objects and
// with the InferencePool that points at them.
func TestDeployManifests(t *testing.T) {
	epp := manifests(t, "switchyard-epp.yaml")
	for _, k := range []string{"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service"} {
		if epp[k] == nil {
			t.Fatalf("switchyard-epp.yaml has no %s", k)
		}
	}
	sa := decode[corev1.ServiceAccount](t, epp["ServiceAccount"])
	role := decode[rbacv1.Role](t, epp["Role"])
	rb := decode[rbacv1.RoleBinding](t, epp["RoleBinding"])
	cm := decode[corev1.ConfigMap](t, epp["ConfigMap"])
	dep := decode[appsv1.Deployment](t, epp["Deployment"])
	svc := decode[corev1.Service](t, epp["Service"])

	// RBAC: the Deployment's account may get, list and watch pods.
	if dep.Spec.Template.Spec.ServiceAccountName != sa.Name || rb.Subjects[0].Name != sa.Name || rb.RoleRef.Name != role.Name {
		t.Errorf("service account %q, binding %+v of role %q", sa.Name, rb, role.Name)
	}
	if r := role.Rules[0]; !slices.Equal(r.Resources, []string{"pods"}) || !slices.Equal(r.Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("role rule %+v, want get, list, watch on pods", r)
	}

	// The container: `router epp` with flags the command accepts.
	if len(dep.Spec.Template.Spec.Containers) != 1 {
		t.Fatal("want one container")
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "epp" {
		t.Fatalf("container args %v, want epp first", c.Args)
	}
	cmd := newEPPCmd()
	if err := cmd.ParseFlags(c.Args[1:]); err != nil {
		t.Fatalf("router epp %v: %v", c.Args[1:], err)
	}
	flag := func(name string) string {
		v, err := cmd.Flags().GetString(name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	intFlag := func(name string) int {
		v, err := cmd.Flags().GetInt(name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// The policy file: mounted from the ConfigMap, and it loads.
	policy := flag("policy")
	if len(c.VolumeMounts) != 1 || filepath.Dir(policy) != c.VolumeMounts[0].MountPath {
		t.Fatalf("--policy %s is not in the mounted %+v", policy, c.VolumeMounts)
	}
	vol := dep.Spec.Template.Spec.Volumes[0]
	if vol.Name != c.VolumeMounts[0].Name || vol.ConfigMap == nil || vol.ConfigMap.Name != cm.Name {
		t.Fatalf("volume %+v is not the ConfigMap %s", vol, cm.Name)
	}
	text, ok := cm.Data[filepath.Base(policy)]
	if !ok {
		t.Fatalf("the ConfigMap has no %s", filepath.Base(policy))
	}
	path := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if code := runContext(ctx, []string{"validate", path}, &out, &errb); code != 0 {
		t.Fatalf("the ConfigMap's policy file does not load: %s%s", out.String(), errb.String())
	}

	// Ports: --listen is the grpc container port, the probes' and the
	// Service's; --http-listen the http one.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if port(t, flag("listen")) != ports["grpc"] || port(t, flag("http-listen")) != ports["http"] {
		t.Errorf("--listen %s, --http-listen %s against container ports %v", flag("listen"), flag("http-listen"), ports)
	}
	if g := c.ReadinessProbe.GRPC; g == nil || g.Port != ports["grpc"] || g.Service == nil || *g.Service != "readiness" {
		t.Errorf("readiness probe %+v, want gRPC service readiness on %d", c.ReadinessProbe, ports["grpc"])
	}
	if g := c.LivenessProbe.GRPC; g == nil || g.Port != ports["grpc"] || g.Service == nil || *g.Service != "liveness" {
		t.Errorf("liveness probe %+v, want gRPC service liveness on %d", c.LivenessProbe, ports["grpc"])
	}
	drain, err := cmd.Flags().GetDuration("drain-timeout")
	if err != nil {
		t.Fatal(err)
	}
	if g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= drain {
		t.Errorf("terminationGracePeriodSeconds %v, want more than --drain-timeout %v", g, drain)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("the Service selects %v, the pods are %v", svc.Spec.Selector, dep.Spec.Template.Labels)
	}
	var grpcPort int32
	for _, p := range svc.Spec.Ports {
		if _, ok := ports[p.TargetPort.String()]; !ok {
			t.Errorf("Service port %s targets %s, no container port", p.Name, p.TargetPort.String())
		}
		if p.TargetPort.String() == "grpc" {
			grpcPort = p.Port
		}
	}

	// The InferencePool names what the flags name, and points at the
	// Service; the route's backend is the pool.
	ip := manifests(t, "inferencepool.yaml")
	var pool struct {
		Metadata struct{ Name string }
		Spec     struct {
			Selector          struct{ MatchLabels map[string]string }
			TargetPorts       []struct{ Number int }
			EndpointPickerRef struct {
				Name        string
				Port        struct{ Number int32 }
				FailureMode string
			}
		}
	}
	if err := yaml.Unmarshal(ip["InferencePool"], &pool); err != nil {
		t.Fatal(err)
	}
	sel, err := labels.Parse(flag("pool-selector"))
	if err != nil {
		t.Fatal(err)
	}
	if want := labels.SelectorFromSet(pool.Spec.Selector.MatchLabels); sel.String() != want.String() {
		t.Errorf("--pool-selector %s, the pool selects %s", sel, want)
	}
	if len(pool.Spec.TargetPorts) != 1 || pool.Spec.TargetPorts[0].Number != intFlag("pool-port") {
		t.Errorf("--pool-port %d, the pool's target ports %v", intFlag("pool-port"), pool.Spec.TargetPorts)
	}
	if r := pool.Spec.EndpointPickerRef; r.Name != svc.Name || r.Port.Number != grpcPort || r.FailureMode != "FailOpen" {
		t.Errorf("endpointPickerRef %+v, want the Service %s port %d, failing open", r, svc.Name, grpcPort)
	}
	var route struct {
		Spec struct {
			Rules []struct {
				Matches []struct {
					Path   struct{ Type, Value string }
					Method string
				}
				BackendRefs []struct {
					Group, Kind, Name string
					Port              int32
				}
			}
		}
	}
	if err := yaml.Unmarshal(ip["HTTPRoute"], &route); err != nil {
		t.Fatal(err)
	}
	if len(route.Spec.Rules) != 3 {
		t.Fatalf("route rules %+v, want the engine endpoints', the stored responses' and pass-through's, and the fleet views'", route.Spec.Rules)
	}
	// Stored responses (GET) and the pass-through (POST under /v1) go to
	// the pool too.
	if r := route.Spec.Rules[1]; len(r.BackendRefs) != 1 || r.BackendRefs[0].Kind != "InferencePool" || len(r.Matches) != 2 ||
		r.Matches[0].Path.Type != "PathPrefix" || r.Matches[0].Path.Value != "/v1/responses" || r.Matches[0].Method != http.MethodGet ||
		r.Matches[1].Path.Type != "PathPrefix" || r.Matches[1].Path.Value != "/v1" || r.Matches[1].Method != http.MethodPost {
		t.Errorf("second rule %+v, want GET /v1/responses and POST /v1 prefixes to the pool", r)
	}
	if b := route.Spec.Rules[0].BackendRefs[0]; b.Group != "inference.networking.k8s.io" || b.Kind != "InferencePool" || b.Name != pool.Metadata.Name {
		t.Errorf("route backend %+v, want the InferencePool %s", b, pool.Metadata.Name)
	}
	// Every engine endpoint the router routes goes to the pool, as a POST.
	var routed []string
	for _, m := range route.Spec.Rules[0].Matches {
		if m.Path.Type != "Exact" || m.Method != http.MethodPost {
			t.Errorf("pool match %+v, want an Exact path and POST", m)
		}
		routed = append(routed, m.Path.Value)
	}
	var want []string
	for _, e := range live.Endpoints() {
		want = append(want, e.Path)
	}
	if !slices.Equal(routed, want) {
		t.Errorf("paths routed to the pool %q, want the engine endpoints' %q", routed, want)
	}
	// The fleet views go to the EPP's HTTP API.
	var httpPort int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "http" {
			httpPort = p.Port
		}
	}
	views := route.Spec.Rules[2]
	if b := views.BackendRefs[0]; b.Kind != "" || b.Name != svc.Name || b.Port != httpPort || httpPort == 0 {
		t.Errorf("fleet views' backend %+v, want the Service %s port %d", b, svc.Name, httpPort)
	}
	if m := views.Matches; len(m) != 1 || m[0].Path.Value != "/v1/models" || m[0].Path.Type != "PathPrefix" || m[0].Method != http.MethodGet {
		t.Errorf("fleet views' matches %+v, want GET /v1/models and below", m)
	}
	if flag("http-listen") != "0.0.0.0:"+strconv.Itoa(int(httpPort)) {
		t.Errorf("--http-listen %s, the Service's http port %d", flag("http-listen"), httpPort)
	}
}
