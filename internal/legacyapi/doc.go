// Package legacyapi serves the REST API of nvidia-docker 1.0's plugin
// (nvidia-docker-plugin, localhost:3476), for the scripts, schedulers and
// wrappers of that generation that still ask it which docker run arguments give
// a container the GPUs, and what the GPUs are doing.
//
// The endpoints, each also under the /v1.0 prefix as the original served them:
//
//	/docker/cli        the docker run arguments, one line, words separated by single spaces
//	/docker/cli/json   {"VolumeDriver": "", "Volumes": [...], "Devices": [...]}
//	/gpu/info          driver and CUDA versions and each GPU, as aligned text
//	/gpu/info/json     {"Version": {"Driver", "CUDA"}, "Devices": [...]}
//	/gpu/status        each GPU's power, temperature, utilisation, memory, clocks, processes
//	/gpu/status/json   {"Devices": [...]}
//	/mesos/cli         the Mesos agent flags: --attributes=gpus:<...> --resources=gpus:{<UUIDs>}
//
// The JSON field names, nesting and units are the original's; a value the
// backend cannot give is null, and "N/A" in the text forms, as there. The text
// forms are laid out as the original's tabwriter output was, byte for byte.
// /gpu/status has, per GPU: power (W; the text adds the limit), temperature,
// utilisation of the GPU, memory, encoder and decoder, memory used (MiB),
// volatile uncorrected ECC errors in L1, L2 and device memory, SM and memory
// clocks (MHz), BAR1 used (MiB), PCIe RX/TX (MB/s) and the processes (host PID,
// argv[0], MiB), all from package readings; /gpu/info takes the power limit,
// BAR1 size and maximum clocks from there too. A GPU that cannot be read at
// all shows every reading null rather than failing the request.
//
// /gpu/info computes the rest as the original did, from NVML where the
// original asked CUDA: Cores are NVML's CUDA core count; CPU Affinity the
// GPU's NUMA node ("NUMA node0" on a host without NUMA, as there); PCI
// Bandwidth the fastest link's lanes times one lane's MB/s of its
// generation (the original's table, 250, 500, 985, 1969 MB/s for Gen 1 to
// 4, extended to 3938, 7563 and 15125 for Gen 5 to 7, where the original
// gave 0); Memory ECC the current ECC mode (null where the GPU has none);
// Memory Bandwidth the original's 2 x memory clock (MHz) x bus width
// (bytes), with NVML's maximum memory clock, which is CUDA's memoryClockRate.
// Memory Shared, Constant and L2 Cache stay null: only CUDA's device
// properties have them, and Gantry does not create CUDA contexts. P2P
// Available lists, in index order, each GPU that this one may read directly
// (the original asked cudaDeviceCanAccessPeer, here NVML's P2P status; none
// in MIG mode), with the kind of link: in JSON the original's number, in the
// text its name, "Same board" (6), "Single PCI switch" (5), "Multiple PCI
// switches" (4), "Host PCI bridge" (3), "Same CPU socket" (2), "Cross CPU
// socket" (1), or, where NVLink joins the two, "Single NVLink" (7) to
// "Eighteen NVLinks" (24) as NVIDIA's later bindings extended the
// numbering (on an NVSwitch fabric, the smaller of the two GPUs' link counts
// into it). These facts are read once and kept while they are complete.
//
// /docker/cli takes the original's query parameters: dev, the GPUs by index or
// by (a prefix of) UUID, separated by spaces ("?dev=0+1", "+" being a space in a
// query) or, as an extension, commas; empty or "*" means all. vol, the volumes
// by name: the only one is nvidia_driver; empty or "*" means all. A bad value is
// answered 400 with "invalid device: X" or "invalid volume: X".
//
// With the volume plugin beside the API (Options.VolumePlugin: `gantry serve
// --volume-plugin`, nvidia-docker-plugin), the arguments are the original's:
// --volume-driver=nvidia-docker --volume=nvidia_driver_<version>:/usr/local/nvidia:ro,
// a Docker volume that the plugin (package dockervol) fills with the driver's
// programs and libraries. Without it, the arguments bind the host's files
// read-only at the same place instead: when the driver lives in a directory
// of its own (GKE's /usr/local/nvidia, /home/kubernetes/bin/nvidia) that
// directory is bound at /usr/local/nvidia; otherwise each program is bound at
// /usr/local/nvidia/bin/<name> and each library at
// /usr/local/nvidia/lib64/<SONAME> (32-bit ones under lib), which is the
// volume's layout, so the CUDA images of that era, whose PATH and
// LD_LIBRARY_PATH name those directories, find them. VolumeDriver is then the
// empty string and the text form has no --volume-driver.
//
// /mesos/cli is the original's: the attribute gpus holds /gpu/info/json's
// body, zlib-compressed, in URL-safe base64 without padding; the resource
// gpus the set of the GPUs' UUIDs.
//
// Device nodes are /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools
// (when present) and /dev/nvidiaN of each GPU, as in the original; when the
// configuration puts them under a dev root other than / (a driver container),
// each is given as HOSTPATH:/dev/NAME.
//
// The server is read-only: GET and HEAD only, anything else is 405.
package legacyapi
