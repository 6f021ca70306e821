package nsmount

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/edits"
)

// insn is one eBPF instruction as the kernel lays it out (struct bpf_insn).
type insn struct {
	Code uint8
	Regs uint8 // dst in the low nibble, src in the high one
	Off  int16
	Imm  int32
}

// Instruction fields (linux/bpf_common.h, linux/bpf.h).
const (
	classLD    = 0x00
	classLDX   = 0x01
	classJMP   = 0x05
	classALU   = 0x04
	classMask  = 0x07
	sizeW      = 0x00
	sizeDW     = 0x18
	modeIMM    = 0x00
	modeMEM    = 0x60
	srcK       = 0x00
	srcX       = 0x08
	opAND      = 0x50
	opRSH      = 0x70
	opMOV      = 0xb0
	opJNE      = 0x50
	opCALL     = 0x80
	opEXIT     = 0x90
	opMask     = 0xf0
	classALU64 = 0x07
)

// The cgroup device context (struct bpf_cgroup_dev_ctx): access_type holds
// the device type in its low 16 bits and the access in the high 16.
const (
	ctxAccessType = 0
	ctxMajor      = 4
	ctxMinor      = 8

	devBlock = 1 // BPF_DEVCG_DEV_BLOCK
	devChar  = 2 // BPF_DEVCG_DEV_CHAR

	accMknod = 1 // BPF_DEVCG_ACC_MKNOD
	accRead  = 2 // BPF_DEVCG_ACC_READ
	accWrite = 4 // BPF_DEVCG_ACC_WRITE
)

func regs(dst, src uint8) uint8 { return dst | src<<4 }

func ldxw(dst, src uint8, off int16) insn {
	return insn{Code: classLDX | modeMEM | sizeW, Regs: regs(dst, src), Off: off}
}
func alu32K(op uint8, dst uint8, imm int32) insn {
	return insn{Code: classALU | op | srcK, Regs: regs(dst, 0), Imm: imm}
}
func mov32X(dst, src uint8) insn { return insn{Code: classALU | opMOV | srcX, Regs: regs(dst, src)} }
func mov64K(dst uint8, imm int32) insn {
	return insn{Code: classALU64 | opMOV | srcK, Regs: regs(dst, 0), Imm: imm}
}
func jneK(dst uint8, imm int32, off int16) insn {
	return insn{Code: classJMP | opJNE | srcK, Regs: regs(dst, 0), Off: off, Imm: imm}
}
func exit() insn { return insn{Code: classJMP | opEXIT} }

// allowPrefix is the code put in front of an existing device program: it
// returns 1 (allow) for an access to one of nodes within the access granted
// for it, and otherwise falls through to the instruction after it with the
// context (r1) untouched. It uses r0 and r2-r5 only, which the program that
// follows cannot expect to hold anything at its entry.
func allowPrefix(nodes []edits.DeviceNode) []insn {
	p := []insn{
		ldxw(2, 1, ctxAccessType), // r2 = access_type
		mov32X(3, 2),              // r3 = r2
		alu32K(opAND, 3, 0xffff),  // r3 = device type
		alu32K(opRSH, 2, 16),      // r2 = access (mknod, read, write bits)
		ldxw(4, 1, ctxMajor),      // r4 = major
		ldxw(5, 1, ctxMinor),      // r5 = minor
	}
	for _, n := range nodes {
		typ := int32(devChar)
		if n.Type == "b" {
			typ = devBlock
		}
		var acc int32
		for _, c := range n.Permissions {
			switch c {
			case 'r':
				acc |= accRead
			case 'w':
				acc |= accWrite
			case 'm':
				acc |= accMknod
			}
		}
		// Eight instructions; each jump skips to the end of the block.
		p = append(p,
			jneK(3, typ, 7),
			jneK(4, int32(n.Major), 6),
			jneK(5, int32(n.Minor), 5),
			mov32X(0, 2),
			alu32K(opAND, 0, ^acc), // r0 = access not granted
			jneK(0, 0, 2),
			mov64K(0, 1),
			exit(),
		)
	}
	return p
}

// checkReusable refuses programs whose translated instructions cannot be
// loaded again as they are: helper or subprogram calls (the kernel rewrites
// their immediates) and 64-bit immediate loads of maps or other objects.
func checkReusable(prog []insn) error {
	for i, in := range prog {
		if in.Code&classMask == classJMP && in.Code&opMask == opCALL {
			return fmt.Errorf("instruction %d is a call", i)
		}
		if in.Code == classLD|sizeDW|modeIMM && in.Regs>>4 != 0 {
			return fmt.Errorf("instruction %d loads a map or kernel object", i)
		}
	}
	if len(prog) == 0 {
		return errors.New("it has no instructions")
	}
	return nil
}

