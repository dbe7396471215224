import os, threading, time, sys
path='target/fsc.dat'
N=400; SZ=29*1024
fd=os.open(path, os.O_RDWR|os.O_CREAT|os.O_TRUNC)
os.pwrite(fd, b'\0'*(64<<20), 0); os.fsync(fd)
buf=os.urandom(SZ)
def run(tid, nthreads, out):
    off = tid*SZ
    lat=[]
    for i in range(N):
        t=time.perf_counter()
        os.pwrite(fd, buf, off); os.fdatasync(fd)
        lat.append((time.perf_counter()-t)*1e6)
        off += nthreads*SZ
        if off > (60<<20): off = tid*SZ
    out.extend(lat)
for nt in (1,2,4,1,2):
    out=[]; ths=[threading.Thread(target=run,args=(i,nt,out)) for i in range(nt)]
    t=time.perf_counter(); [x.start() for x in ths]; [x.join() for x in ths]; el=time.perf_counter()-t
    out.sort(); n=len(out)
    print(f"threads {nt}: syncs/s {n/el:.0f} p50 {out[n//2]:.0f} p90 {out[n*9//10]:.0f} us")
