# A PyTorch process under LD_PRELOAD=libvpmm.so (caching off): allocates a
# known set, frees some, says ready, waits for "go" on stdin, then exits.
import sys, torch
dev = torch.device("cuda")
keep = [torch.empty(n * (1 << 20), dtype=torch.uint8, device=dev) for n in (8, 3, 16, 5, 40)]
tmp = [torch.ones(n * (1 << 20) // 4, device=dev) for n in (12, 7)]
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    t2 = torch.zeros(6 << 20, dtype=torch.uint8, device=dev)
del tmp[0]
del keep[1]
torch.cuda.synchronize()
x = torch.randn(1024, 1024, device=dev) @ torch.randn(1024, 1024, device=dev)
print("ready", flush=True)
sys.stdin.readline()
print("sum", float(x.sum()))
