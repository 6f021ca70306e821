# Gantry: NVIDIA GPUs for containers and Kubernetes.
#   make demo   install what is needed, build, and show Gantry on this host
#               (simulated GPUs and a generated driver root when there is no GPU)
#   make test   vet, format check, unit and integration tests (race detector on)

GO      ?= go
BIN     := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/gantry-gpu/gantry/internal/version.Version=$(VERSION)
export CGO_ENABLED := 1
# go-nvml's cgo wrappers name NVML calls deprecated in CUDA 13; the warnings are noise.
export CGO_CFLAGS := -O2 -g -Wno-deprecated-declarations
export PATH := $(PATH):/usr/local/go/bin

.PHONY: containerd2 cluster-bin cluster-up cluster-down e2e-cluster e2e-cluster-ci e2e-cluster-dra e2e-cluster-default gpu-cluster all build build-device-plugin build-dra-plugin image deps test-deps demo test hermetic-check vet fmt-check fuzz bench gpu-check gpu-e2e bundlesplit install install-cdi-fix install-systemd clean

all: build

# Debian/Ubuntu packages the build and the tests use (gcc for cgo and the fake
# driver's ELF libraries, ldconfig for real ld.so.cache files). Installs only
# what is missing; needs root (or sudo) only when something is.
deps:
	@scripts/deps.sh

# gantry-runtime runs on every step of every container's life, so it is a
# static binary: no dynamic loader mapping libc on each call (0.15-0.25 ms
# on a small VM). It keeps cgo for the fast path's C constructor
# (internal/fastpath; the static link needs libc.a from libc6-dev) but links no NVML (tag
# nonvml: go-nvml's dlopen of the host's libnvidia-ml cannot work in a static
# glibc program); when it needs NVML (MIG devices) it runs `gantry gpus-json`,
# the gantry beside it (runtime.gantry-path to name another; internal/discover).
# osusergo,netgo keep glibc's NSS (dlopen'ed at run time) out of the link.
# cmd/gantry-runtime's TestStaticBinary builds it with these flags too.
RUNTIME_TAGS := nonvml,gantrylean,osusergo,netgo
RUNTIME_LDFLAGS := -linkmode external -extldflags -static

# gantry-cdi-hook, which the CDI specs of gantry cdi generate run as root
# inside the container's mount namespace, is built without cgo: a static
# binary, so no dynamic loader (and no LD_PRELOAD of an image) ever runs for it.
build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/gantry ./cmd/gantry
	$(GO) build -tags $(RUNTIME_TAGS) -trimpath -ldflags "$(LDFLAGS) $(RUNTIME_LDFLAGS)" -o $(BIN)/gantry-runtime ./cmd/gantry-runtime
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/gantry-cdi-hook ./cmd/gantry-cdi-hook

# The Kubernetes device plugin: a binary of its own (gRPC, Prometheus).
# grpcnotrace leaves out gRPC's golang.org/x/net/trace, whose html/template
# keeps every exported method alive in the linker: 3 MB of binary and of RSS.
build-device-plugin:
	$(GO) build -tags grpcnotrace -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/gantry-device-plugin ./cmd/gantry-device-plugin

# The Kubernetes DRA kubelet plugin: a binary of its own (client-go and the
# kubeletplugin library, which the device plugin does without).
build-dra-plugin:
	$(GO) build -tags grpcnotrace -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/gantry-dra-plugin ./cmd/gantry-dra-plugin

# The container image the DaemonSet and the Helm chart run
# (ghcr.io/gantry-gpu/gantry:<chart appVersion>), built offline: no registry,
# no Docker; the image's glibc is this machine's. `docker build .` builds the
# same from the Dockerfile. Then: docker load -i bin/gantry-image.tar
image:
	VERSION=$(VERSION) scripts/build-image.sh -o $(BIN)/gantry-image.tar

demo: deps build
	@scripts/demo.sh

# The second line vets gantry-runtime's build (its tags pick other files).
vet:
	$(GO) vet ./...
	$(GO) vet -tags $(RUNTIME_TAGS) ./cmd/gantry-runtime ./internal/gpu/nvml ./internal/discover ./internal/cdispec

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

test-deps:
	@scripts/deps.sh --test

test: test-deps fmt-check vet
	$(GO) test -race -count=1 ./...

# The tests of gantry doctor (and every test that runs it) twice, in private
# mount namespaces: on a host with no GPU node state, and on one where a
# kubelet and containerd run and Gantry and NVIDIA's toolkit are installed
# (fake files and live sockets at the real paths); both must pass. Root;
# 3-4 minutes on 2 cores (7 when busy), so not part of make test.
# HERMETIC_PKGS names other packages.
HERMETIC_PKGS ?=
hermetic-check: test-deps
	scripts/hermetic-check.sh $(HERMETIC_PKGS)

