package unixsock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The unix sock_diag interface (linux/unix_diag.h), which x/sys/unix does
// not carry.
const (
	udiagShowPeer = 0x4 // UDIAG_SHOW_PEER
	unixDiagPeer  = 2   // UNIX_DIAG_PEER
)

// unixDiagReq is struct unix_diag_req.
type unixDiagReq struct {
	Family   uint8
	Protocol uint8
	_        uint16
	States   uint32
	Ino      uint32
	Show     uint32
	Cookie   [2]uint32
}

// unixDiagMsg is struct unix_diag_msg.
type unixDiagMsg struct {
	Family uint8
	Type   uint8
	State  uint8
	_      uint8
	Ino    uint32
	Cookie [2]uint32
}

// ErrNoPeer: the socket has no peer (never connected, or the other end is
// closed).
var ErrNoPeer = errors.New("the socket has no peer")

// PeerInode is the inode of the other end of the connected unix socket fd
// (what /proc/PID/fd of a process that holds that end links to as
// "socket:[INODE]"), asked of the kernel's sock_diag: the caller's word is
// not taken for it.
func PeerInode(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("fstat of the socket: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return 0, errors.New("not a socket")
	}
	nl, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	defer unix.Close(nl)
	// A receive that never ends would hold a create: the kernel answers
	// at once, or never (no unix_diag).
	tv := unix.Timeval{Sec: 2}
	_ = unix.SetsockoptTimeval(nl, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	hdr := unix.NlMsghdr{Type: unix.SOCK_DIAG_BY_FAMILY, Flags: unix.NLM_F_REQUEST, Seq: 1}
	req := unixDiagReq{Family: unix.AF_UNIX, States: ^uint32(0), Ino: uint32(st.Ino), Show: udiagShowPeer, Cookie: [2]uint32{^uint32(0), ^uint32(0)}}
	hdr.Len = uint32(unix.SizeofNlMsghdr + unsafe.Sizeof(req))
	msg := make([]byte, hdr.Len)
	copy(msg, unsafe.Slice((*byte)(unsafe.Pointer(&hdr)), unix.SizeofNlMsghdr))
	copy(msg[unix.SizeofNlMsghdr:], unsafe.Slice((*byte)(unsafe.Pointer(&req)), unsafe.Sizeof(req)))
	if err := unix.Sendto(nl, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag request: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(nl, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("sock_diag answer: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, fmt.Errorf("sock_diag answer: %w", err)
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case unix.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
					return 0, fmt.Errorf("sock_diag: %w", unix.Errno(-e))
				}
			}
			return 0, errors.New("sock_diag: an error without a number")
		case unix.SOCK_DIAG_BY_FAMILY:
			size := int(unsafe.Sizeof(unixDiagMsg{}))
			if len(m.Data) < size {
				return 0, errors.New("sock_diag: a short answer")
			}
			var dm unixDiagMsg
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&dm)), size), m.Data)
			if uint64(dm.Ino) != st.Ino {
				return 0, fmt.Errorf("sock_diag answered for socket %d, asked %d", dm.Ino, st.Ino)
			}
			for b := m.Data[size:]; len(b) >= unix.SizeofRtAttr; {
				l := int(binary.NativeEndian.Uint16(b))
				typ := binary.NativeEndian.Uint16(b[2:])
				if l < unix.SizeofRtAttr || l > len(b) {
					break
				}
				if typ == unixDiagPeer && l >= unix.SizeofRtAttr+4 {
					if peer := binary.NativeEndian.Uint32(b[unix.SizeofRtAttr:]); peer != 0 {
						return uint64(peer), nil
					}
				}
				al := (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
				if al > len(b) {
					break
				}
				b = b[al:]
			}
			return 0, ErrNoPeer
		}
	}
	return 0, errors.New("sock_diag: no answer for the socket")
}

// maxHolderFDs bounds how many descriptors HoldsSocket looks at.
const maxHolderFDs = 1 << 16

// HoldsSocket reports whether the process whose /proc directory is proc
// (/proc/PID) has a descriptor open on the socket of inode ino.
func HoldsSocket(proc string, ino uint64) (bool, error) {
	d, err := os.Open(proc + "/fd")
	if err != nil {
		return false, err
	}
	defer d.Close()
	want := "socket:[" + strconv.FormatUint(ino, 10) + "]"
	seen := 0
	for {
		names, err := d.Readdirnames(256)
		for _, n := range names {
			if l, err := os.Readlink(proc + "/fd/" + n); err == nil && l == want {
				return true, nil
			}
		}
		seen += len(names)
		if err != nil || len(names) == 0 {
			return false, nil
		}
		if seen >= maxHolderFDs {
			return false, fmt.Errorf("%s has more than %d descriptors", proc, maxHolderFDs)
		}
	}
}
