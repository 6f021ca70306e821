// Package engineconfig registers gantry-runtime with a container engine by
// editing the engine's configuration file: Docker's daemon.json,
// containerd's config.toml, or a CRI-O drop-in. It is the file editing behind
// `gantry runtime configure --runtime docker|containerd|crio
// [--set-as-default] [--dry-run]`.
//
// Plan is pure: existing bytes in, new bytes and a list of human-readable
// changes out. Apply reads the file, calls Plan, and writes the result
// atomically (or, for a dry run, only returns a unified diff). Both are
// idempotent: once a file is configured, Plan returns it unchanged with no
// changes, and Apply writes nothing.
//
// # One definition per engine
//
// Each engine is one Definition (registry.go): its name and aliases, the
// file configure edits by default, what it writes there (for --help), its
// program and restart command, and the functions that plan, parse, read,
// check and (for --config-source=command) source its configuration.
// Docker, containerd and CRI-O are defined in docker.go, containerd.go and
// crio.go; Register adds another. Plan, Apply, Parse and Read dispatch
// through the registry, `gantry runtime configure` and `nvidia-ctk runtime
// configure` take their engine names and help from it, and gantry doctor
// checks every registered engine (one without a check written out in
// doctor gets one made from its Definition). Adding an engine is its file
// here; TestRegisteredEngine (internal/cli) registers one in a test.
//
// # Reading what is registered
//
// Parse, Read, ReadContainerd, ReadCRIO and ParseContainerdStatus are the
// one reader of what a configuration registers (Registered: the runtimes
// and the program each runs, the default runtime, CDI, containerd's CRI
// plugin disabled), read as the engine reads it: containerd's CRI plugin of
// the file's config version, with the files its `imports` name (an
// import that does not parse is an *ImportError), CRI-O's crio.conf
// (CRIOMainConfig) then its drop-ins in CRIODropinDir in name order. Plan
// reads its own output back through it and refuses a result that does not
// register what was asked, ApplyContainerdDropIn reads the main file with
// the planned drop-in and its other imports the same way, and gantry
// doctor judges the engines with it.
//
// # What gets written
//
// The entries are the ones NVIDIA's `nvidia-ctk runtime configure` writes,
// so a host moved from NVIDIA's toolkit to gantry keeps its runtime names
// ("nvidia" by default, plus any extra names such as "gantry"):
//
//   - Docker: runtimes.<name> = {"path": <gantry-runtime>} and, with
//     SetAsDefault, "default-runtime": <name>. NVIDIA's tool also writes an
//     empty "args" list; dockerd reads arguments from "runtimeArgs" and
//     ignores "args", so we write only "path" and keep whatever other keys
//     an existing entry had. Options.NVIDIAForm (nvidia-ctk) writes
//     NVIDIA's entry instead: {"path": "nvidia-container-runtime", "args":
//     []}, a bare name dockerd finds on its PATH. Runtime name "runc" is refused, as dockerd
//     reserves it.
//   - containerd, config format version 2 (containerd 1.x) under
//     plugins."io.containerd.grpc.v1.cri".containerd.runtimes.<name>, and
//     version 3 (containerd 2.x) under
//     plugins."io.containerd.cri.v1.runtime".containerd.runtimes.<name>:
//     runtime_type = "io.containerd.runc.v2" and options.BinaryName =
//     <gantry-runtime>, so the runc shim executes gantry-runtime in place of
//     runc. A new entry first copies the settings of the current default
//     runtime, else runc, else crun (when that runtime uses the runc shim),
//     so options such as SystemdCgroup carry over; NVIDIA does the same.
//     SetAsDefault sets ...containerd.default_runtime_name. When the file
//     does not define the default runtime's entry (default_runtime_name,
//     runc when unset), it is written too: runc with containerd's built-in
//     options. containerd 1.6 and 1.7 decode the CRI section over their
//     built-in configuration with go-toml v1, whose Tree.Unmarshal makes a
//     new map, so a file that defines any runtime loses the built-in runc
//     and the CRI plugin refuses to load ("no corresponding runtime
//     configured in containerd.runtimes for default_runtime_name");
//     containerd 2.x decodes with go-toml v2, which merges into the
//     built-in map. Debian 12's packaged config.toml defines no runtime.
//     A file without a
//     `version` key is containerd 1.x's version-1 format; it is refused with
//     ErrUnsupportedVersion and instructions to migrate. A missing or
//     comment-only file becomes a new version-2 file, which containerd 1.3+
//     and 2.x both read.
//   - CRI-O: a drop-in (default /etc/crio/crio.conf.d/99-nvidia.toml, the
//     path NVIDIA uses) with [crio.runtime.runtimes.<name>] runtime_path =
//     <gantry-runtime> and runtime_type = "oci", and with SetAsDefault
//     [crio.runtime] default_runtime = <name>. monitor_path and runtime_root
//     are left out: CRI-O then finds conmon on PATH and uses /run/<name>.
//     NVIDIA also copies the default runtime's settings from the running
//     CRI-O's merged config (`crio status config`); we only see the drop-in.
//
// SetAsDefault = false never removes an existing default, even one naming
// our runtime (NVIDIA's tool does remove it); configure only adds.
//
// # Checked by the engine before it is written
//
// Apply and ApplyContainerdDropIn have the engine's own program read the
// result before anything is replaced (Options.EngineBinary, else found
// on PATH): `containerd --config CANDIDATE config dump` (the candidate
// in a temporary directory with its imports spelled out, the planned
// drop-in among them), whose output must define the default runtime and
// every runtime asked for, and must be of the file's config version (a
// containerd 1.x reads version 3 files without error but ignores their
// CRI section); `dockerd --validate --config-file CANDIDATE` where dockerd
// has it (Docker 23+; 20.10, Debian 12's, does not: the runtimes and
// default-runtime are then read as dockerd's loader judges them); and
// `crio [--config MAIN] --config-dir DIR config` with the planned drop-in
// among the directory's files. A refusal is ErrEngineRejects, naming the
// file, the reason and the fix; the file is left as it was. Without the
// program the result is read back by Gantry's reader only, and the change
// list says so. Options.Source = SourceCommand starts from the engine's
// own view instead of the file (`containerd config dump`: the file, its
// imports and the built-in defaults), as NVIDIA's --config-source=command
// does; SourceFile, the default, keeps the admin's file as written.
//
// Every time an existing file is replaced, its old content is kept as
// <path>.gantry-backup (the file as it was before the latest change).
//
// # Preserving the user's file
//
// daemon.json is decoded into an ordered list of members whose values are
// kept verbatim; keys keep their original order, new keys are appended at
// the end, and values are re-indented with the indentation the file already
// used (four spaces for a new file). Only the layout of whitespace changes.
// Duplicate keys at the levels we edit are refused rather than guessed at.
//
// TOML files are edited as text: one value replaced, one line inserted, or a
// new table block inserted after the existing runtimes with their
// indentation. Comments, key order and formatting therefore survive. Each
// result is decoded and compared with the intended document; if an unusual
// layout (dotted keys or inline tables where we need a header) makes a splice
// wrong, the whole document is re-encoded instead, and the change list says
// that comments were lost.
//
// # Drop-ins for containerd
//
// Recent NVIDIA toolkits (1.17 and later) do not edit containerd's
// config.toml in place by default: they write
// /etc/containerd/conf.d/99-nvidia.toml and add
// "/etc/containerd/conf.d/*.toml" to the main file's `imports`.
// ApplyContainerdDropIn does the same (`gantry runtime configure --drop-in`,
// and nvidia-ctk's default). Because containerd before 2.1 merges imported
// files plugin by plugin (an imported CRI plugin section replaces the main
// file's one instead of merging keys), the drop-in carries a copy of the
// main file's whole CRI plugin section, in the main file's config version,
// and is regenerated from it on every run; an import already covering the
// drop-in (a pattern, relative to the main file's directory as containerd
// resolves it) is left alone. `gantry runtime configure` without --drop-in
// edits the main file, which text splicing makes safe for comments; when
// that file has imports, the change list warns that an imported CRI section
// would override it on containerd older than 2.1.
package engineconfig
