# onceflow — run `make help` for the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO      ?= go
BIN     := bin
PKGS    := ./...
# Packages that start goroutines; `make test` runs them under the race detector.
RACE_PKGS := ./pipeline/...
TEST_TIMEOUT ?= 30m
# The linters, pinned, run from the module proxy rather than as tool
# dependencies of go.mod (DEVELOPERS.md, Static analysis).
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOSEC       := github.com/securego/gosec/v2/cmd/gosec@v2.30.0
# gosec's rules left out, each for its reason:
#   G104  unchecked errors: the ones left unchecked are best effort on
#         purpose (Close of a read, a write to a client that left, a
#         rollback in a defer) and reviewed as code; go vet and staticcheck
#         catch the ones that matter (SA4006, SA5001...);
#   G115  narrowing integer conversions: onceflow's are bit layouts (ids,
#         hashes, varints, wire headers) or values bounded where they come
#         in (configuration checked at start, decoders fuzzed);
# and test/ and bench/ (the end-to-end, chaos and benchmark harnesses, which
# build and start the binaries they test, and write their logs and reports
# where they are told; bench/ is a module of its own that gosec, walking
# directories, would otherwise read as this one's), and deploy/ (the Helm
# chart's tests, a module of their own too).
GOSEC_FLAGS := -quiet -exclude=G104,G115 -exclude-dir=test -exclude-dir=bench -exclude-dir=deploy
BENCH_TIME   ?= 1x
# PG_URL sets url to the Postgres the tests use: DATABASE_URL when it
# answers, else the private cluster's. `onceflow postgres up` prints a
# DATABASE_URL with its password masked (xxxxx); the tests then take
# DATABASE_URL itself.
PG_URL = url=$$($(BIN)/onceflow postgres up | tail -n 1) && case "$$url" in *xxxxx*) url="$$DATABASE_URL";; esac

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_\/-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build every binary into bin/
	$(GO) build -o $(BIN)/ ./cmd/...

.PHONY: pg-up
pg-up: build ## start (or reuse) the private Postgres cluster in .data/postgres and print its URL
	@$(BIN)/onceflow postgres up

.PHONY: pg-down
pg-down: build ## stop the private Postgres cluster
	@$(BIN)/onceflow postgres down

# The local Apache Kafka cluster (test/kafkacluster): KAFKA_NODES nodes,
# node i's broker on 127.0.0.1:KAFKA_PORT+2(i-1).
KAFKA_NODES ?= 1
KAFKA_PORT  ?= 19092
KAFKACTL = $(GO) build -o $(BIN)/kafkactl ./test/kafkacluster/kafkactl && $(BIN)/kafkactl

.PHONY: kafka-up
kafka-up: ## start (or reuse) Apache Kafka as JVM processes: KAFKA_NODES=1|3, KAFKA_PORT=19092, KAFKA_SECURE=1 for SASL_SSL, a user per component and ACLs; prints the bootstrap address last
	@$(KAFKACTL) up -nodes $(KAFKA_NODES) -port $(KAFKA_PORT) $(if $(KAFKA_SECURE),-secure)

.PHONY: kafka-down
kafka-down: ## stop the local Apache Kafka cluster (SIGTERM, SIGKILL after 30s); its topics stay in .data/apache-kafka
	@$(KAFKACTL) down

.PHONY: kafka-logs
kafka-logs: ## where the local Apache Kafka nodes write their logs
	@$(KAFKACTL) logs

# make test runs on the embedded broker whatever KAFKA_BROKERS says
# (test-kafka is the suite on Apache Kafka).
.PHONY: test
test: build ## run every test (race detector on the pipeline packages) against Postgres and the embedded broker
	@$(PG_URL) && export KAFKA_BROKERS= && \
	DATABASE_URL="$$url" $(GO) test -race -timeout $(TEST_TIMEOUT) $(RACE_PKGS) && \
	DATABASE_URL="$$url" $(GO) test -timeout $(TEST_TIMEOUT) $$($(GO) list $(PKGS) | grep -v -e '/pipeline' -e '/test/docs$$') && \
	cd bench && DATABASE_URL="$$url" $(GO) test -mod=mod -timeout $(TEST_TIMEOUT) ./... && \
	cd .. && $(MAKE) --no-print-directory test-helm

