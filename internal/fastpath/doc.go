// Package fastpath is gantry-runtime's pass-through fast path, in C
// (fastpath.c): a constructor the C library's start-up runs before the Go
// runtime starts, as runc's nsenter is. Importing the package (package shim
// does) links it into the binary. gantry-runtime is linked statically (see
// the Makefile), so no dynamic loader runs first either: what a pass-through
// costs beyond the low-level runtime's own exec is one exec of a static
// program, the configuration file and config.json read, and a PATH lookup.
//
// The Go part still needs cgo: the go command links C only through cgo,
// and cgo brings runtime/cgo (threads made with pthread_create, a template
// thread, glibc's start-up), which costs a Go start about 0.4 ms on a
// small VM against a static Go binary without cgo. Losing it would take the
// C out of cgo: a freestanding object with its own entry point (the
// linker's -E) and raw system calls.
//
// A create that goes to Go starts it pinned to the CPU the constructor ran
// on (the Go runtime makes one P per CPU of the affinity mask, and waking
// and creating the threads for idle Ps is a good part of a Go start on a
// many-core host); shim puts the caller's mask back (RestoreAffinity)
// before it executes the low-level runtime.
//
// Engines call the runtime for every step of a container's life (create,
// start, state, kill, delete, ...), and only create and run need Gantry,
// and only for a container that asks for a GPU. Starting the Go runtime and
// running every package's init costs a few milliseconds per call; for the
// other subcommands, and for a create or run whose config.json cannot hold
// a request, the C constructor execs the low-level runtime at once.
//
// The create test is conservative by construction: the configuration may
// hold only keys that cannot widen what counts as a request (any other key,
// such as cdi.annotation-prefixes or runtime.swarm-resource, or any TOML
// the C reader does not understand fully, sends every create to Go), and
// config.json must contain none of the text a request is read from
// (NVIDIA_VISIBLE_DEVICES, CUDA_VERSION, nvidia-container-devices,
// cdi.k8s.io/) and no backslash (a JSON escape could spell them otherwise).
// It is held against request.Parse on the request package's tables and fuzz
// seeds (internal/request's agreement test and FuzzFastPathAgreement), and
// its constants against Go's by TestConstants.
//
// Such a create leaves no line in runtime.log-file. The constructor acts
// only when the program's name is gantry-runtime or nvidia-container-runtime,
// and it gives up (leaving the work to shim.Main, which does the same thing
// slower) whenever anything is unusual: an unclear command line, a
// configuration file it cannot read simply, a runtime it cannot find.
// GANTRY_NO_FASTPATH=1 turns it off.
package fastpath
