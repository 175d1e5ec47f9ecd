# Switchyard developer targets. Everything a fresh machine lacks is installed
# here through the Go module proxy (staticcheck) or apt (protoc, Python's gRPC).

GO          ?= go
BIN         := bin
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
PKGS        := ./...
# The plugin SDK is a module of its own (shared/go.mod), which the root
# module's ./... does not reach: test, vet and lint run there too.
SDK         := shared
# Debian's Python, which has the Debian packages below (not a pyenv shim).
PYTHON      := /usr/bin/python3
PYTHON_DEBS := python3-grpcio python3-protobuf

.PHONY: all build test python-deps browser-deps sdk-deps test-under-load vet fmt-check lint bench bench-epp bench-replicas bench-failover bench-serve chaos bench-migration demo-replicas bench-overlap bench-fleet bench-fleet-smoke demo demo-serve proto proto-check clean

all: build

# BUILDVCS stamps the commit into the binaries (`router version`) even where
# GOFLAGS has -buildvcs=false: -buildvcs=true, but only in a git work tree
# whose git directory is its own. A linked worktree (git worktree add: its
# --git-dir differs from --git-common-dir) gets no VCS stamp from go build
# (golang/go#58218), nor does a tree outside git; both build without it.
BUILDVCS := $(shell gd=$$(git rev-parse --git-dir 2>/dev/null) && [ "$$gd" = "$$(git rev-parse --git-common-dir 2>/dev/null)" ] && echo -buildvcs=true)

## build: the router, the template plugin and the example plugins into bin/
## (with the commit stamped in when the tree is a git checkout: BUILDVCS)
build:
	$(GO) build $(BUILDVCS) -o $(BIN)/ ./cmd/... ./examples/disagg-filter-score-pick ./examples/soft-pin-repin

## test: gofmt check, go vet, every Go test of both modules (the router's and
## the SDK's, shared/) under the race detector, and the
## Python SDK's and scripts/' unit tests (installs the Debian packages they and the Go tests
## that start the Python example plugin need, when missing, and Chromium for
## the HTML report's browser test, which then must run: SWITCHYARD_REQUIRE_BROWSER=1),
## and the Node SDKs of scripts/sdk-check that cmd/router's TestServeE2ESDKs runs.
## A package may take 30 minutes: cmd/router's real-process tests take about 4 on an idle
## 2-core machine and more than 10 (go test's default) under stress-ng.
test: fmt-check vet python-deps browser-deps sdk-deps
	SWITCHYARD_REQUIRE_BROWSER=1 $(GO) test -race -count=1 -timeout 30m $(PKGS)
	$(GO) -C $(SDK) test -race -count=1 $(PKGS)
	$(PYTHON) -m unittest discover -s sdk/python/tests -t sdk/python
	$(PYTHON) -m unittest discover -s scripts -p 'test_*.py'

## python-deps: Debian's Python gRPC and protobuf, for sdk/python
python-deps:
	scripts/apt-install.sh $(PYTHON_DEBS)

## browser-deps: Debian's chromium, for the HTML report's browser test
## (router/replay/report/htmlreport; screenshots go to SWITCHYARD_ARTIFACTS when set)
browser-deps:
	scripts/apt-install.sh chromium

## sdk-deps: the official OpenAI and Anthropic Node SDKs pinned by
## scripts/sdk-check/package-lock.json (npm ci into scripts/sdk-check/node_modules;
## Node.js >= 20 and npm, Debian's when node is missing), for cmd/router's TestServeE2ESDKs,
## and examples/node-plugin's @grpc/grpc-js and @grpc/proto-loader (its package-lock.json),
## for TestPluginsCheckNodeExample and TestReplayNodeExample
sdk-deps:
	scripts/sdk-check/install.sh

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)
	$(GO) -C $(SDK) vet $(PKGS)

## test-under-load: `make test` three times while stress-ng --cpu 4
## saturates the machine (tests assert behaviour, never speed)
test-under-load:
	scripts/test-under-load.sh

## lint: staticcheck, pinned, fetched through the module proxy
lint:
	$(GO) run $(STATICCHECK) $(PKGS)
	$(GO) -C $(SDK) run $(STATICCHECK) $(PKGS)

## bench: the selection and replay benchmarks (see BENCHMARKS.md)
bench:
	$(GO) test -run='^$$' -bench=. -benchmem -count=1 ./hosted/ ./builtin/ ./router/...