# containerd 2.x and its ctr (the test cluster's release) in bin/containerd2, for
# the engine tests' containerd 2.x cases (test/engines TestConfigureContainerd),
# which run where it is built: about 10-25 minutes the first time on 2 cores.
containerd2:
	scripts/build-containerd2.sh

# Short runs of every fuzz target (go test -fuzz takes one target at a time).
fuzz:
	@scripts/fuzz.sh 20s

bench: build
	$(GO) test -run='^$$' -bench=. -benchmem ./...

# On a host with NVIDIA GPUs: compare gantry with nvidia-smi and time cdi generate.
gpu-check: build
	scripts/gpu-check.sh

# Everything scripts/gpu-e2e.sh and bench/runtime-lifecycle.sh need on a GPU host
# that has no compiler, no runc and no network, gathered under bin/ (~20 MB):
# bin/gantry (and bin/gantry-cdi-hook beside it, which its CDI specs run;
# bin/gantry-runtime, static, which runs bin/gantry when it needs NVML),
# bin/cuda-check (CUDA driver-API test, no CUDA needed to build it),
# bin/e2e-preload.so (a hostile image's LD_PRELOAD library, for check i),
# bin/runc (this machine's, e.g. Debian 12's runc package) and the libseccomp.so.2
# it links, in bin/lib for hosts without one. Then, as root on the GPU host:
#   scripts/gpu-e2e.sh && bench/runtime-lifecycle.sh      (--sim: without a GPU)
RUNC_BIN ?= $(shell command -v runc 2>/dev/null || ls /usr/sbin/runc 2>/dev/null)
gpu-e2e: build bundlesplit build-device-plugin
	gcc -O2 -Wall -o $(BIN)/cuda-check scripts/cuda-check.c -ldl
	gcc -O2 -Wall -o $(BIN)/gfx-check scripts/gfx-check.c -ldl
	@# libglvnd's EGL and the Vulkan loader for check l's image, for GPU hosts without them
	@mkdir -p $(BIN)/gfxlibs; for l in libEGL.so.1 libGLdispatch.so.0 libvulkan.so.1; do \
	  p=$$(/sbin/ldconfig -p | awk -v n=$$l '$$1 == n && /x86-64/ {print $$NF; exit}'); \
	  [ -n "$$p" ] && cp -L "$$p" $(BIN)/gfxlibs/$$l || echo "note: no $$l here (scripts/deps.sh --test installs libegl1 and libvulkan1): check l may skip"; done
	gcc -O2 -Wall -shared -fPIC -o $(BIN)/e2e-preload.so scripts/e2e-preload.c
	gcc -O2 -Wall -o $(BIN)/nvmlrss bench/nvmlrss.c -ldl
	@[ -n "$(RUNC_BIN)" ] || { echo "runc not found: apt-get install runc (or make gpu-e2e RUNC_BIN=/path/to/runc)"; exit 1; }
	cp -L --remove-destination $(RUNC_BIN) $(BIN)/runc
	@mkdir -p $(BIN)/lib
	@lib=$$(ldd $(BIN)/runc | awk '$$1 == "libseccomp.so.2" {print $$3}'); \
	if [ -n "$$lib" ]; then cp -L "$$lib" $(BIN)/lib/; fi
	@# strace and its libraries, for bench/runtime-lifecycle.sh --trace (skipped without it)
	@if s=$$(command -v strace); then cp -L $$s $(BIN)/strace; \
	  ldd $$s | awk '$$3 ~ /^\// && $$1 !~ /^lib(c|m|dl|pthread)\.so/ {print $$3}' | xargs -r cp -L -t $(BIN)/lib/; fi
	@du -sh $(BIN); echo "on the GPU host, as root: scripts/gpu-e2e.sh && bench/runtime-lifecycle.sh"

# bin/bundlesplit: bench/runtime-lifecycle.sh --split's bundle variants.
bundlesplit:
	$(GO) build -o $(BIN)/bundlesplit ./bench/bundlesplit

