// Package createserver is the create server (gantry-runtime --create-server):
// it makes the GPU
// changes of a create for gantry-runtime's C constructor, so that a GPU
// container's create does not start the Go runtime at all: the
// constructor sends the bundle (as an open directory) over a unix socket,
// the server runs the same modify as the in-process path, and the
// constructor executes the low-level runtime when the answer is "done".
// Any other answer, or no server, and the create goes to Go in-process as
// before, which decides, applies or refuses, and reports: the server only
// ever takes work off the in-process path, never changes its outcome.
//
// It serves only callers that could have done the work themselves: root
// in the server's user namespace, in the server's mount namespace (the
// driver files and mount sources it names are the caller's), running this
// very executable (the same build decides the same way). Absolute root
// paths are taken below the caller's root (/proc/PID/root).
//
// The protocol is package createproto's; the work is package shim's
// (ModifyFor, a create) and package hook's (Prestart, a --gpus hook), the
// same calls the in-process paths make.
package createserver
