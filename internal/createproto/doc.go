// Package createproto is the wire protocol of the create server
// (gantry-runtime --create-server, package createserver): what a caller
// sends on the server's unix socket, what the server answers, the timeouts
// the caller waits, and the caller identity the server compares with its
// own. It is a leaf: it imports nothing of Gantry's, so the C fast path's
// pins (package fastpath's TestConstants), the server, gantry doctor and
// the CLI's help all read it without importing one another.
//
// Three messages, each the protocol's name and its fields, every one ended
// by a NUL:
//
//	create  gantry-create/1 exe config explicit bundle container start
//	        with the bundle directory open (SCM_RIGHTS) beside it
//	ping    gantry-create/1 exe "" 0 "" "" 0, without a directory
//	hook    gantry-hook/1   exe config explicit start state
//
// exe is ExeIdentity of the caller's executable; config the absolute path
// of the configuration file the caller would read ("" for none) and
// explicit whether it was named ($GANTRY_CONFIG); start the caller's
// CLOCK_MONOTONIC at its start, in ns; state a hook's OCI state, as read
// from its stdin (at most MaxHookState bytes).
//
// The server writes ServerAccepted as soon as it takes a connection, then
// one answer byte: AnswerDone, or AnswerSelf (do it in-process). A served
// ping's answer carries the server's identity after that byte.
//
// The C constructor of gantry-runtime (package fastpath, fastpath.c) is
// the only other writer of these messages; its copies of the constants are
// pinned by fastpath's TestConstants, and TestRoundTrip here holds Encode
// and Decode to each other and to the bytes fastpath.c writes.
package createproto
