// Package cdiindex finds the CDI devices of other vendors that a container
// create names, without reading every spec file of the CDI directories on
// every create.
//
// The CDI library's cache (cdi.NewCache) reads and parses each *.json and
// *.yaml file of the spec directories whole when it is made: a runtime that
// makes one per create paid 4.8 s for 1001 specs, and 70 s and 3.4 GB for one
// spec of 1 GiB. Here the directories are read into an index (which file
// defines which device, by the library's rules: a later directory overrides
// an earlier one, two files of one directory defining a device is a
// conflict), bounded: at most Options.MaxSpecs files a directory, each of at
// most Options.MaxSpecSize bytes, MaxTotal bytes in all, spent on the
// highest-priority directory first; files beyond are skipped with a warning
// and named in the error when a device is not found, and a device defined at
// the priority of a file skipped for a limit, or lower, is refused naming
// that file (it may define the device too). Each spec file is opened once,
// without waiting for a writer, checked through that descriptor to be a
// regular file within the limit, and read for at most the limit and a byte:
// a file grown or swapped for a FIFO after a check is refused or not seen,
// never read whole or waited on. The bytes read are parsed by the library
// (through a sealed memfd: it parses only from a path).
//
// The index is kept in a root-owned file under the cache directory and used
// while the directories and every *.json and *.yaml entry in them (also a
// dangling link or a directory, so a spec appearing behind one is seen) are
// unchanged (their modification and change times, sizes and inode numbers);
// a create then parses only the spec files that define the devices it
// names. A file's priority is its directory's place in Options.Dirs,
// checked, not taken from the index file.
//
// One difference from the library (v1.1.1), kept on purpose: two files of a
// directory defining a name is a conflict only when no directory of higher
// priority defines it. The library drops a conflicting name whatever the
// other directories say, so a definition in /var/run/cdi cannot repair a
// conflict in /etc/cdi; here the higher directory's definition is served, as
// for any name it overrides (TestConflictOverridden). A conflict in the
// highest directory defining the name is an error naming both files, as the
// library's.
package cdiindex