# Installs four binaries, side by side (gantry-runtime, built without NVML,
# runs the gantry beside it for NVML's answer), and the names engines and
# scripts look for:
# gantry (the CLI; also the nvidia-docker wrapper and nvidia-docker-plugin), gantry-runtime (the runc shim, also nvidia-container-runtime,
# the prestart hook gantry-hook / nvidia-container-runtime-hook for Docker's --gpus,
# nvidia-container-cli for LXC's hook: the per-container paths, kept lean; and nvidia-ctk for NVIDIA's
# provisioning command lines: cdi generate and cdi list served lean, the others by the gantry beside it), gantry-cdi-hook (the static hook binary the CDI
# specs of gantry cdi generate run; also nvidia-cdi-hook, for the specs nvidia-ctk
# wrote) and gantry-device-plugin (Kubernetes).
# It also rewrites CDI specs whose hooks run the gantry CLI without an env
# (install-cdi-fix) and installs the create server's systemd units (install-systemd).
#   sudo make install [PREFIX=/usr] [NVIDIA_NAMES=0 to skip NVIDIA's names]
PREFIX ?= /usr
NVIDIA_NAMES ?= 1
install: build build-device-plugin
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BIN)/gantry $(DESTDIR)$(PREFIX)/bin/gantry
	install -m 0755 $(BIN)/gantry-runtime $(DESTDIR)$(PREFIX)/bin/gantry-runtime
	install -m 0755 $(BIN)/gantry-cdi-hook $(DESTDIR)$(PREFIX)/bin/gantry-cdi-hook
	install -m 0755 $(BIN)/gantry-device-plugin $(DESTDIR)$(PREFIX)/bin/gantry-device-plugin
	@nv=$$([ "$(NVIDIA_NAMES)" = 1 ] && echo yes); \
	for n in gantry-hook $${nv:+nvidia-container-runtime nvidia-container-runtime-hook nvidia-container-toolkit nvidia-container-cli nvidia-ctk}; do \
	  ln -sfn gantry-runtime $(DESTDIR)$(PREFIX)/bin/$$n && echo "$(PREFIX)/bin/$$n -> gantry-runtime"; done; \
	for n in $${nv:+nvidia-docker nvidia-docker-plugin}; do \
	  ln -sfn gantry $(DESTDIR)$(PREFIX)/bin/$$n && echo "$(PREFIX)/bin/$$n -> gantry"; done; \
	for n in $${nv:+nvidia-cdi-hook}; do \
	  ln -sfn gantry-cdi-hook $(DESTDIR)$(PREFIX)/bin/$$n && echo "$(PREFIX)/bin/$$n -> gantry-cdi-hook"; done
	@$(MAKE) --no-print-directory install-cdi-fix
	@$(MAKE) --no-print-directory install-systemd
	@# A newcomer without a GPU: how to point what was installed at simulated GPUs.
	@if [ ! -e /proc/driver/nvidia/version ]; then \
	  echo "No NVIDIA driver on this host. To run the installed stack on simulated GPUs:"; \
	  echo "  sudo $(PREFIX)/bin/gantry sim driver-root /var/lib/gantry/sim-driver   # a fake driver root for 8 simulated H100s"; \
	  echo "  then put the two lines it prints in /etc/gantry/config.toml:"; \
	  echo '    gpus = "sim:h100x8"'; \
	  echo '    driver-root = "/var/lib/gantry/sim-driver"'; \
	  echo "  gantry info, gantry cdi generate, gantry-runtime and the hook then use them (docs/guide.md, Simulated GPUs)"; \
	fi

# CDI specs written before gantry-cdi-hook existed run the dynamically linked
# gantry as a root hook with no env: an engine that injects one (containerd,
# CRI-O, Podman) hands it the image's environment on runc before 1.2, and the
# image's LD_PRELOAD runs as host root. make install rewrites them (gantry cdi
# fix-hooks) to run the gantry-cdi-hook it installs with an explicit env,
# atomically, each original kept as FILE.bak.
CDI_SPEC_DIRS ?= /etc/cdi /var/run/cdi
install-cdi-fix:
	$(DESTDIR)$(PREFIX)/bin/gantry cdi fix-hooks --hook-path $(PREFIX)/bin/gantry-cdi-hook $(addprefix $(DESTDIR),$(CDI_SPEC_DIRS))

