import torch, time
torch.set_num_threads(2)
def stats(x):
    x = x.reshape(-1)
    xf = x.to(torch.float64)
    return torch.stack([x.amax().double(), x.amin().double(), xf.sum(), (xf*xf).sum()])
t=time.perf_counter()
f = torch.compile(stats, dynamic=True)
f(torch.randn(1000)); 
print("compile", time.perf_counter()-t)
for n in (65536, 262144, 1_000_000, 4_000_000):
    x = torch.randn(n)
    f(x)
    reps = max(3, int(2e7/n))
    for name, g in (("fused", lambda: f(x)), ("eager4", lambda: (x.amax(), x.amin(), x.sum(), torch.dot(x,x))), ("aminmax3", lambda: (torch.aminmax(x), x.sum(), torch.dot(x,x)))):
        g()
        t=time.perf_counter()
        for _ in range(reps): g()
        print(n, name, f"{(time.perf_counter()-t)/reps*1e6:.0f} us")
