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
// most Options.MaxSpecSize bytes, MaxTotal bytes in all; files beyond are
// skipped with a warning and named in the error when a device is not found.
// The index is kept in a root-owned file under the cache directory and used
// while the directories and the files it lists are unchanged (their
// modification and change times, sizes and inode numbers); a create then
// parses only the spec files that define the devices it names.
package cdiindex
