package containerhook

import "strings"

// loaderVars are the variables glibc's dynamic loader and libc act on that
// an image could use to run its own code in a dynamically linked hook (the
// loader's list of variables it drops for setuid programs, unsecvars.h,
// less TMPDIR and TZDIR): any LD_* and these.
var loaderVars = map[string]bool{
	"GCONV_PATH": true, "GETCONF_DIR": true, "GLIBC_TUNABLES": true, "HOSTALIASES": true,
	"LOCALDOMAIN": true, "LOCPATH": true, "MALLOC_TRACE": true, "NIS_PATH": true,
	"NLSPATH": true, "RESOLV_HOST_CONF": true, "RES_OPTIONS": true,
}

// LoaderVars returns the names of env's variables (NAME=VALUE) that the
// dynamic loader or libc act on: LD_* and loaderVars. A dynamically linked
// hook that finds any was given an environment it must not have (a CDI
// spec's hook without env, on a runtime that passes the image's): the
// loader has already acted on them by the time the program's code runs.
func LoaderVars(env []string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "LD_") || loaderVars[name] {
			out = append(out, name)
		}
	}
	return out
}

// WithoutLoaderVars returns env less the variables LoaderVars names: what a
// static program that was handed an image's environment may pass on to a
// dynamically linked one.
func WithoutLoaderVars(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if len(LoaderVars([]string{kv})) == 0 {
			out = append(out, kv)
		}
	}
	return out
}
