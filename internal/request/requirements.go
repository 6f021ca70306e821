package request

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrUnsatisfied is wrapped by every error Check returns for a requirement
// the host or a GPU does not meet.
var ErrUnsatisfied = errors.New("requirement not met")

// Key is the left side of a constraint: what is compared.
type Key string

const (
	// KeyCUDA is the CUDA driver API version the host driver supports ("12.4").
	KeyCUDA Key = "cuda"
	// KeyDriver is the host's kernel driver version ("550.54.15").
	KeyDriver Key = "driver"
	// KeyArch is a GPU's compute capability ("9.0").
	KeyArch Key = "arch"
	// KeyBrand is a GPU's NVML brand in lower case ("tesla", "nvidia").
	KeyBrand Key = "brand"
)

// Op is a comparison operator. These six are the whole set: "==" is not one.
type Op string

const (
	OpEqual        Op = "="
	OpNotEqual     Op = "!="
	OpLess         Op = "<"
	OpLessEqual    Op = "<="
	OpGreater      Op = ">"
	OpGreaterEqual Op = ">="
)

// Constraint is one comparison, e.g. driver>=470.
type Constraint struct {
	Key   Key
	Op    Op
	Value string
}

// String returns the constraint as it is written in an expression.
func (c Constraint) String() string { return string(c.Key) + string(c.Op) + c.Value }

// Requirement is one NVIDIA_REQUIRE_* expression, or the legacy rule
// derived from CUDA_VERSION. It holds when any alternative holds; an
// alternative holds when all its constraints hold.
type Requirement struct {
	// Var names where the expression came from: "NVIDIA_REQUIRE_CUDA", or
	// "CUDA_VERSION" for the legacy rule.
	Var string
	// Expr is the expression as written ("cuda>=12.4 brand=tesla,driver>=470").
	Expr string
	// Alternatives are the space-separated terms of Expr, each a list of its
	// comma-separated constraints. When nil, Check parses Expr itself, so a
	// Requirement built from just Var and Expr works too.
	Alternatives [][]Constraint
}

// String returns the requirement as VAR=EXPR.
func (r Requirement) String() string { return r.Var + "=" + r.Expr }

// ParseRequirement parses expr, the value of the variable name. An
// expression of only spaces and commas has no alternatives and always holds.
func ParseRequirement(name, expr string) (Requirement, error) {
	r := Requirement{Var: name, Expr: expr}
	for _, term := range strings.Fields(expr) {
		var alt []Constraint
		for _, f := range strings.Split(term, ",") {
			if f == "" {
				continue
			}
			c, err := parseConstraint(f)
			if err != nil {
				return Requirement{}, fmt.Errorf("%w: %s=%q: %v; fix the expression (key op value, e.g. cuda>=12.4, terms ANDed with ',' and ORed with ' ') or set NVIDIA_DISABLE_REQUIRE=true",
					ErrInvalid, name, expr, err)
			}
			alt = append(alt, c)
		}
		if len(alt) > 0 {
			r.Alternatives = append(r.Alternatives, alt)
		}
	}
	if r.Alternatives == nil {
		r.Alternatives = [][]Constraint{}
	}
	return r, nil
}

const opChars = "<>=!"

func parseConstraint(s string) (Constraint, error) {
	i := strings.IndexAny(s, opChars)
	if i <= 0 {
		return Constraint{}, fmt.Errorf("%q has no key before an operator", s)
	}
	j := i
	for j < len(s) && strings.IndexByte(opChars, s[j]) >= 0 {
		j++
	}
	key, op, value := Key(strings.ToLower(s[:i])), Op(s[i:j]), s[j:]
	switch op {
	case OpEqual, OpNotEqual, OpLess, OpLessEqual, OpGreater, OpGreaterEqual:
	case "==":
		return Constraint{}, fmt.Errorf("%q: operator == is not supported, use =", s)
	default:
		return Constraint{}, fmt.Errorf("%q: unknown operator %q (use =, !=, <, <=, > or >=)", s, op)
	}
	if value == "" {
		return Constraint{}, fmt.Errorf("%q has no value", s)
	}
	switch key {
	case KeyCUDA, KeyDriver, KeyArch:
		if _, err := versionParts(value); err != nil {
			return Constraint{}, fmt.Errorf("%q: %v", s, err)
		}
	case KeyBrand:
		if op != OpEqual && op != OpNotEqual {
			return Constraint{}, fmt.Errorf("%q: brand compares with = or != only", s)
		}
	default:
		return Constraint{}, fmt.Errorf("%q: unknown key %q (use cuda, driver, arch or brand)", s, s[:i])
	}
	return Constraint{Key: key, Op: op, Value: value}, nil
}

