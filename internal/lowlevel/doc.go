// Package lowlevel knows the low-level OCI runtimes Gantry hands containers
// to (runc, crun): which version a binary is (its --version), and which
// published advisories about that version matter to a GPU node. The
// runtime's bugs are not Gantry's to fix, but Gantry can say so: gantry
// doctor reports an affected runtime, gantry-runtime notes it once per
// binary (CheckOnce: the version is cached by the binary's identity), and
// the create server warns at start. The races behind these advisories were
// seen with Gantry's own device lists: an image whose /dev is swapped for a
// link during create had runc 1.1.5 make one and crun 1.8.1 all twelve GPU
// device nodes (mode 0666) in the host directory the link names.
package lowlevel
