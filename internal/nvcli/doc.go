// Package nvcli is Gantry's nvidia-container-cli: the commands and options of
// NVIDIA's container CLI (libnvidia-container) that callers still run, chiefly
// LXC's nvidia hook, done with Gantry's discovery, edits and mounting. The
// gantry binary runs it when started under the name nvidia-container-cli.
//
// # What LXC's hook runs (Debian 12, /usr/share/lxc/hooks/nvidia)
//
// The hook is an lxc.hook.mount script. It runs after LXC has mounted the
// container's root at $LXC_ROOTFS_MOUNT (e.g. /usr/lib/x86_64-linux-gnu/lxc/rootfs)
// and made /dev a tmpfs there, before pivot_root, inside the container's
// mount, pid and user namespaces, with the host's /proc still mounted. It
// refuses privileged containers. From NVIDIA_VISIBLE_DEVICES,
// NVIDIA_DRIVER_CAPABILITIES (default utility) and NVIDIA_REQUIRE_* it builds
//
//	nvidia-container-cli [--debug=FILE] [--load-kmods] --user [--ldcache=F] [--root=D]
//	    configure --no-cgroups [--ldconfig=@/sbin/ldconfig] [--device=LIST]
//	    [--compute --compat32 --display --graphics --utility --video] [--require=EXPR]...
//	    $LXC_ROOTFS_MOUNT
//
// and reads nothing back: only the exit status counts. It never runs info or
// list. --device is left out for NVIDIA_VISIBLE_DEVICES=none (driver files,
// no GPU); void and unset never reach the CLI.
//
// # NVIDIA's CLI, as far as it is implemented here
//
//   - Global options: --debug/-d FILE, --load-kmods/-k, --no-pivot/-n,
//     --user/-u[=UID[:GID]], --root/-r PATH, --ldcache/-l FILE,
//     --no-create-imex-channels; then the command. GNU argp syntax:
//     --opt=V or --opt V, clustered short options, "--".
//   - info [--csv]: "NVRM version:" and "CUDA version:", then per GPU a blank
//     line and Device Index, Device Minor, Model, Brand, GPU UUID, Bus
//     Location, Architecture, labels padded to 15 columns; the bus location
//     is "%08x:%02x:%02x.%x" in lower case, the architecture the compute
//     capability. --csv prints the same as two CSV tables.
//   - list: host paths, one per line: with --device the driver's control
//     nodes and the GPUs' nodes, then (when asked) --binaries, --libraries
//     (64-bit, then 32-bit with --compat32), --ipcs, --firmwares;
//     --mig-config/--mig-monitor add the MIG capability nodes;
//     --no-persistenced and --no-fabricmanager drop those sockets. Without
//     any option everything is listed for all GPUs.
//   - configure [--pid=PID] [--device=ID]... [--require=EXPR]...
//     [--ldconfig=PATH] [--compute --utility --video --graphics --display
//     --ngx --compat32] [--mig-config=all] [--mig-monitor=all] [--no-cgroups]
//     [--no-devbind] [--no-persistenced] [--no-fabricmanager]
//     [--cuda-compat-mode=MODE] ROOTFS. ROOTFS must be absolute and not "/";
//     repeated --device values are joined with commas; no capability flag
//     means no driver libraries (only the control node and firmware).
//
// Failures exit 1 with one line on stderr, usage errors included, as NVIDIA's
// CLI exits.
//
// # How configure works
//
// The request (devices, capabilities, requirements, MIG capabilities) becomes
// a request.Request; the GPUs and the driver are found through package
// discover with the Gantry configuration (GANTRY_CONFIG or
// /etc/gantry/config.toml; --root overrides its driver root); edits.Build
// checks the requirements and computes the edits. Nothing is changed before
// all of that and the container root have been checked. Then:
//
//  1. Mounts and device nodes go into the container's mount namespace through
//     package nsmount, with the device cgroup opened for the nodes unless
//     --no-cgroups. With --pid that is the namespace of PID (NVIDIA's legacy
//     runtime hook passes the pid from the OCI state); without it NVIDIA's CLI
//     uses its parent. LXC runs the hook inside the container's namespaces, so
//     in a user namespace other than the initial one the container is this
//     process's own mount namespace: the mounts are then made by a copy of
//     this binary started in a new mount namespace (nsmount refuses its
//     caller's own namespace), and device nodes are bind mounts of the host's
//     nodes, since nodes made in a user namespace cannot be opened.
//  2. The SONAME links and the container's /etc/ld.so.cache entries are made
//     through /proc/PID/root/ROOTFS with package rootfs, by package inject
//     (the pipeline gantry-runtime and gantry-hook share, cache included):
//     the mounts just made are visible there. The image's CUDA forward
//     compatibility libraries come first when they are newer than the host
//     driver (--cuda-compat-mode=disabled turns that off).
//
// # Differences from NVIDIA's CLI
//
//   - No ldconfig is ever run, from the image or the host: --ldconfig is
//     checked and ignored, the cache is written in-process.
//   - --load-kmods, --no-pivot, --no-create-imex-channels and --user are
//     accepted and change nothing: Gantry loads no kernel modules, never
//     pivots, makes no IMEX channels and drops no privileges it does not use.
//   - configure --imex-channel gives the container the channels' nodes
//     (/dev/nvidia-caps-imex-channels/channelN, as NVIDIA_IMEX_CHANNELS
//     does through the runtime); list refuses it. --ldcache is accepted
//     only when it names the driver root's own cache. --cuda-compat-mode=mount is done as ldconfig
//     (cache entries, no mount over the driver's libraries).
//   - --no-devbind leaves the device nodes out altogether (NVIDIA's still
//     grants them in the cgroup).
//   - info prints brands NVIDIA's CLI does not name (nvidia, nvidiartx, ...)
//     as the NVIDIA_REQUIRE_* word instead of "Unknown"; list prints host
//     paths for device nodes and firmware too (NVIDIA prints /dev/... and the
//     unresolved firmware path).
//   - --version reports the NVIDIA CLI interface level implemented
//     (cli-version) and the Gantry build.
package nvcli
