# Kiln: build, test and run locally. `make test` is what CI runs.
# Targets that touch containerd, runc or apt need root.

SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin

# Integration suites (redis, NATS, containerd) fail instead of skipping when a
# dependency is missing. Override with KILN_INTEGRATION=... in the environment.
KILN_INTEGRATION ?= require
export KILN_INTEGRATION

GO ?= go

.PHONY: deps containerd redis image image-reproducible build init vet test test-cgroup2 bench up down go-check sdk-deps sdk

go-check:
	@command -v $(GO) >/dev/null || { echo "make: go not found on PATH or in /usr/local/go/bin; install Go (see go.mod for the version)" >&2; exit 1; }

deps:
	bash deploy/local/deps.sh
	bash deploy/local/runc.sh
	bash deploy/local/containerd-build.sh
	bash deploy/local/runsc.sh

containerd: deps
	bash deploy/local/containerd.sh

redis: deps
	bash deploy/local/redis.sh

# Runtimes the default worker serves (kiln worker --runtimes; keep in step
# with sandbox.RuntimesDefault) and `make image` builds; one recipe folder
# each under deploy/images/. `make image RUNTIME=node` builds just one.
RUNTIMES ?= python python-slim node
RUNTIME ?=

image: containerd init
	@for r in $(or $(RUNTIME),$(RUNTIMES)); do bash deploy/images/build.sh $$r || exit 1; done

# Builds python-slim twice from scratch into two fresh caches and compares
# the image digests (also run by TestImageReproducible under `make test`).
image-reproducible: containerd
	bash deploy/images/reproducible.sh python-slim

# kiln-init, every sandbox's pid 1, bind-mounted read-only into each sandbox
# by the worker from KILN_INIT (default /usr/local/lib/kiln/kiln-init). Static
# and reproducible. Beside it the jail library (sandbox/jail), which every
# box's zygote calls to make each job's inner sandbox, built with the host's
# gcc and bound read-only into every box from KILN_JAIL (the worker reads
# the same variable; default /usr/local/lib/kiln/libkilnjail.so).
KILN_INIT ?= /usr/local/lib/kiln/kiln-init
KILN_JAIL ?= /usr/local/lib/kiln/libkilnjail.so
init: go-check
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w -buildid=' -o bin/kiln-init ./cmd/kiln-init
	install -D -m 0755 bin/kiln-init $(KILN_INIT)
	bash sandbox/jail/csrc/build.sh bin/libkilnjail.so
	install -D -m 0644 bin/libkilnjail.so $(KILN_JAIL)

build: go-check
	CGO_ENABLED=0 $(GO) build -o bin/kiln ./cmd/kiln
	$(GO) build ./...

vet: go-check
	@files=$$(find . -name '*.go' -not -path './.cache/*' -not -path './.git/*' -print0 | xargs -0 -r gofmt -l); \
	if [ -n "$$files" ]; then echo "gofmt: these files need formatting:" >&2; echo "$$files" >&2; exit 1; fi
	$(GO) vet ./...
	@dead=$$($(GO) tool deadcode -test ./... | grep -v ': unreachable func: Example'); \
	if [ -n "$$dead" ]; then echo "deadcode: these functions have no caller:" >&2; echo "$$dead" >&2; exit 1; fi

# The sandbox suites run every python job in a box (the default path). The
# profile probes and hostile programs run again on the two fallbacks: a
# container per job (fresh) and one prepared before its job (pooled), and
# under gVisor (a container per job on runsc), where node's profile,
# programs and hostile suites run too (NODE_SUITE).
PATH_SUITE ?= TestHostile|TestSandboxProfile|TestPerJobUserLimits|TestIsolation|TestRunHello|TestCancel|TestHostOOM|TestPool
NODE_SUITE ?= TestNodeSandboxProfile|TestNodePrograms|TestNodeHostile
# The TypeScript SDK's devDependencies (the official MCP SDK client that
# internal/e2e's MCP suite drives, openapi-typescript and typescript for the
# generated types), and what the docs' examples run with npx (the MCP
# inspector's CLI; internal/e2e TestDocsExamples), and E2B's code-interpreter
# SDK at the two releases internal/e2e TestE2BContract drives, as their lock
# files pin them.
sdk-deps: deps
	command -v npm >/dev/null || apt-get install -y --no-install-recommends npm
	cd sdk/typescript && npm ci --no-audit --no-fund --loglevel=error
	cd internal/e2e/testdata/docs-npm && npm ci --no-audit --no-fund --loglevel=error
	cd internal/e2e/testdata/e2b-npm && npm ci --no-audit --no-fund --loglevel=error

# The SDKs' generated files (wire types, error tables) from
# producer/openapi.json: run after changing the document. internal/sdkgen's
# test fails when they drift.
sdk: sdk-deps go-check
	$(GO) run ./internal/sdkgen

test: deps containerd image sdk-deps go-check
	$(MAKE) vet
	$(GO) test -race -count=1 -timeout 40m ./...
	KILN_SANDBOX_PATH=pooled $(GO) test -race -count=1 -timeout 20m -run '$(PATH_SUITE)' ./sandbox/
	KILN_SANDBOX_PATH=fresh $(GO) test -race -count=1 -timeout 20m -run '$(PATH_SUITE)' ./sandbox/
	KILN_SANDBOX_ISOLATION=gvisor $(GO) test -race -count=1 -timeout 20m -run '$(PATH_SUITE)|$(NODE_SUITE)' ./sandbox/
	$(MAKE) test-cgroup2

# The sandbox suites that touch cgroups, again on a cgroup v2 host: a guest
# kernel booted with cgroup_no_v1=all (qemu, emulated; KILN_VM_ACCEL=kvm where
# nested KVM works), over this host's own files, containerd, runc and images.
# README: "cgroup v1 and v2".
CGROUP2_SUITE ?= TestRunHello|TestHostile|TestSandboxProfile|TestPerJobUserLimits|TestCancel|TestHostOOM|TestPoolArms|TestPoolPreloadIsNotTheJobs|TestPoolLeaves|TestPoolSpan|TestBoxRuns|TestBoxServesEveryTenant|TestBoxDedicated|TestBoxJobsHave|TestBoxJobsSee|TestBoxSupervisors|TestBoxCPULimit|TestBoxMemoryIsTheJobs|TestSpans|TestInitWallClockLimit|TestRuncPinned|TestReadMemoryPeak|TestDecodeMetrics|TestProgramErrors|TestCgroupDirShapes
test-cgroup2: deps image go-check
	bash deploy/local/cgroup2-vm.sh -test.run '$(CGROUP2_SUITE)' -test.v

# The pipeline rows start their own redis-server (installed by deps) and
# embedded NATS; containerd and the image come from image. Pass flags with
# e.g. make bench BENCH_FLAGS='-n 50 -pipeline=false'.
BENCH_FLAGS ?=
bench: deps image build
	$(GO) run ./cmd/kiln-bench $(BENCH_FLAGS)

up: image redis build
	bash deploy/local/up.sh

down:
	bash deploy/local/down.sh