# deploy/helm is a module of its own (Helm's library and Kubernetes' API
# types stay out of onceflow's go.mod): the chart rendered, decoded
# strictly and linted; its tests read the settings from bin/onceflow -h.
# The first build of Kubernetes' packages takes 2-3 minutes on two cores.
.PHONY: test-helm
test-helm: build ## the Helm chart's tests (deploy/helm): rendered with Helm's library, decoded into Kubernetes' types, linted
	cd deploy/helm && ONCEFLOW_BIN=$(abspath $(BIN))/onceflow $(GO) test -timeout $(TEST_TIMEOUT) ./...

# The suites that run on Apache Kafka when KAFKA_BROKERS names it
# (docs/decisions/0054-kafka-brokers-and-the-suites.md), one package at
# a time: they share the cluster and the ledger's consumer groups.
KAFKA_TEST_PKGS ?= ./test/e2e/ ./test/consumers/

.PHONY: test-kafka
test-kafka: build ## the end-to-end and consumers' tests on Apache Kafka: KAFKA_BROKERS if set, else a node of their own
	@$(PG_URL) && brokers="$$KAFKA_BROKERS" && \
	if [ -z "$$brokers" ]; then \
	  out=$$($(KAFKACTL) up -dir .data/apache-kafka/test -cache .data/apache-kafka -port 0) || { echo "$$out"; exit 1; }; \
	  echo "$$out"; brokers=$$(echo "$$out" | tail -n 1); \
	  trap '$(BIN)/kafkactl down -dir .data/apache-kafka/test' EXIT; \
	fi && \
	KAFKA_BROKERS="$$brokers" DATABASE_URL="$$url" $(GO) test -p 1 -timeout $(TEST_TIMEOUT) $(KAFKA_TEST_PKGS)

# The compose stack with podman (docs/deploy.md#the-local-stack): the
# images built from the repository, Debian's packages and Maven Central
# (scripts/images.sh; the base and the third-party stand-ins once, cached
# in podman's store and .data/stack), then started in order on 127.0.0.1
# (scripts/stack.sh). make test-stack brings it up, runs test/stack and
# takes it down, even when the test fails.
.PHONY: images
images: ## build the local stack's images with podman: onceflow's and Debian-built stand-ins for Kafka, Postgres, Prometheus, nginx
	@scripts/images.sh

.PHONY: stack-up
stack-up: images ## start the compose stack with podman-compose and the local images, published on 127.0.0.1 (STACK_HTTP_PORT=38080, STACK_PROMETHEUS_PORT=39090)
	@scripts/stack.sh up

.PHONY: stack-down
stack-down: ## remove the compose stack's containers, network and volumes
	@scripts/stack.sh down

.PHONY: test-stack
test-stack: ## the compose stack started for real: the demo through nginx on the secured Kafka, Prometheus, a component and Kafka killed mid-traffic
	@command -v podman >/dev/null || { echo "test-stack: podman is not installed (.ci/run installs it)"; exit 1; }
	@scripts/images.sh && ONCEFLOW_STACK=1 $(GO) test -count=1 -v -timeout 30m ./test/stack/

.PHONY: test/race
test/race: build ## run every test under the race detector
	@$(PG_URL) && \
	DATABASE_URL="$$url" $(GO) test -race -timeout $(TEST_TIMEOUT) $(PKGS)

.PHONY: test/short
test/short: build ## unit tests only (skips the multi-process end-to-end tests)
	@$(PG_URL) && \
	DATABASE_URL="$$url" $(GO) test -short -timeout $(TEST_TIMEOUT) $(PKGS)

.PHONY: chaos
chaos: ## crash-and-duplicate harness with the bank invariant: make chaos DURATION=10m [SEED=n] [FAULTS=kill,broker,...]
	$(GO) test -count=1 -v -timeout 0 -run TestChaos ./test/chaos -args \
	  -chaos.duration=$(or $(DURATION),2m) $(if $(SEED),-chaos.seed=$(SEED)) $(if $(FAULTS),-chaos.faults=$(FAULTS))

