// Package request reads what a container asks for from its OCI spec: the
// NVIDIA env contract, CDI annotations and the volume-mount device list,
// and evaluates NVIDIA_REQUIRE_* expressions. Everything here is a pure
// function of its arguments: no files, no NVML.
//
// Parse(Input, Options) gives a Request; Check(requirements, Host, GPUs)
// judges the requirements once the host and the selected GPUs are known.
//
// # Facts this package follows
//
// Learned from NVIDIA's nvidia-container-toolkit (internal/config/image,
// internal/requirements, internal/modifier, cmd/nvidia-container-runtime-hook)
// and libnvidia-container (src/cli/dsl.c, configure.c, common.c):
//
//   - Where devices come from, first match wins: annotations whose key has a
//     configured prefix (default "cdi.k8s.io/"), keys sorted, values comma
//     lists of fully qualified CDI names; then, only with
//     accept-nvidia-visible-devices-as-volume-mounts, mounts of /dev/null
//     under /var/run/nvidia-container-devices/ (the path below the root is
//     the device; "cdi/VENDOR/CLASS/NAME" and "cdi/VENDOR/CLASS=NAME" are CDI
//     names; "imex/N" are IMEX channels, not GPUs); then the env. When
//     annotations or mounts name devices, NVIDIA_VISIBLE_DEVICES is ignored.
//   - The env is honoured in an unprivileged container only when
//     accept-nvidia-visible-devices-envvar-when-unprivileged is true (the
//     default). Privileged means CAP_SYS_ADMIN in the bounding set.
//   - Docker Swarm: when any of the configured swarm-resource variables is
//     set, those are read instead of NVIDIA_VISIBLE_DEVICES.
//   - A device list is split on commas, items trimmed, empty items dropped.
//     No items, or "void" anywhere: nothing is done. Otherwise the first of
//     "all" or "none" decides; else the items are device IDs: index, GPU
//     UUID, PCI bus id, "GPU:MIG" pair, MIG UUID (matched case-insensitively
//     by the CLI), or fully qualified CDI names.
//   - A "legacy" image has CUDA_VERSION set and NVIDIA_REQUIRE_CUDA unset or
//     empty. For it, an unset NVIDIA_VISIBLE_DEVICES means all (set but
//     empty still means void), an unset NVIDIA_DRIVER_CAPABILITIES means
//     every capability, and the requirement cuda>=MAJOR.MINOR of
//     CUDA_VERSION (read as a lenient semantic version) is added.
//   - NVIDIA_DRIVER_CAPABILITIES: comma list, items trimmed, empty dropped;
//     unset or empty gives utility,compute; "all" beside other names is all.
//     The legacy hook refuses unknown names (including "none"); CDI mode only
//     asks whether graphics or display is present and ignores the rest.
//   - NVIDIA_MIG_CONFIG_DEVICES / NVIDIA_MIG_MONITOR_DEVICES: a non-empty
//     value in an unprivileged container is refused; the CLI accepts only
//     "all".
//   - Requirements: every variable named NVIDIA_REQUIRE_* except
//     NVIDIA_REQUIRE_JETPACK (a Jetson mount option) is one expression;
//     they are all skipped when NVIDIA_DISABLE_REQUIRE parses as true with
//     Go's strconv.ParseBool (1, t, T, true, TRUE, True); any other value,
//     unparsable ones included, leaves them on. An empty expression holds.
//   - Expression grammar: terms separated by spaces are alternatives (OR);
//     inside a term, constraints separated by commas must all hold (AND).
//     So "cuda>=12.4 brand=tesla,driver>=470,driver<471" means CUDA 12.4 or
//     newer, or a Tesla on a 470 driver (the forward-compatibility cases).
//   - A constraint is KEY OP VALUE. Keys (case-insensitive): cuda (the CUDA
//     driver API version of the host, major.minor), driver (the kernel
//     driver version), arch (a GPU's compute capability), brand (a GPU's
//     NVML brand: tesla, nvidia, geforce, quadro, titan, nvidiartx, ...;
//     compared case-insensitively, = and != only). Operators: = != < <= > >=
//     (the whole operator run must be one of these, so "==" is invalid).
//   - Versions compare number by number, missing numbers as 0: 12.4 equals
//     12.4.0, 12.10 > 12.9, 535.104.05 equals 535.104.5. Only digits and
//     dots are allowed.
//   - The CLI evaluates every requirement once per selected GPU; with no GPU
//     selected (none) once, and brand and arch constraints then hold. An
//     unknown host value (no CUDA version, no brand) makes its constraints
//     hold. H100 and other recent data-center GPUs report brand "nvidia".
//   - CDI mode in NVIDIA's runtime does not check requirements at all; the
//     legacy hook passes them to the CLI (--require=EXPR each).
//   - CDI mode turns a bare ID into DEFAULT_KIND=ID (nvidia.com/gpu=0) and
//     "none" into KIND=none.
//
// # Where Gantry differs, on purpose
//
//   - Values are checked when parsed, with one-line errors naming the
//     variable, the value and the fix: a device item that cannot be a device
//     ID ("0;1", "-1") is refused here, where NVIDIA fails later with
//     "unknown device". An expression is checked whole, where the CLI only
//     reports a bad constraint it happens to reach; unknown keys are errors
//     (NVIDIA's Go evaluator, used for Jetson, skips them).
//   - "all", "none" and "void" are matched without regard to case.
//   - Tabs and newlines separate expression terms like spaces do.
//   - The volume-mount root must be followed by "/"
//     (/var/run/nvidia-container-devicesX/0 is not a request).
//   - MIG config/monitor values "none" and "void" mean not asked.
//   - Requirements and MIG variables of a container that asks for no device
//     are not read at all, so they cannot fail it (NVIDIA does the same).
package request
