package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// netMain changes the host's network the way the cluster scripts need it,
// through rtnetlink, for hosts without iproute2 (GPU hosts may lack it):
//
//	gantry-k8s net addr-add IP     add IP/32 to lo (done if already there)
//	gantry-k8s net addr-del IP     remove IP/32 from lo (done if not there)
//	gantry-k8s net link-del NAME   delete the link NAME (done if absent)
func netMain(args []string) int {
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gantry-k8s net addr-add IP | addr-del IP | link-del NAME")
		return 2
	}
	var err error
	switch args[1] {
	case "addr-add", "addr-del":
		ip := net.ParseIP(args[2]).To4()
		if ip == nil {
			fmt.Fprintf(os.Stderr, "net: %q is not an IPv4 address\n", args[2])
			return 2
		}
		err = loAddr(args[1] == "addr-add", ip)
	case "link-del":
		err = linkDel(args[2])
	default:
		fmt.Fprintf(os.Stderr, "net: unknown command %q (addr-add, addr-del, link-del)\n", args[1])
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "net %s %s: %v\n", args[1], args[2], err)
		return 1
	}
	return 0
}

// attr is a netlink attribute: 2-byte length, 2-byte type, value, padding.
func attr(typ uint16, val []byte) []byte {
	b := make([]byte, unix.NLA_HDRLEN, unix.NLA_HDRLEN+len(val)+3)
	binary.NativeEndian.PutUint16(b[0:], uint16(unix.NLA_HDRLEN+len(val)))
	binary.NativeEndian.PutUint16(b[2:], typ)
	b = append(b, val...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// request sends one rtnetlink request and waits for its acknowledgement.
func request(typ uint16, flags uint16, body []byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], 1)
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return err
	}
	if n < unix.NLMSG_HDRLEN+4 || binary.NativeEndian.Uint16(buf[4:]) != unix.NLMSG_ERROR {
		return errors.New("no acknowledgement from the kernel")
	}
	if code := int32(binary.NativeEndian.Uint32(buf[unix.NLMSG_HDRLEN:])); code != 0 {
		return unix.Errno(-code)
	}
	return nil
}

func loAddr(add bool, ip net.IP) error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return err
	}
	// struct ifaddrmsg: family, prefixlen, flags, scope, index.
	body := []byte{unix.AF_INET, 32, 0, unix.RT_SCOPE_UNIVERSE, 0, 0, 0, 0}
	binary.NativeEndian.PutUint32(body[4:], uint32(lo.Index))
	body = append(body, attr(unix.IFA_LOCAL, ip)...)
	body = append(body, attr(unix.IFA_ADDRESS, ip)...)
	if add {
		err = request(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body)
		if errors.Is(err, unix.EEXIST) {
			return nil
		}
		return err
	}
	err = request(unix.RTM_DELADDR, 0, body)
	if errors.Is(err, unix.EADDRNOTAVAIL) {
		return nil
	}
	return err
}

func linkDel(name string) error {
	// struct ifinfomsg (16 bytes, zero: find the link by IFLA_IFNAME).
	body := make([]byte, unix.SizeofIfInfomsg)
	body = append(body, attr(unix.IFLA_IFNAME, append([]byte(name), 0))...)
	err := request(unix.RTM_DELLINK, 0, body)
	if errors.Is(err, unix.ENODEV) {
		return nil
	}
	return err
}
