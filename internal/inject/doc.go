// Package inject is the injection pipeline every in-process front end
// shares: gantry-runtime (package shim), the OCI prestart hook Docker's
// --gpus runs (package hook) and `nvidia-container-cli configure` (package
// nvcli). Each front end keeps only what truly differs: where the request
// and the container come from (config.json, the hook's state on stdin,
// flags) and how the edits reach the container (config.json, or the mount
// namespace of a created container). The steps in between are here, once:
//
//   - ReadRequest: the request in an OCI spec, by the configuration's rules
//     (Already: a spec gantry-runtime injected before is left alone);
//   - Prepare: CDI names split by kind (the runtime's), the GPUs and the
//     driver inventory, from the inventory cache in runtime.cache-dir while
//     the driver is unchanged (host.go), the "driver incomplete" refusal,
//     the devices resolved once, then the edits (package edits, which
//     checks NVIDIA_REQUIRE_* first): a Plan;
//   - Plan.ApplyToSpec: the edits, the injected annotation and the other
//     vendors' CDI devices in an OCI spec (the runtime);
//   - Plan.FinishRootfs: the changes only the root filesystem can hold,
//     SONAME links and ld.so.cache entries (with CUDA forward
//     compatibility), through root-confined paths (package rootfs), when
//     NeedsRootfs says there are any;
//   - Record: one log line per container, the same keys for every front
//     end, in runtime.log-file.
//
// Adding a kind of edit means: edits (the model, its CDI and OCI forms),
// then here NeedsRootfs and ApplyEdits if it lands in the root filesystem;
// the front ends need not change. The CDI hook commands that do the same
// rootfs changes for CDI specs live in package containerhook, which this
// package calls for the work itself.
package inject
