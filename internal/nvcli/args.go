package nvcli

import (
	"fmt"
	"strings"
)

// argKind says whether an option takes a value.
type argKind int

const (
	noArg       argKind = iota
	requiredArg         // --opt=V, --opt V, -oV, -o V
	optionalArg         // --opt or --opt=V, -o or -oV (never the next word)
)

// option is one option a command (or the global level) accepts.
type option struct {
	long    string
	short   byte // 0: none
	arg     argKind
	metavar string
	help    string
}

// setting is one option as given: the long name and its value ("" for
// options without one; set tells --user from --user=).
type setting struct {
	name  string
	value string
	set   bool
}

// usageError is a mistake in the command line; Main prints it on one line
// with a pointer to --help.
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// helpRequested and versionRequested are returned by parse for --help/-?
// and --version/-V, which GNU argp (the parser NVIDIA's CLI is built on)
// accepts at every level.
type helpRequested struct{}

func (helpRequested) Error() string { return "help requested" }

type versionRequested struct{}

func (versionRequested) Error() string { return "version requested" }

// parse reads args against opts the way GNU argp does: long options as
// --name=VALUE or --name VALUE, short options clustered (-cu) with values
// attached or in the next word, "--" ending the options. With inOrder, parsing
// stops at the first word that is not an option (the global level, where that
// word is the command); otherwise options and operands may be interleaved.
// It returns the settings in the order given and the operands.
func parse(args []string, opts []option, inOrder bool) (sets []setting, operands []string, err error) {
	byLong := map[string]*option{}
	byShort := map[byte]*option{}
	for i := range opts {
		byLong[opts[i].long] = &opts[i]
		if opts[i].short != 0 {
			byShort[opts[i].short] = &opts[i]
		}
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return sets, append(operands, args[i+1:]...), nil
		case strings.HasPrefix(a, "--"):
			name, value, hasValue := strings.Cut(a[2:], "=")
			switch name {
			case "help", "usage":
				return nil, nil, helpRequested{}
			case "version":
				return nil, nil, versionRequested{}
			}
			o := byLong[name]
			if o == nil {
				return nil, nil, usagef("unknown option --%s", name)
			}
			switch o.arg {
			case noArg:
				if hasValue {
					return nil, nil, usagef("option --%s takes no value (got --%s)", name, a[2:])
				}
				sets = append(sets, setting{name: name})
			case requiredArg:
				if !hasValue {
					if i+1 >= len(args) {
						return nil, nil, usagef("option --%s needs a value: --%s=%s", name, name, o.metavar)
					}
					i++
					value = args[i]
				}
				sets = append(sets, setting{name: name, value: value, set: true})
			case optionalArg:
				sets = append(sets, setting{name: name, value: value, set: hasValue})
			}
		case len(a) > 1 && a[0] == '-':
			for j := 1; j < len(a); j++ {
				c := a[j]
				switch c {
				case '?':
					return nil, nil, helpRequested{}
				case 'V':
					if byShort['V'] == nil {
						return nil, nil, versionRequested{}
					}
				}
				o := byShort[c]
				if o == nil {
					return nil, nil, usagef("unknown option -%c", c)
				}
				rest := a[j+1:]
				if o.arg == noArg {
					sets = append(sets, setting{name: o.long})
					continue
				}
				if o.arg == requiredArg && rest == "" {
					if i+1 >= len(args) {
						return nil, nil, usagef("option -%c (--%s) needs a value", c, o.long)
					}
					i++
					rest = args[i]
					sets = append(sets, setting{name: o.long, value: rest, set: true})
					break
				}
				sets = append(sets, setting{name: o.long, value: rest, set: rest != ""})
				break
			}
		default:
			if inOrder {
				return sets, append(operands, args[i:]...), nil
			}
			operands = append(operands, a)
		}
	}
	return sets, operands, nil
}

// writeOptions prints opts as a help table.
func writeOptions(b *strings.Builder, opts []option) {
	for _, o := range opts {
		var left string
		if o.short != 0 {
			left = fmt.Sprintf("-%c, --%s", o.short, o.long)
		} else {
			left = "    --" + o.long
		}
		switch o.arg {
		case requiredArg:
			left += "=" + o.metavar
		case optionalArg:
			left += "[=" + o.metavar + "]"
		}
		fmt.Fprintf(b, "  %-30s %s\n", left, o.help)
	}
}
