# Gantry: NVIDIA GPUs for containers and Kubernetes.
#   make demo   install what is needed, build, and show Gantry on this host
#               (simulated GPUs and a generated driver root when there is no GPU)
#   make test   vet, format check, unit and integration tests (race detector on)

GO      ?= go
BIN     := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/gantry-gpu/gantry/internal/cli.Version=$(VERSION)
export CGO_ENABLED := 1
# go-nvml's cgo wrappers name NVML calls deprecated in CUDA 13; the warnings are noise.
export CGO_CFLAGS := -O2 -g -Wno-deprecated-declarations
export PATH := $(PATH):/usr/local/go/bin

.PHONY: all build deps test-deps demo test vet fmt-check fuzz bench gpu-check clean

all: build

# Debian/Ubuntu packages the build and the tests use (gcc for cgo and the fake
# driver's ELF libraries, ldconfig for real ld.so.cache files). Installs only
# what is missing; needs root (or sudo) only when something is.
deps:
	@scripts/deps.sh

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/gantry ./cmd/gantry

demo: deps build
	@scripts/demo.sh

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

test-deps:
	@scripts/deps.sh --test

test: test-deps fmt-check vet
	$(GO) test -race -count=1 ./...

# Short runs of every fuzz target (go test -fuzz takes one target at a time).
fuzz:
	@scripts/fuzz.sh 20s

bench: build
	$(GO) test -run='^$$' -bench=. -benchmem ./...

# On a host with NVIDIA GPUs: compare gantry with nvidia-smi and time cdi generate.
gpu-check: build
	scripts/gpu-check.sh

clean:
	rm -rf $(BIN)