// Host is what the host offers to requirement expressions.
type Host struct {
	// CUDA is the CUDA driver API version, major.minor ("12.4"). Empty means
	// unknown: cuda constraints then hold, as NVIDIA's check does.
	CUDA string
	// Driver is the kernel driver version ("550.54.15"). Empty means unknown:
	// driver constraints then hold.
	Driver string
}

// GPU is one selected GPU as requirement expressions see it.
type GPU struct {
	// ID is how errors name the GPU, e.g. "0 (GPU-abc...)".
	ID string
	// Arch is the compute capability ("9.0"); empty makes arch constraints hold.
	Arch string
	// Brand is the NVML brand in lower case ("tesla", "nvidia"); empty makes
	// brand constraints hold.
	Brand string
}

// UnsatisfiedError is the error Check returns for a requirement that is not
// met. It wraps ErrUnsatisfied.
type UnsatisfiedError struct {
	Requirement Requirement
	Host        Host
	// GPU is the GPU it was judged against; nil when no GPU was selected.
	GPU *GPU
}

// Error names the variable, the expression, what the host (and GPU) offer
// and the fixes, on one line.
func (e *UnsatisfiedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q: host CUDA driver supports %s (driver %s)",
		e.Requirement.Var, shortExpr(e.Requirement), orUnknown(e.Host.CUDA), orUnknown(e.Host.Driver))
	if e.GPU != nil {
		fmt.Fprintf(&b, ", GPU %s is brand %s, arch %s", e.GPU.ID, orUnknown(e.GPU.Brand), orUnknown(e.GPU.Arch))
	}
	b.WriteString("; upgrade the driver, use an image built for an older CUDA, or set NVIDIA_DISABLE_REQUIRE=true")
	return b.String()
}

// Unwrap returns ErrUnsatisfied.
func (e *UnsatisfiedError) Unwrap() error { return ErrUnsatisfied }

