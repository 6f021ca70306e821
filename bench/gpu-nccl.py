# torch.distributed with NCCL, one process per GPU (torchrun starts the ranks):
# all-reduce correctness (exact integer sums, two sizes), all-reduce bus
# bandwidth (SIZE_MIB float32, default 256; ITERS timed iterations, default
# 20, after 5 warmup), a DDP training step time, and the ranks' weights
# compared afterwards. Rank 0 prints TORCH-GPUS (count and UUIDs) and one
# RESULT line. Refuses to start unless NVLink multicast is off in its
# environment. Run by bench/gpu-nccl.sh (host and containers) and by
# test/cluster's TestNCCLPodTwoGPUs (in a pod).
import os, sys, time, torch, torch.distributed as dist
for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    if os.environ.get(k) != v:
        sys.exit(f"refusing to run: {k}={v} is not set (NVLink multicast must stay off)")
rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
try:
    dist.init_process_group("nccl", device_id=dev)
except TypeError:  # torch before 2.3
    dist.init_process_group("nccl")
def log(*a):
    if rank == 0:
        print(*a, flush=True)
if rank == 0:
    uu = []
    for i in range(torch.cuda.device_count()):
        u = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        uu.append("GPU-" + str(u) if u is not None else "?")
    log("TORCH-GPUS", torch.cuda.device_count(), " ".join(uu))
# correctness: integers below 2**24 are exact in float32
ok = True
for n in (1000003, int(os.environ.get("SIZE_MIB", "256")) << 18):
    base = (torch.arange(n, device=dev) % 1024).float()
    t = base + rank
    dist.all_reduce(t)
    want = base * world + world * (world - 1) // 2
    ok = ok and bool(torch.equal(t, want))
flag = torch.tensor([1 if ok else 0], device=dev)
dist.all_reduce(flag, op=dist.ReduceOp.MIN)
ok = flag.item() == 1
# bandwidth
nbytes = int(os.environ.get("SIZE_MIB", "256")) << 20
buf = torch.zeros(nbytes // 4, device=dev)
for _ in range(5):
    dist.all_reduce(buf)
torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
iters = int(os.environ.get("ITERS", "20"))
t0 = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(buf)
torch.cuda.synchronize()
dt = (time.perf_counter() - t0) / iters
algbw = nbytes / dt / 1e9
busbw = algbw * 2 * (world - 1) / world
# DDP: an MLP, SGD, 20 timed steps after 5 warmup
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(4096, 4096), torch.nn.ReLU())], torch.nn.Linear(4096, 1000)).to(dev)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
g = torch.Generator(device=dev); g.manual_seed(1000 + rank)
x = torch.randn(256, 4096, device=dev, generator=g)
y = torch.randint(0, 1000, (256,), device=dev, generator=g)
def step():
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
for _ in range(5):
    step()
torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(iters):
    step()
torch.cuda.synchronize()
step_ms = (time.perf_counter() - t0) / iters * 1e3
ms = torch.tensor([step_ms], device=dev)
dist.all_reduce(ms, op=dist.ReduceOp.MAX)
# the ranks' weights must be the same after DDP's steps
s = torch.stack([p.detach().double().sum() for p in model.parameters()])
every = [torch.zeros_like(s) for _ in range(world)]
dist.all_gather(every, s)
same = all(torch.equal(every[0], e) for e in every)
log(f"RESULT world={world} allreduce_ok={int(ok)} size_mib={nbytes >> 20} time_ms={dt * 1e3:.3f} algbw={algbw:.1f} busbw={busbw:.1f} ddp_step_ms={ms.item():.2f} ddp_same={int(same)}")
dist.destroy_process_group()
