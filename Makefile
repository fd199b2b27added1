# a2a: make demo (the main job), make test (what CI runs), make bench, make build.
GO       ?= go
BIN      := bin
A2AD     := $(BIN)/a2ad
# Packages whose tests run under the race detector within the time budget: the
# commands one by one, as cmd/a2ad's are not among them.
# go test runs two packages at a time (one per core) in the order named, a package
# matched twice once: the longest go first, so that no long one starts near the end
# (on 2 cores, named last the race run's dispatch started at 346 s of 474).
# Left out: internal/modtest, cmd/a2acheck and cmd/soak, whose tests build programs without
# -race and start them, so the detector would watch only the test's own exec and reads
# (49 s of the race run's CPU on 2 cores). Recursive (=): go list runs only when make unit does.
RACE_PKGS = ./a2a ./dispatch/... ./a2a/transport/shm ./a2a/transport/tcp ./a2a/algo ./examples/... \
	./a2a/... $(filter-out %/internal/modtest,$(shell $(GO) list ./internal/...)) ./cmd/delayswitch ./routing/...
PKGS      := ./a2a ./dispatch/... ./cmd/a2ad ./internal/natscluster ./a2a/control ./examples/... ./...

.PHONY: all build demo test deps fmt-check vet unit bench bench-go bench-a2ad compare clean test-hosts test-hosts-if-root
.PHONY: test-docs test-rdma test-rdma-if-root bench-rdma soak soak-short test-link-cut test-link-cut-if-root

all: build

build:
	$(GO) build $(PKGS)
	$(GO) build -o $(A2AD) ./cmd/a2ad
	$(GO) build -o $(BIN)/moe ./examples/moe
	$(GO) build -o $(BIN)/delayswitch ./cmd/delayswitch
	$(GO) build -o $(BIN)/soak ./cmd/soak
	$(GO) build -o $(BIN)/compareplot ./cmd/compareplot

# The main job: the MoE expert-routing demo on 4 local ranks (route, dispatch,
# expert FFNs, combine, verified against a single-process reference). It
# builds only the program it runs.
demo:
	$(GO) build -o $(BIN)/moe ./examples/moe
	$(BIN)/moe -n 4

deps:
	./scripts/deps.sh

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

# The race run's timeout is a hang guard per package: package a2a alone takes 260 s under
# -race on 2 cores, and more beside the other packages, so 300 s was no margin.
unit: build
	$(GO) test -count=1 -timeout 300s $(PKGS)
	$(GO) test -count=1 -race -timeout 600s $(RACE_PKGS)

# The documented commands (internal/doctest, docs/TESTING.md): every sh and console block of
# README.md, docs/*.md and examples/*/README.md, as written, in the repository root, except
# those a doc-test comment skips (with its reason) or gives to a test of their own.
test-docs: build
	$(GO) test -count=1 -timeout 600s -run '^TestDocs$$' ./internal/doctest -args -docs

# Multi-host test bed: H network namespaces joined by a bridge (root; installs iproute2).
TESTBED := ./scripts/testbed.sh -H 4 -L 2 --bench-sizes 1K,64K --algos pairwise,fullmesh,staged,skew,ll

test-hosts: build
	$(TESTBED)

# What make test runs: the test bed where network namespaces can be made (root, as CI).
test-hosts-if-root: build
	@if [ "$$(id -u)" = 0 ]; then echo "$(TESTBED)"; $(TESTBED); \
	else echo "test-hosts: skipped: needs root for network namespaces"; fi

# RDMA over Soft-RoCE in a qemu guest (scripts/rdma-lab.sh; docs/RDMA-LAB.md). The guest has
# no Go: test binaries are built here into bin/rdma-tests/, scripts/rdma-tests.sh runs them.
# The layout check of the verbs binding against verbs.h runs here (the lab installs it).
test-rdma: build
	./scripts/rdma-lab.sh setup
	A2A_IBV_HEADERS=1 $(GO) test -count=1 -run 'Layout' ./verbs
	@mkdir -p $(BIN)/rdma-tests
	$(GO) test -c -o $(BIN)/rdma-tests/verbs.test ./verbs
	$(GO) test -c -o $(BIN)/rdma-tests/transport-verbs.test ./a2a/transport/verbs
	$(GO) build -o $(BIN)/rdma-tests/a2acheck ./cmd/a2acheck
	$(GO) test -count=1 -run TestBuildOutsideTheRepository ./internal/modtest -args -newcomer-out $(abspath $(BIN))/rdma-tests/newcomer
	./scripts/rdma-lab.sh run -- scripts/rdma-tests.sh