func bpf(cmd uintptr, attr unsafe.Pointer, size uintptr) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_BPF, cmd, uintptr(attr), size)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

type queryAttr struct {
	TargetFD    uint32
	AttachType  uint32
	QueryFlags  uint32
	AttachFlags uint32
	ProgIDs     uint64
	ProgCnt     uint32
	_           uint32
}

// attachedPrograms lists the ids of the device programs attached to the
// cgroup cgfd itself (not inherited from its parents).
func attachedPrograms(cgfd int) ([]uint32, error) {
	ids := make([]uint32, 64)
	a := queryAttr{
		TargetFD:   uint32(cgfd),
		AttachType: unix.BPF_CGROUP_DEVICE,
		ProgIDs:    uint64(uintptr(unsafe.Pointer(&ids[0]))),
		ProgCnt:    uint32(len(ids)),
	}
	_, err := bpf(unix.BPF_PROG_QUERY, unsafe.Pointer(&a), unsafe.Sizeof(a))
	runtime.KeepAlive(ids)
	if err != nil {
		return nil, fmt.Errorf("BPF_PROG_QUERY: %w", err)
	}
	return ids[:a.ProgCnt], nil
}

func progFD(id uint32) (int, error) {
	a := struct{ ID, NextID, OpenFlags uint32 }{ID: id}
	fd, err := bpf(unix.BPF_PROG_GET_FD_BY_ID, unsafe.Pointer(&a), unsafe.Sizeof(a))
	if err != nil {
		return -1, fmt.Errorf("BPF_PROG_GET_FD_BY_ID %d: %w", id, err)
	}
	return fd, nil
}

// progInfo is the head of struct bpf_prog_info, as far as we read it.
type progInfo struct {
	Type            uint32
	ID              uint32
	Tag             [8]byte
	JitedProgLen    uint32
	XlatedProgLen   uint32
	JitedProgInsns  uint64
	XlatedProgInsns uint64
	LoadTime        uint64
	CreatedByUID    uint32
	NrMapIDs        uint32
	MapIDs          uint64
	Name            [16]byte
}

type infoAttr struct {
	FD      uint32
	InfoLen uint32
	Info    uint64
}

func objInfo(fd int, info *progInfo) error {
	a := infoAttr{FD: uint32(fd), InfoLen: uint32(unsafe.Sizeof(*info)), Info: uint64(uintptr(unsafe.Pointer(info)))}
	_, err := bpf(unix.BPF_OBJ_GET_INFO_BY_FD, unsafe.Pointer(&a), unsafe.Sizeof(a))
	runtime.KeepAlive(info)
	return err
}

// programInsns reads the translated instructions of the program fd.
func programInsns(fd int) ([]insn, error) {
	var info progInfo
	if err := objInfo(fd, &info); err != nil {
		return nil, fmt.Errorf("BPF_OBJ_GET_INFO_BY_FD: %w", err)
	}
	if info.Type != unix.BPF_PROG_TYPE_CGROUP_DEVICE {
		return nil, fmt.Errorf("program %d has type %d, not a cgroup device program", info.ID, info.Type)
	}
	if info.NrMapIDs != 0 {
		return nil, fmt.Errorf("program %d uses maps", info.ID)
	}
	if info.XlatedProgLen == 0 || info.XlatedProgLen%8 != 0 {
		return nil, fmt.Errorf("the kernel does not show program %d's instructions (kernel.kptr_restrict=2?)", info.ID)
	}
	prog := make([]insn, info.XlatedProgLen/8)
	info2 := progInfo{XlatedProgLen: info.XlatedProgLen, XlatedProgInsns: uint64(uintptr(unsafe.Pointer(&prog[0])))}
	err := objInfo(fd, &info2)
	runtime.KeepAlive(prog)
	if err != nil {
		return nil, fmt.Errorf("BPF_OBJ_GET_INFO_BY_FD: %w", err)
	}
	if info2.XlatedProgInsns == 0 {
		return nil, fmt.Errorf("the kernel does not show program %d's instructions (kernel.kptr_restrict=2?)", info.ID)
	}
	return prog, nil
}

type loadAttr struct {
	ProgType           uint32
	InsnCnt            uint32
	Insns              uint64
	License            uint64
	LogLevel           uint32
	LogSize            uint32
	LogBuf             uint64
	KernVersion        uint32
	ProgFlags          uint32
	ProgName           [16]byte
	ProgIfindex        uint32
	ExpectedAttachType uint32
}