// shortExpr keeps error lines readable: CUDA images list 30 alternatives.
func shortExpr(r Requirement) string {
	terms := strings.Fields(r.Expr)
	if len(terms) <= 2 && len(r.Expr) <= 120 {
		return r.Expr
	}
	return fmt.Sprintf("%s ... (%d alternatives)", terms[0], len(terms))
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// Check evaluates reqs as NVIDIA's container CLI does: every requirement
// against the host and each GPU in gpus in turn, or once against the host
// alone when gpus is empty (brand and arch constraints then hold). It
// returns the first failure, an *UnsatisfiedError wrapping ErrUnsatisfied,
// or an ErrInvalid error for an expression or host value it cannot compare.
func Check(reqs []Requirement, host Host, gpus []GPU) error {
	parsed := make([]Requirement, len(reqs))
	for i, r := range reqs {
		if r.Alternatives == nil {
			p, err := ParseRequirement(r.Var, r.Expr)
			if err != nil {
				return err
			}
			r = p
		}
		parsed[i] = r
	}
	if len(gpus) == 0 {
		return checkOne(parsed, host, nil)
	}
	for i := range gpus {
		if err := checkOne(parsed, host, &gpus[i]); err != nil {
			return err
		}
	}
	return nil
}

func checkOne(reqs []Requirement, host Host, gpu *GPU) error {
	for _, r := range reqs {
		ok, err := r.holds(host, gpu)
		if err != nil {
			return fmt.Errorf("%s %q: %w", r.Var, shortExpr(r), err)
		}
		if !ok {
			var g *GPU
			if gpu != nil {
				c := *gpu
				g = &c
			}
			return &UnsatisfiedError{Requirement: r, Host: host, GPU: g}
		}
	}
	return nil
}

// holds reports whether any alternative has all its constraints met. An
// expression with no alternatives holds.
func (r Requirement) holds(host Host, gpu *GPU) (bool, error) {
	if len(r.Alternatives) == 0 {
		return true, nil
	}
	for _, alt := range r.Alternatives {
		all := true
		for _, c := range alt {
			ok, err := c.holds(host, gpu)
			if err != nil {
				return false, err
			}
			if !ok {
				all = false
				break
			}
		}
		if all {
			return true, nil
		}
	}
	return false, nil
}

func (c Constraint) holds(host Host, gpu *GPU) (bool, error) {
	var have string
	switch c.Key {
	case KeyCUDA:
		have = host.CUDA
	case KeyDriver:
		have = host.Driver
	case KeyArch:
		if gpu == nil {
			return true, nil
		}
		have = gpu.Arch
	case KeyBrand:
		if gpu == nil || gpu.Brand == "" {
			return true, nil
		}
		eq := strings.EqualFold(gpu.Brand, c.Value)
		if c.Op == OpNotEqual {
			return !eq, nil
		}
		return eq, nil
	default:
		return false, fmt.Errorf("%w: unknown key %q", ErrInvalid, c.Key)
	}
	if have == "" {
		return true, nil
	}
	cmp, err := CompareVersions(have, c.Value)
	if err != nil {
		return false, fmt.Errorf("%w: comparing %s %s with %q: %v", ErrInvalid, c.Key, have, c.Value, err)
	}
	switch c.Op {
	case OpEqual:
		return cmp == 0, nil
	case OpNotEqual:
		return cmp != 0, nil
	case OpLess:
		return cmp < 0, nil
	case OpLessEqual:
		return cmp <= 0, nil
	case OpGreater:
		return cmp > 0, nil
	case OpGreaterEqual:
		return cmp >= 0, nil
	}
	return false, fmt.Errorf("%w: unknown operator %q", ErrInvalid, c.Op)
}

// CompareVersions compares two dotted decimal versions number by number
// (so 535.104.05 equals 535.104.5 and 12.10 is above 12.9), a missing
// number counting as 0 (12.4 equals 12.4.0). It returns -1, 0 or 1.
func CompareVersions(a, b string) (int, error) {
	pa, err := versionParts(a)
	if err != nil {
		return 0, err
	}
	pb, err := versionParts(b)
	if err != nil {
		return 0, err
	}
	for i := 0; i < len(pa) || i < len(pb); i++ {
		x, y := "0", "0"
		if i < len(pa) {
			x = pa[i]
		}
		if i < len(pb) {
			y = pb[i]
		}
		if c := compareDigits(x, y); c != 0 {
			return c, nil
		}
	}
	return 0, nil
}

// versionParts splits a version into its numbers without leading zeros.
// Runs of dots count as one and a trailing dot is ignored, as in NVIDIA's
// parser; anything but digits and dots, or a leading dot, is an error.
func versionParts(v string) ([]string, error) {
	if v == "" || v[0] < '0' || v[0] > '9' {
		return nil, fmt.Errorf("version %q must start with a digit", v)
	}
	for i := 0; i < len(v); i++ {
		if (v[i] < '0' || v[i] > '9') && v[i] != '.' {
			return nil, fmt.Errorf("version %q: only digits and dots are allowed", v)
		}
	}
	var parts []string
	for _, p := range strings.Split(v, ".") {
		if p == "" {
			continue
		}
		p = strings.TrimLeft(p, "0")
		if p == "" {
			p = "0"
		}
		parts = append(parts, p)
	}
	return parts, nil
}

// compareDigits compares two decimal numbers without leading zeros, of any
// length.
func compareDigits(x, y string) int {
	if len(x) != len(y) {
		if len(x) < len(y) {
			return -1
		}
		return 1
	}
	return strings.Compare(x, y)
}

// legacyRequirement is the rule NVIDIA adds for legacy images:
// cuda>=MAJOR.MINOR of CUDA_VERSION.
func legacyRequirement(cudaVersion string) (Requirement, error) {
	mm, err := majorMinor(cudaVersion)
	if err != nil {
		return Requirement{}, fmt.Errorf("%w: CUDA_VERSION=%q: %v; set it to the image's CUDA version (e.g. 9.0.176) or set NVIDIA_REQUIRE_CUDA", ErrInvalid, cudaVersion, err)
	}
	return ParseRequirement("CUDA_VERSION", "cuda>="+mm)
}

// majorMinor reads a CUDA_VERSION the way NVIDIA does (a lenient semantic
// version: optional "v", one to three numbers, optional -pre and +build
// suffixes) and returns "MAJOR.MINOR".
func majorMinor(v string) (string, error) {
	s := strings.TrimPrefix(v, "v")
	if i := strings.IndexAny(s, "-+"); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if s == "" || len(parts) > 3 {
		return "", errors.New("want MAJOR[.MINOR[.PATCH]]")
	}
	nums := make([]uint64, 2)
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil || p == "" || p[0] == '+' {
			return "", errors.New("want MAJOR[.MINOR[.PATCH]] in decimal")
		}
		if i < 2 {
			nums[i] = n
		}
	}
	return strconv.FormatUint(nums[0], 10) + "." + strconv.FormatUint(nums[1], 10), nil
}