# The verbs benchmark against perftest and TCP in the lab (docs/RDMA-LAB.md; not part of make test).
bench-rdma: build
	./scripts/rdma-lab.sh setup
	@mkdir -p $(BIN)/rdma-tests
	$(GO) test -c -o $(BIN)/rdma-tests/verbs.test ./verbs
	$(GO) test -c -o $(BIN)/rdma-tests/transport-verbs.test ./a2a/transport/verbs
	./scripts/rdma-lab.sh run -- scripts/rdma-bench.sh

# What make test runs: the lab where its packages can be installed (root, as CI).
test-rdma-if-root:
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory test-rdma; \
	else echo "test-rdma: skipped: needs root to install qemu and the lab's packages (run make test-rdma as root)"; fi

# Soak (cmd/soak; docs/TESTING.md): random verified operations on 4 rank processes,
# sessions mixing data planes and algorithms, then leak checks (goroutines, fds, /dev/shm,
# live heap < +2% after warm-up). Half the time on one machine (one posed host on shm or tcp, or
# two posed hosts), half across the test bed's network namespaces (as root). The seed is
# printed; SOAK_SEED=N reruns one.
SOAK_LOCAL ?= 5m
SOAK_HOSTS ?= 5m
SOAK_SEED  ?= 0
# What make test runs: 30 s of the soak (15 s local, 15 s across namespaces as root).
soak-short: SOAK_LOCAL = 15s
soak-short: SOAK_HOSTS = 15s
soak soak-short: build
	$(BIN)/soak --n 4 --duration $(SOAK_LOCAL) --seed $(SOAK_SEED)
	@if [ "$$(id -u)" = 0 ]; then ./scripts/testbed.sh -H 2 -L 2 --soak $(SOAK_HOSTS) $$( [ "$(SOAK_SEED)" = 0 ] || echo --seed $(SOAK_SEED)); \
	else echo "soak: the test bed half skipped: needs root for network namespaces"; fi

# Link cut (docs/FAILURES.md): a host's link goes down mid-operation in the test bed; every
# rank must get a typed error within 3 s, then join again once it is back (root).
test-link-cut: build
	./scripts/testbed.sh -H 2 -L 2 --link-cut

test-link-cut-if-root: build
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory test-link-cut; \
	else echo "test-link-cut: skipped: needs root for network namespaces"; fi

test: deps fmt-check vet unit test-docs test-hosts-if-root test-rdma-if-root soak-short test-link-cut-if-root fuzz-short

# Every go test -fuzz target for 3 s each, one after the other (about a
# minute): make test runs it. make fuzz runs each for FUZZTIME (default 5m;
# make fuzz FUZZTIME=1h, or scripts/fuzz-short.sh -t 1h FuzzMessages for one).
FUZZTIME ?= 5m
.PHONY: fuzz fuzz-short
fuzz-short:
	./scripts/fuzz-short.sh -t 3s

fuzz:
	./scripts/fuzz-short.sh -t $(FUZZTIME)

bench: bench-go bench-a2ad

bench-go:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2000x ./a2a/...
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 20x ./dispatch/

# Open MPI against a2a on this machine, one run (installs Open MPI on first use).
# make compare: the sweep 8 B..1 MiB, 3 rounds, a2a with registered and with unregistered
# buffers (about 7 minutes on 2 cores);
# make compare COMPARE=--quick: 8 B, 64 KiB, 1 MiB;
# make compare COMPARE=--plot (or "--quick --plot"): also the SVG of the ratios against size,
# bin/compare.svg, beside the table in bin/compare.txt (cmd/compareplot).
compare: build
	./scripts/compare-mpi.sh $(COMPARE)

bench-a2ad: build
	$(A2AD) bench -n 2 --sizes 8:1M --check
	$(A2AD) bench -n 4 --sizes 8:1M --check

clean:
	rm -rf $(BIN)

# The control-plane flood (TestControlFlood, once in make test) 10 times: a client
# with the job's NATS credentials but not its secret attacks a verified 4-rank loop.
.PHONY: flood
flood:
	$(GO) test -count=1 -run '^TestControlFlood$$' -v ./a2a/ -args -flood-runs 10