# The same harness on three nodes of Apache Kafka of its own (replication
# factor 3, min.insync.replicas 2), the broker's faults the real ones; CI
# runs it for 2 minutes (test/chaos/doc.go).
.PHONY: chaos-kafka
chaos-kafka: ## the chaos harness on three Apache Kafka nodes with real faults: make chaos-kafka DURATION=10m [SEED=n] [FAULTS=coordinator,leader,nodepause,rolling,...]
	$(GO) test -count=1 -v -timeout 0 -run 'TestChaos$$' ./test/chaos -args -chaos.kafka \
	  -chaos.duration=$(or $(DURATION),2m) -chaos.seeds=$(or $(SEED),1) $(if $(FAULTS),-chaos.faults=$(FAULTS)) $(if $(CHAOS_KAFKA_PORT),-chaos.kafka.port=$(CHAOS_KAFKA_PORT))

.PHONY: soak
soak: build ## run the tests that once lost a command many times under -race and load: make soak SOAK=300 [SOAK_LOAD=copies|hog|none] (docs/soak.md)
	@$(PG_URL) && DATABASE_URL="$$url" scripts/soak.sh

.PHONY: soak-capped
soak-capped: build ## a capped tenant beside another for SOAK_CAPPED (default 10m; 60s for a short one): snoozed fan-outs, the other's delivery p99 against its baseline (docs/webhooks.md)
	@$(PG_URL) && DATABASE_URL="$$url" ONCEFLOW_SOAK_CAPPED=$${SOAK_CAPPED:-10m} $(GO) test -count=1 -v -run '^TestSoakCappedTenant$$' -timeout 60m ./pipeline/webhooks/

.PHONY: demo
demo: build ## run `onceflow dev`, drive a scripted workload over HTTP and check the balances
	@scripts/demo.sh

.PHONY: dev
dev: build ## run the embedded default (broker, registry, Postgres, all components) in the foreground
	$(BIN)/onceflow dev

.PHONY: bench
bench: build ## run the benchmarks; each prints its figures next to a baseline measured in the same run
	@$(PG_URL) && \
	DATABASE_URL="$$url" $(GO) test -run '^$$' -bench . -benchtime $(BENCH_TIME) -timeout 60m ./pipeline/... ./examples/... . | tee $(BIN)/bench.txt

# bench/ is a module of its own (the load generator's plot and the Watermill
# peer stay out of onceflow's go.mod); make test runs its smoke test. It
# takes onceflow from ../ (replace), so a dependency onceflow adds is one
# bench/go.sum lacks until `go mod tidy` there: its commands run with
# -mod=mod, which adds it rather than fail.
.PHONY: bench-e2e
bench-e2e: build ## the pipeline measured whole over HTTP from outside, next to a Watermill peer and a no-op server (ARGS='-split ...'; docs/benchmarks.md)
	@$(PG_URL) && cd bench && DATABASE_URL="$$url" $(GO) run -mod=mod ./e2e -png ../docs/bench-e2e.png -md ../$(BIN)/bench-e2e.md $(ARGS)

.PHONY: fuzz
fuzz: ## run each fuzz target for FUZZ_TIME (default 30s)
	@for pkg in $$($(GO) list ./pipeline/...); do \
	  for f in $$($(GO) test -list 'Fuzz.*' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $${FUZZ_TIME:-30s} $$pkg || exit 1; \
	  done; \
	done

# The docs check (test/docs) runs every command README.md and docs/*.md
# show that can run on the embedded default, against an `onceflow dev` of
# its own, and lists the ones it skips with the reason; and every
# PAGE.md#anchor a page, a comment or an alert names is a heading there.
.PHONY: lint
lint: build ## gofmt, go vet, staticcheck, gosec, the import rules (library, application, domains), the room sizes (files, functions), the module's tidiness and the docs' commands and links
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)
	$(GO) run $(GOSEC) $(GOSEC_FLAGS) $(PKGS)
	$(GO) test -count=1 -run '^(TestImportRules|TestLeanBinaries|TestRoomSizes)$$' .
	@set -o pipefail; $(PG_URL) && DATABASE_URL="$$url" $(GO) test -count=1 -v -run '^TestDocs(Commands|Links)$$' ./test/docs | grep -v ': ran  '
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }
	cd bench && $(GO) vet -mod=mod ./...
	cd deploy/helm && $(GO) vet ./... && { $(GO) mod tidy -diff >/dev/null || { echo "deploy/helm: go.mod/go.sum are not tidy: run go mod tidy there"; exit 1; }; }

.PHONY: clean
clean: ## remove build output (keeps .data; `make pg-down` first to stop Postgres)
	rm -rf $(BIN)