## bench-overlap: the router's belief of each request's cached prefix
## (precise, from the engines' KV events, and approximate) against what
## three mock engines served, on 2,000 requests with evictions (about a minute)
bench-overlap: build
	$(GO) run ./bench/overlap --router-bin $(BIN)/router

## bench-fleet: three vLLM-like mock engines given by URL only (LoRA, cache_salt,
## evictions) behind `router serve`: follow-ups served with their previous prompt
## cached, LoRA and salted repeats at the holder, the router's believed blocks
## against the engines' caches; a router restarted in front of engines past
## their replay buffer, with snapshots (time to an exact belief) and without.
## Three runs, medians and ranges (about 4 minutes). bench-fleet-smoke: one
## short run (under a minute on an idle machine).
bench-fleet: build
	$(GO) run ./bench/fleet --router-bin $(BIN)/router --runs 3

bench-fleet-smoke: build
	$(GO) run ./bench/fleet --router-bin $(BIN)/router --smoke

## bench-epp: the endpoint picker's decision latency (p50, p99) and
## decisions per second at 64 ext_proc streams over 100 endpoints, at 1
## and 2 cores (about 30 seconds)
bench-epp:
	$(GO) test -run='^$$' -bench=BenchmarkDecision100Endpoints -benchmem -benchtime=5s -cpu=1,2 -count=1 ./router/epp/

## bench-replicas: the KV hit ratio of 3 router replicas sharing over NATS
## (and of 3 that do not) against one router, on a multi-turn workload sent
## to the routers in turn (about 3.5 minutes)
bench-replicas: build
	$(GO) run ./bench/replicas --router-bin $(BIN)/router

## bench-failover: 3 replicas over NATS, one SIGKILLed under load and
## restarted (bench/replicas --failover): hit ratio before and after,
## failures at the survivors, booking expiry, warm restart
bench-failover: build
	$(GO) run ./bench/replicas --router-bin $(BIN)/router --failover

## chaos: the fault matrix of `router serve` against real processes (bench/chaos):
## engines and the plugin killed and stopped, reloads, engines moved, clients
## leaving, a body-budget attack, SIGTERM under load; then the router back at
## rest (bookings, queue, descriptors, goroutines). Three runs, about 10 minutes.
chaos: build
	$(GO) run ./bench/chaos --router-bin $(BIN)/router --plugin-bin $(BIN)/plugin-example --runs 3

## bench-migration: what request migration costs (bench/migration): the gap a
## client sees across a cut stream (reset, close, kill -9), 200 each, and the
## router's memory per stream in flight, migration on and off (about 3 minutes)
bench-migration: build
	$(GO) run ./bench/migration --router-bin $(BIN)/router

## demo-replicas: three `router serve` replicas behind HAProxy sharing over
## Debian's nats-server (both installed when missing), three mock engines,
## a multi-turn workload: the KV hit ratio with sync on and off (about 4 minutes)
demo-replicas:
	scripts/demo-replicas.sh

## bench-serve: loopback load on `router serve` against direct and a bare
## httputil.ReverseProxy, with the issue's targets checked, and the router's
## added latency on /v1/responses and /v1/embeddings, one client (about two minutes)
bench-serve:
	scripts/bench-serve.sh

## demo: compare round-robin, power-of-two, least-loaded, the two KV-aware
## policies (kv-cost, and the default kv-affinity) and the queue-depth scorer served by the template plugin
## (cmd/plugin-example, out of process) on the bundled Mooncake
## conversation trace (8 simulated workers); writes the HTML report bin/demo-report.html
## and prints its path
demo: build
	$(BIN)/router replay --compare examples/policies/round-robin.hcl,examples/policies/power-of-two.hcl,examples/policies/least-loaded.hcl,examples/policies/kv.hcl,examples/policies/kv-affinity.hcl,examples/policies/plugin-example.hcl --html $(BIN)/demo-report.html

## demo-serve: three mock engines and `router serve` on loopback, a burst of
## chat requests, then the per-worker split and the router's metrics
demo-serve: build
	scripts/demo-serve.sh

## proto: regenerate shared/pluginproto and the Python SDK's sdk/python/switchyard_plugin/_pb
## (installs protoc and grpc_python_plugin from Debian and the pinned
## protoc-gen-go / protoc-gen-go-grpc through the module proxy)
proto:
	scripts/proto.sh

## proto-check: fail when the committed generated code is stale
proto-check:
	scripts/proto.sh --check

clean:
	rm -rf $(BIN)
