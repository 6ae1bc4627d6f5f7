# Berth: `make run` starts it, `make test` tests it. `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
DATA_DIR ?= $(CURDIR)/.berth
GO_TEST_FLAGS ?=

.PHONY: help run build test deps assets generate proto verify lint bench soak clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

run: build ## Check the machine (berth doctor: only what fails), then start Berth on the embedded PostgreSQL in ./.berth (prints the URL and the login); your home and the demo directory may hold local sources
	export BERTH_DATA_DIR=$${BERTH_DATA_DIR:-$(DATA_DIR)}; \
	export BERTH_SOURCE_ROOTS=$${BERTH_SOURCE_ROOTS:-$$HOME:$$BERTH_DATA_DIR/demo}; \
	./bin/berth doctor --quiet || { echo "make run: fix what berth doctor reports above (./bin/berth doctor lists every check)"; exit 1; }; \
	./bin/berth serve --demo

build: assets ## Build bin/berth
	go build -trimpath -ldflags '$(LDFLAGS)' -o bin/berth ./cmd/berth

assets: ## Install the front-end packages from npm and copy them into static/vendor
	./static/vendor.sh

deps: ## Install what the tests need (PostgreSQL server binaries, npm packages)
	./scripts/test-deps.sh

test: deps verify ## Install what the tests need, run verify, then every test with the race detector
	BERTH_REQUIRE_BROWSER=1 go test -race -count=1 -timeout 30m $(GO_TEST_FLAGS) ./...

generate: ## Regenerate templ output (commit the result)
	go tool templ generate -path views

proto: ## Regenerate the driver protocol's Go code from environment/driverpb/driver.proto (needs protoc)
	./scripts/gen-proto.sh

verify: assets ## Check go.mod is tidy, generated code is fresh, gofmt is clean, go vet passes and the house rules hold (cmd/berth-rules)
	@go mod tidy -diff || { echo "go.mod/go.sum are not tidy: run 'go mod tidy' and commit the result"; exit 1; }
	go tool templ generate -path views
	@git diff --exit-code -- views || { echo "generated templ code was stale: commit the regenerated files"; exit 1; }
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	go vet ./...
	go run ./cmd/berth-rules .

lint: verify ## verify plus staticcheck
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

bench: deps assets ## Run the benchmarks and print one table with the ratios the issues ask for
	./scripts/bench.sh

soak: build ## Soak SOAK_MINUTES (default 10) of runs while SIGKILLing worker and PostgreSQL; prints lost runs etc. (not part of test)
	./scripts/soak.sh

clean: ## Remove build output (not the data dir)
	rm -rf bin
