package health

import "fmt"

// xidText gives a short description of the XIDs seen most often on data
// centre GPUs, from the facts in NVIDIA's public XID catalog. The catalog
// remains the reference for what each one means and what to do.
var xidText = map[uint64]string{
	8:   "GPU stopped responding to the host",
	13:  "graphics engine exception, usually an application error",
	31:  "GPU memory page fault, usually an application error",
	32:  "invalid or corrupted push buffer stream",
	38:  "driver firmware error",
	43:  "GPU stopped processing an application's work",
	45:  "preemptive cleanup after earlier errors",
	48:  "double-bit ECC error",
	56:  "display engine error",
	57:  "error programming video memory interface",
	61:  "internal micro-controller breakpoint or warning",
	62:  "internal micro-controller halted",
	63:  "ECC page retirement or row remapping recorded",
	64:  "ECC page retirement or row remapping failed",
	68:  "video processor exception",
	69:  "graphics engine class error",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	109: "context switch timeout",
	119: "GSP RPC timeout",
	120: "GSP error",
	121: "C2C link error",
	140: "unrecovered ECC error",
	143: "GPU initialisation failed",
}

// DescribeXID names an XID for a reason: "XID 79 (GPU has fallen off the
// bus)", or just "XID 200" for one not in the table.
func DescribeXID(xid uint64) string {
	if t, ok := xidText[xid]; ok {
		return fmt.Sprintf("XID %d (%s)", xid, t)
	}
	return fmt.Sprintf("XID %d", xid)
}
