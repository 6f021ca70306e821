// Package topology chooses which GPUs of a host to give a workload that asks
// for several: the set whose members talk to each other fastest.
//
// The kubelet asks a device plugin for its preferred allocation
// (GetPreferredAllocation) with the free GPUs, the GPUs the allocation must
// keep, and a size. The answer here compares candidate sets by three sums over
// their pairs of GPUs, in this order, each deciding only when the ones before
// it tie:
//
//  1. NVLink links between the two GPUs: direct links, plus for two GPUs on an
//     NVSwitch fabric the smaller of their link counts into the fabric (the
//     bandwidth one GPU can send the other). More links, more bandwidth; any
//     NVLink beats any PCIe path, as in NVIDIA's allocator.
//  2. Pairs without NVLink that sit behind the same PCIe switch, so their peer
//     traffic stays below the switch instead of crossing the CPU. A pair that
//     has NVLink does not count here: its peer traffic does not use PCIe.
//  3. Pairs on the same NUMA node (the same CPU socket), so the workload's
//     host memory and its GPUs are close and nothing crosses the socket link.
//     This one counts every pair, NVLink or not.
//
// When candidates still tie, the one that leaves the remaining free GPUs best
// connected by the same measure wins, so that later requests still find good
// sets (taking the lone GPU rather than breaking up a pair on one switch).
// Then the lowest device indices win, which makes the answer deterministic.
//
// The PCIe switch of a GPU is not in gpu.System; it is guessed from the bus
// id. A switch gives its downstream ports consecutive bus numbers, so GPUs
// behind one switch have neighbouring buses: two GPUs count as behind the
// same switch when they share the PCI domain and the high hex digit of the
// bus number (1A and 1B; not 1B and 3D), and are not on different NUMA
// nodes. The guess can be wrong (a switch whose buses cross a multiple of 16,
// or two switches in one block of 16 buses); it only orders sets that tie on
// NVLink, and never outweighs a link.
//
// A Graph is built once from a gpu.System (the device plugin builds it at
// start; probing links again per request costs NVIDIA's plugin about 0.6 s
// per GPU pair) and answers any number of requests. Up to 2^15 candidate sets
// are searched exhaustively (every request on a host of 16 GPUs or fewer);
// beyond that a greedy search grows a set from each GPU and keeps the best.
package topology