// loadProgram loads a cgroup device program; a verifier refusal comes back
// with the verifier's log.
func loadProgram(prog []insn) (int, error) {
	license := []byte("Apache-2.0\x00")
	a := loadAttr{
		ProgType:           unix.BPF_PROG_TYPE_CGROUP_DEVICE,
		InsnCnt:            uint32(len(prog)),
		Insns:              uint64(uintptr(unsafe.Pointer(&prog[0]))),
		License:            uint64(uintptr(unsafe.Pointer(&license[0]))),
		ExpectedAttachType: unix.BPF_CGROUP_DEVICE,
	}
	copy(a.ProgName[:], "gantry_devices")
	fd, err := bpf(unix.BPF_PROG_LOAD, unsafe.Pointer(&a), unsafe.Sizeof(a))
	if err == nil {
		runtime.KeepAlive(prog)
		runtime.KeepAlive(license)
		return fd, nil
	}
	log := make([]byte, 64<<10)
	a.LogLevel, a.LogSize, a.LogBuf = 1, uint32(len(log)), uint64(uintptr(unsafe.Pointer(&log[0])))
	_, err2 := bpf(unix.BPF_PROG_LOAD, unsafe.Pointer(&a), unsafe.Sizeof(a))
	runtime.KeepAlive(prog)
	runtime.KeepAlive(license)
	runtime.KeepAlive(log)
	if err2 == nil {
		return -1, fmt.Errorf("BPF_PROG_LOAD: %w", err) // passed the second time: report the first
	}
	if i := indexByte(log, 0); i >= 0 {
		log = log[:i]
	}
	return -1, fmt.Errorf("BPF_PROG_LOAD: %w: %s", err2, lastLines(string(log), 3))
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// lastLines keeps the last n non-empty lines of s, joined by " | ".
func lastLines(s string, n int) string {
	var lines []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '\n' {
			if i > start {
				lines = append(lines, s[start:i])
			}
			start = i + 1
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := ""
	for i, l := range lines {
		if i > 0 {
			out += " | "
		}
		out += l
	}
	return out
}

type attachAttr struct {
	TargetFD     uint32
	AttachBpfFD  uint32
	AttachType   uint32
	AttachFlags  uint32
	ReplaceBpfFD uint32
}

// replaceProgram attaches prog to the cgroup in place of old.
func replaceProgram(cgfd, old, prog int) error {
	a := attachAttr{
		TargetFD:     uint32(cgfd),
		AttachBpfFD:  uint32(prog),
		AttachType:   unix.BPF_CGROUP_DEVICE,
		AttachFlags:  unix.BPF_F_ALLOW_MULTI | unix.BPF_F_REPLACE,
		ReplaceBpfFD: uint32(old),
	}
	_, err := bpf(unix.BPF_PROG_ATTACH, unsafe.Pointer(&a), unsafe.Sizeof(a))
	if err != unix.EINVAL {
		if err != nil {
			return fmt.Errorf("BPF_PROG_ATTACH (replace): %w", err)
		}
		return nil
	}
	// Before Linux 5.6 there is no BPF_F_REPLACE: attach, then detach the
	// old program. Both allow what the old one allowed, so no access is
	// lost in between.
	a.AttachFlags, a.ReplaceBpfFD = unix.BPF_F_ALLOW_MULTI, 0
	if _, err := bpf(unix.BPF_PROG_ATTACH, unsafe.Pointer(&a), unsafe.Sizeof(a)); err != nil {
		return fmt.Errorf("BPF_PROG_ATTACH: %w", err)
	}
	d := attachAttr{TargetFD: uint32(cgfd), AttachBpfFD: uint32(old), AttachType: unix.BPF_CGROUP_DEVICE}
	if _, err := bpf(unix.BPF_PROG_DETACH, unsafe.Pointer(&d), unsafe.Sizeof(d)); err != nil {
		return fmt.Errorf("BPF_PROG_DETACH of the old program: %w", err)
	}
	return nil
}

// allowBPF extends every device program attached to the cgroup cgfd so that
// it also allows nodes. With none attached, nothing restricts device access
// in this cgroup (programs of parent cgroups are not ours to change).
func allowBPF(cgfd int, nodes []edits.DeviceNode) error {
	ids, err := attachedPrograms(cgfd)
	if err != nil {
		return err
	}
	prefix := allowPrefix(nodes)
	for _, id := range ids {
		if err := extendProgram(cgfd, id, prefix); err != nil {
			return err
		}
	}
	return nil
}

func extendProgram(cgfd int, id uint32, prefix []insn) error {
	old, err := progFD(id)
	if err != nil {
		return err
	}
	defer unix.Close(old)
	body, err := programInsns(old)
	if err != nil {
		return err
	}
	if err := checkReusable(body); err != nil {
		return fmt.Errorf("cannot extend device program %d: %v (use --no-cgroups and grant access another way)", id, err)
	}
	prog := make([]insn, 0, len(prefix)+len(body))
	prog = append(append(prog, prefix...), body...)
	fd, err := loadProgram(prog)
	if err != nil {
		return fmt.Errorf("loading the extended device program: %w", err)
	}
	defer unix.Close(fd)
	return replaceProgram(cgfd, old, fd)
}