# The create server's units (deployments/systemd), in systemd's unit
# directory under PREFIX (/usr/lib/systemd/system, /usr/local/lib/...),
# ExecStart naming the gantry-runtime make install puts in $(PREFIX)/bin.
# On a host that runs systemd, installing into a unit directory systemd
# reads (no DESTDIR), the socket is enabled and started: the first GPU
# container's create starts the server, and each GPU create and --gpus hook
# after it starts no Go program. CREATE_SERVER=0 installs the units only;
# otherwise the command that enables them is printed.
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
CREATE_SERVER ?= 1
install-systemd:
	install -d $(DESTDIR)$(SYSTEMD_UNIT_DIR)
	install -m 0644 deployments/systemd/gantry-runtime-server.socket $(DESTDIR)$(SYSTEMD_UNIT_DIR)/gantry-runtime-server.socket
	sed 's|^ExecStart=/usr/bin/gantry-runtime |ExecStart=$(PREFIX)/bin/gantry-runtime |' deployments/systemd/gantry-runtime-server.service \
	  > $(DESTDIR)$(SYSTEMD_UNIT_DIR)/.gantry-runtime-server.service.tmp
	chmod 0644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/.gantry-runtime-server.service.tmp
	mv -f $(DESTDIR)$(SYSTEMD_UNIT_DIR)/.gantry-runtime-server.service.tmp $(DESTDIR)$(SYSTEMD_UNIT_DIR)/gantry-runtime-server.service
	@if [ "$(CREATE_SERVER)" = 1 ] && [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null && \
	    case "$$(realpath -m $(SYSTEMD_UNIT_DIR))" in /usr/lib/systemd/system|/lib/systemd/system|/usr/local/lib/systemd/system|/etc/systemd/system) true ;; *) false ;; esac; then \
	  systemctl daemon-reload && systemctl enable --now gantry-runtime-server.socket && \
	  systemctl try-restart gantry-runtime-server.service && \
	  echo "create server socket enabled and started (systemctl disable --now gantry-runtime-server.socket gantry-runtime-server.service stops it)"; \
	else \
	  echo "create server units in $(SYSTEMD_UNIT_DIR), not enabled; to run it: systemctl daemon-reload && systemctl enable --now gantry-runtime-server.socket"; \
	fi

# A live single-node Kubernetes cluster (v1.37.2, containerd 2.4.2) with Gantry
# installed as a cluster admin installs it, on simulated GPUs where there is
# none (test/cluster). The first cluster-bin builds Kubernetes from its Go
# modules: 10-15 minutes on 2 cores.
#   make cluster-up      then: export KUBECONFIG=/etc/gantry-k8s/admin.conf PATH=$$PWD/bin/cluster:$$PATH
#   make cluster-down    stops it and removes everything it made
#   make e2e-cluster     up, every scenario test of test/cluster, down
#   make e2e-cluster-ci  the same with scenarios 1-3 (what .ci/run runs)
#   make e2e-cluster-dra up with the DRA plugin beside the device plugin (up.sh --dra),
#                        the DRA scenarios (TestDRA*; E2E_CLUSTER_DRA_RUN picks others), down
#   make e2e-cluster-default up with nvidia as containerd's default runtime
#                        (up.sh --set-as-default), the scenarios that need it (pods and
#                        NVIDIA's static DaemonSets without runtimeClassName), down
#   make gpu-cluster     bin/cluster.tar.xz for a GPU host: test/cluster/gpu-e2e.sh bin/cluster.tar.xz
cluster-bin: test-deps
	test/cluster/build.sh
cluster-up: cluster-bin
	test/cluster/up.sh
cluster-down:
	test/cluster/down.sh
E2E_CLUSTER_RUN ?= .
E2E_CLUSTER_DRA_RUN ?= ^TestDRA
e2e-cluster: cluster-bin
	@test/cluster/down.sh >/dev/null 2>&1 || true
	test/cluster/up.sh
	GANTRY_CLUSTER=1 $(GO) test -count=1 -v -run '$(E2E_CLUSTER_RUN)' ./test/cluster; st=$$?; \
	test/cluster/down.sh; exit $$st
e2e-cluster-dra: cluster-bin
	@test/cluster/down.sh >/dev/null 2>&1 || true
	test/cluster/up.sh --dra
	GANTRY_CLUSTER=1 $(GO) test -count=1 -v -run '$(E2E_CLUSTER_DRA_RUN)' ./test/cluster; st=$$?; \
	test/cluster/down.sh; exit $$st
e2e-cluster-default: cluster-bin
	@test/cluster/down.sh >/dev/null 2>&1 || true
	test/cluster/up.sh --set-as-default
	GANTRY_CLUSTER=1 $(GO) test -count=1 -v -run '^Test(PodWithoutRuntimeClass|NVIDIAStaticDaemonSets)$$' ./test/cluster; st=$$?; \
	test/cluster/down.sh; exit $$st
e2e-cluster-ci:
	$(MAKE) e2e-cluster E2E_CLUSTER_RUN='^Test(NodeAdvertisesGPUs|PodGetsTwoGPUs|NoRequestNoGPU)$$'
gpu-cluster: test-deps
	test/cluster/build.sh --pack

clean:
	rm -rf $(BIN)
